"""Which driver a node gets: the version catalog, version rules, GPUs to branch and flavour, and
NVIDIA's .run by URL for downloads and mirrors."""

# The modules other rooms import, each whole where it is needed (this door loads none: a
# warm run never loads the download machinery behind `download`).
__all__ = [
    "catalog",
    "download",
    "floors",
    "gpus",
    "versions",
]

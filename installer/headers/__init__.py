"""The target kernel's exact headers: found on the host, in the image or the cache, or fetched
through the host's own package sources (the family's tool in installer.distros) into the cache,
and the steps that get them and the compiler before any large download."""

# The modules other rooms import, each whole where it is needed (this door loads none).
__all__ = [
    "compiler",
    "fetch",
    "platform",
    "steps",
    "trees",
]

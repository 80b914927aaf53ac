"""Which driver a node gets: the version catalog, version rules, GPUs to branch and flavour, and
NVIDIA's .run by URL for downloads and mirrors."""

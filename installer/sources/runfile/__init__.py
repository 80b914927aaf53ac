"""The runfile source: NVIDIA's .run fetched, verified, extracted and built on the node."""

# `installer prebuild` places the user space with its steps; `sources.SOURCES` holds the source.
__all__ = [
    "steps",
]

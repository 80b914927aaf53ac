"""Prebuilt kernel modules and user space from an OCI registry: found, trusted, used, published."""

# The modules the runfile source, the next kernel and `installer prebuild` use.
__all__ = [
    "key",
    "modules",
    "userspace",
]

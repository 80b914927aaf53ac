"""Prebuilt kernel modules and user space from an OCI registry: found, trusted, used, published."""

"""Kernel headers from the host's own package sources, unpacked into the install dir's cache."""

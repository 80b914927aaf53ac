"""Installs a verified NVIDIA driver onto a Linux GPU node."""

__version__ = "0.1.0"

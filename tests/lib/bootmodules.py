"""The kernel modules a vm guest's stage 1 loads from its initramfs (tests/vm/initramfs.py builds
it) and so the ones a guest kernel's module tree must keep (tests/lib/secondkernel.py trims the
second kernel's image to them)."""

from __future__ import annotations

# What stage 1 needs: virtio PCI transport, 9p for the host's root, overlayfs, the state disk.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_blk", "ext4")

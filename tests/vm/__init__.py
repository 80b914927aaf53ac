"""The vm test tier: a real Linux kernel booted under qemu, with simulated GPUs."""

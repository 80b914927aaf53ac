"""The kit's stand-in for NVIDIA's nvidia-installer, shipped inside the fake .run payload."""

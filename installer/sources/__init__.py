"""The ways a driver reaches the host."""

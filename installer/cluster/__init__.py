"""The node's Kubernetes side of an upgrade: cordon, labels, evictions, events (opt-in)."""

"""The node's Kubernetes side: the upgrade protocol (cordon, labels, evictions, events) and the
scheduling gate (a startup taint, a version label); opt-in."""

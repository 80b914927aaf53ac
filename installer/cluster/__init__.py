"""The node's Kubernetes side: the upgrade protocol (cordon, labels, evictions, events) and the
scheduling gate (a startup taint, a version label); opt-in."""

# The modules other rooms import, each whole and only where it is needed (this door loads
# none of them: with the protocol and the gate off a run loads only the upgrade gate and the
# gate steps).
__all__ = [
    "access",
    "pools",
    "scheduling_gate",
    "scheduling_gate_steps",
    "signals",
    "upgrade_gate",
]

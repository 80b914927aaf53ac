"""Runs a DaemonSet's pod spec with runc, the way the kubelet and a CRI runtime would."""

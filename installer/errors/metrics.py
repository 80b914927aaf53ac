"""`installer metrics`: its listen address, the Prometheus client, the port."""

from __future__ import annotations

from installer.errors.base import InstallerError


class MetricsListenInvalid(InstallerError):
    reference = "metrics-listen-invalid"
    exit_code = 106
    default_hint = ("Give --listen as [host]:port, e.g. :9402 (every address), "
                    "127.0.0.1:9402 or [::1]:9402.")


class MetricsClientMissing(InstallerError):
    reference = "metrics-client-missing"
    exit_code = 107
    default_hint = ("The image lacks the prometheus_client package: use the installer's own "
                    "image, or `pip install prometheus-client` beside the installer.")


class MetricsPortUnavailable(InstallerError):
    reference = "metrics-port-unavailable"
    exit_code = 108
    default_hint = ("Another process holds the port (the pod runs in the host's network "
                    "namespace): free it or choose another with --listen, and change the "
                    "PodMonitor's port with it.")

"""Prometheus metrics of the node's driver: `installer metrics`, a long-running container."""

from __future__ import annotations

import logging
import threading
from typing import Any

from installer.config import Config

log = logging.getLogger(__name__)

NVML_INTERVAL = 60.0


def serve(config: Config, listen: str, nvml_interval: float = NVML_INTERVAL,
          runner: Any = None, stop: threading.Event | None = None, *, access: str = "open",
          max_connections: int = 64, read_timeout: float = 10.0) -> None:
    """Serve /metrics on `listen` until SIGTERM or SIGINT (or `stop`). Reads the node's files
    on each scrape and asks NVML at most every `nvml_interval` seconds. With `access`
    "tokenreview", a scraper's bearer token is checked with the API server (TokenReview, then
    SubjectAccessReview for GET /metrics). Changes nothing on the host. Raises
    metrics-listen-invalid, metrics-client-missing, metrics-port-unavailable, and the cluster
    credentials' errors when the check is on and the pod has none."""
    from installer.hostroot import HostRoot
    from installer.layout import Layout
    from installer.metrics import exporter, snapshot
    from installer.runner import SubprocessRunner

    root = HostRoot(config.root)
    layout = Layout.from_config(config, root)
    gpus = snapshot.CachedGpus(snapshot.nvml_reader(layout, runner or SubprocessRunner()),
                               nvml_interval)
    check = None
    if access == "tokenreview":
        from installer.cluster import access as cluster_access

        check = cluster_access.scrape_access(config)
    if stop is None:
        stop = _stop_on_signals()
    exporter.serve_until(lambda: snapshot.take(config, root, layout, gpus), listen, stop,
                         check, exporter.Limits(read_timeout, max_connections))


def _stop_on_signals() -> threading.Event:
    import signal  # only the container command waits for signals

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("metrics: signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


__all__ = [
    "NVML_INTERVAL",
    "serve",
    "snapshot",
]

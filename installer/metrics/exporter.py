"""`installer metrics`: the node's driver as Prometheus metrics over HTTP (the official client,
imported here only), each scrape read fresh from the snapshot."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from installer.errors import MetricsClientMissing, MetricsListenInvalid, MetricsPortUnavailable
from installer.metrics import server
from installer.metrics.snapshot import Snapshot

log = logging.getLogger(__name__)

PREFIX = "nvidia_driver_installer"
DEFAULT_LISTEN = ":9402"
MODULE_SOURCES = ("compiled", "pulled", "cached")


class Access(Protocol):
    """Who may read the metrics (cluster.access.ScrapeAccess): (HTTP status, reason) for a
    request's Authorization header, 200 when admitted."""

    def check(self, authorization: str | None) -> tuple[int, str]: ...


def parse_listen(value: str) -> tuple[str, int]:
    """`[host]:port` (`:9402` is every address, `[::1]:9402` an IPv6 one) to (address, port).
    Raises MetricsListenInvalid."""
    match = re.fullmatch(r"(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):([0-9]{1,5})", value.strip())
    port = int(match.group(3)) if match else 0
    if match is None or not 0 < port < 65536:
        raise MetricsListenInvalid(f"--listen {value!r} is not [host]:port with a port from 1 "
                                   "to 65535")
    return (match.group(1) or match.group(2) or "0.0.0.0"), port


def families(snap: Snapshot) -> list[Any]:
    """The metric families of one snapshot (prometheus_client's core types)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        InfoMetricFamily,
    )

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))

    # A malformed record on the node cannot vouch for anything: ready is 0 then, and
    # record_valid says which record, so the alerts fire (an absent series never would).
    trusted = snap.records_valid
    out = _ready(gauge, snap.driver_ready and trusted, snap.node_ready and trusted)
    valid = gauge("record_valid", "1 when the record the installer or a component keeps on "
                  "the node is well-formed or absent, 0 when a field is malformed", ("record",))
    for record, problem in sorted(snap.records.items()):
        valid.add_metric([record], float(not problem))
    out.append(valid)
    if snap.installed is not None:
        rec = snap.installed
        info = InfoMetricFamily(f"{PREFIX}_driver", "The installed, verified driver",
                                labels=["version", "flavour", "kernel", "source"])
        info.add_metric([rec.version, rec.flavour, rec.kernel, rec.source], {})
        out.append(info)
    out += _last_run(snap.last_run, gauge, CounterMetricFamily)
    daemon_up = gauge("daemon_up", "1 when the component's container reports its daemon "
                      "running (or not needed on this node) for the verified driver",
                      ("daemon", "state"))
    for name, values in sorted(snap.daemons.items()):
        up = bool(values.get("STATE")) and snap.driver_ready
        daemon_up.add_metric([name, values.get("STATE", "down")], float(up))
    restarts = CounterMetricFamily(f"{PREFIX}_daemon_restarts", "Times the component's daemon "
                                   "died and was started again, since boot", labels=["daemon"])
    for name, count in sorted(snap.restarts.items()):
        restarts.add_metric([name], float(count))
    out += [daemon_up, restarts]
    out += _gpus(snap, gauge)
    out += _next_kernel(snap, gauge)
    return out


def _ready(gauge: Callable[..., Any], driver: bool, node: bool) -> list[Any]:
    ready = gauge("driver_ready", "1 when the driver the installer verified on this boot is "
                  "the one loaded")
    ready.add_metric([], float(driver))
    whole = gauge("node_ready", "1 when the driver and every component that applies are up "
                  "(what the scheduling gate opens on)")
    whole.add_metric([], float(node))
    return [ready, whole]


def unreadable() -> list[Any]:
    """What a scrape answers when the node's records could not be turned into metrics at all:
    not ready, and the record `snapshot` invalid."""
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))

    valid = gauge("record_valid", "1 when the record the installer or a component keeps on "
                  "the node is well-formed or absent, 0 when a field is malformed", ("record",))
    valid.add_metric(["snapshot"], 0.0)
    return [*_ready(gauge, False, False), valid]


def _last_run(run: dict[str, Any], gauge: Callable[..., Any], counter: Any) -> list[Any]:
    from prometheus_client.core import InfoMetricFamily

    out: list[Any] = []
    failures = counter(f"{PREFIX}_failures", "Failed `installer run`s by error reference, "
                       "across runs (kept in the install dir's last-run.json)",
                       labels=["reference"])
    for reference, count in sorted((run.get("failures") or {}).items()):
        failures.add_metric([str(reference)], float(count))
    out.append(failures)
    if not run:
        return out
    success = gauge("last_run_success", "1 when the last `installer run` succeeded")
    success.add_metric([], float(run.get("outcome") == "success"))
    info = InfoMetricFamily(f"{PREFIX}_last_run", "How the last `installer run` ended",
                            labels=["outcome", "error", "failed_step", "version"])
    info.add_metric([str(run.get(k, "")) for k in ("outcome", "error", "failed_step",
                                                   "version")], {})
    phases = gauge("last_install_phase_duration_seconds", "Seconds each step took in the last "
                   "run that changed the host", ("phase",))
    for phase, seconds in sorted((run.get("phases") or {}).items()):
        phases.add_metric([phase], float(seconds))
    total = gauge("last_install_duration_seconds", "Seconds the last run that changed the "
                  "host took, start to end")
    total.add_metric([], float(run.get("seconds", 0.0)))
    source = gauge("modules_source", "1 for how the installed kernel modules came to be: "
                   "compiled on the node, pulled from the registry, or cached", ("source",))
    for name in MODULE_SOURCES:
        source.add_metric([name], float(run.get("modules") == name))
    out += [success, info, phases, total, source]
    return out


def _gpus(snap: Snapshot, gauge: Callable[..., Any]) -> list[Any]:
    required = gauge("fabric_required", "1 on an NVSwitch node whose NVLink fabric the node "
                     "manages (Fabric Manager must run)")
    required.add_metric([], float(snap.fabric_required))
    state = gauge("gpu_fabric_state", "1 for the GPU's NVLink fabric registration state as "
                  "NVML reports it", ("gpu", "uuid", "state", "status"))
    done = gauge("gpu_fabric_completed", "1 when the GPU's fabric registration completed "
                 "successfully and NVML does not call it unhealthy (0 while pending or failed)",
                 ("gpu", "uuid"))
    persistence = gauge("gpu_persistence_mode_enabled", "1 when persistence mode is on",
                        ("gpu", "uuid"))
    for address, uuid, fabric, status, mode, fabric_done in snap.gpus:
        if fabric not in (None, "unavailable", "not-supported"):
            state.add_metric([address, uuid, str(fabric), str(status or "")], 1.0)
            done.add_metric([address, uuid], float(fabric_done))
        if mode is not None:
            persistence.add_metric([address, uuid], float(mode == "enabled"))
    return [required, state, done, persistence]


def _next_kernel(snap: Snapshot, gauge: Callable[..., Any]) -> list[Any]:
    pending = gauge("next_kernel_pending", "1 when a newer kernel is installed for the next "
                    "boot")
    kernel = snap.next_kernel.get("kernel")
    pending.add_metric([], float(bool(kernel)))
    ready = gauge("next_kernel_ready", "1 when the installed driver's modules for the next "
                  "kernel are ready (its boot is the warm path)", ("kernel",))
    if kernel:
        ready.add_metric([str(kernel)], float(bool(snap.next_kernel.get("modules_ready"))))
    return [pending, ready]


class Collector:
    """prometheus_client's custom-collector protocol: a fresh snapshot per scrape."""

    def __init__(self, take: Callable[[], Snapshot]) -> None:
        self.take = take

    def collect(self) -> Iterator[Any]:
        try:
            out = families(self.take())
        except Exception:  # a scrape must answer, and say so; the log says what broke
            log.exception("metrics: reading the node's state failed")
            out = unreadable()
        yield from out


class Limits(NamedTuple):
    """How much the exporter's HTTP side holds, whatever its clients do."""

    read_timeout: float = server.READ_TIMEOUT
    max_connections: int = server.MAX_CONNECTIONS


def start(take: Callable[[], Snapshot], listen: str, access: Access | None = None,
          limits: Limits | None = None) -> Callable[[], None]:
    """Serve /metrics on `listen` in a thread; returns how to stop it. With `access`, only a
    request whose bearer token it admits gets the metrics. Raises MetricsListenInvalid,
    MetricsClientMissing, MetricsPortUnavailable."""
    address, port = parse_listen(listen)
    limits = limits or Limits()
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError as exc:
        raise MetricsClientMissing(f"the Prometheus client library is not installed ({exc})") \
            from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(take))  # type: ignore[arg-type]

    def respond(method: str, path: str, headers: Mapping[str, str]) -> server.Answer:
        if path.split("?", 1)[0] != "/metrics":
            return server.Answer(404, b"only /metrics is served here\n")
        if method not in ("GET", "HEAD"):
            return server.Answer(405, b"GET /metrics\n")
        if access is not None:
            status, reason = access.check(headers.get("authorization"))
            if status != 200:
                return server.Answer(status, f"{reason}\n".encode())
        return server.Answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    try:
        http = server.Server(address, port, respond, read_timeout=limits.read_timeout,
                             max_connections=limits.max_connections)
    except OSError as exc:
        raise MetricsPortUnavailable(f"cannot listen on {address}:{port}: "
                                     f"{exc.strerror or exc}") from None
    stopping = threading.Event()
    thread = threading.Thread(target=http.serve, args=(stopping,), name="metrics-http",
                              daemon=True)
    thread.start()
    log.info("metrics: serving http://%s/metrics (%s, at most %d connections, %.0f s each "
             "to send its request)", _host_port(address, port),
             "scrapers checked with TokenReview and SubjectAccessReview" if access else
             "no access check", limits.max_connections, limits.read_timeout)

    def stop() -> None:
        stopping.set()
        http.wake()
        thread.join(15)

    return stop


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def serve_until(take: Callable[[], Snapshot], listen: str, stop: threading.Event,
                access: Access | None = None, limits: Limits | None = None) -> None:
    shutdown = start(take, listen, access, limits)
    try:
        stop.wait()
    finally:
        shutdown()

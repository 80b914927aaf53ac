"""The exporter's HTTP side under hostile clients, on 127.0.0.1, bounded in time and count:
idle (half-open) clients hold no thread each, a client that never finishes its request is
dropped at its deadline (a byte at a time does not extend it), open connections are capped
with the oldest idle one making room (a scrape still gets in), and only GET /metrics is
served."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from installer.errors import MetricsPortUnavailable
from installer.metrics import exporter
from installer.metrics.snapshot import Snapshot

P = "nvidia_driver_installer"
IDLE_CLIENTS = 300
# What the exporter holds at most (installer.metrics.server: WORKERS, MAX_CONNECTIONS, MAX_HEAD),
# written out so that the attack runs against any version of the exporter.
THREADS, CONNECTIONS, HEAD = 1 + 4, 64, 16 * 1024
PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line never comes


def snap() -> Snapshot:
    return Snapshot(driver_ready=True, node_ready=True, installed=None, last_run={}, daemons={},
                    restarts={}, fabric_required=False, gpus=())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def exporter_on_a_free_port(listen: str = "127.0.0.1:{}",
                            limits: exporter.Limits | None = None) -> Iterator[int]:
    """The exporter serving `snap` on a free port (put in `listen`'s {}), stopped on leaving;
    yields the port."""
    port = free_port()
    stop = exporter.start(snap, listen.format(port), limits=limits)
    try:
        yield port
    finally:
        stop()


@pytest.fixture
def idle() -> Iterator[list[socket.socket]]:
    clients: list[socket.socket] = []
    yield clients
    for client in clients:
        client.close()


def open_idle(port: int, count: int, clients: list[socket.socket]) -> None:
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(PARTIAL)
        clients.append(client)


def closed_by_server(client: socket.socket, wait: float) -> bool:
    client.settimeout(wait)
    try:
        return client.recv(1024) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def get(port: int, path: str = "/metrics", **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_idle_clients_hold_no_thread_and_a_scrape_still_answers(
        idle: list[socket.socket]) -> None:
    before = threading.active_count()
    with exporter_on_a_free_port() as port:
        open_idle(port, IDLE_CLIENTS, idle)
        time.sleep(0.5)
        # One serving thread and its few workers, never a thread per connection.
        assert threading.active_count() - before <= THREADS
        started = time.monotonic()
        status, body = get(port)
        assert status == 200 and f"{P}_driver_ready 1.0" in body.splitlines()
        assert time.monotonic() - started < 5
        # The cap: beyond it the oldest idle clients were let go.
        still_open = sum(not closed_by_server(c, 0.01) for c in idle)
        assert still_open <= CONNECTIONS
        assert closed_by_server(idle[0], 1)


def test_a_client_that_never_finishes_its_request_is_dropped_at_its_deadline(
        idle: list[socket.socket]) -> None:
    with exporter_on_a_free_port(limits=exporter.Limits(read_timeout=1.0)) as port:
        open_idle(port, 1, idle)
        drip = socket.create_connection(("127.0.0.1", port), timeout=5)
        idle.append(drip)
        started = time.monotonic()
        closed = False
        for byte in PARTIAL * 4:  # a byte every 0.1 s never extends the deadline
            try:
                drip.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if time.monotonic() - started > 3:
                break
            time.sleep(0.1)
        assert closed or closed_by_server(drip, 1)
        assert time.monotonic() - started < 3
        assert closed_by_server(idle[0], 1)


def test_only_get_metrics_is_served_and_a_huge_head_is_refused() -> None:
    with exporter_on_a_free_port() as port:
        assert get(port, "/")[0] == 404
        assert get(port, "/metrics?x=1")[0] == 200
        assert get(port, "/metrics", Cookie="x" * (HEAD + 10))[0] == 431
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 405 ")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"garbage\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 400 ")


def test_the_listen_address_is_bound_as_given() -> None:
    with exporter_on_a_free_port("[127.0.0.1]:{}") as port:
        assert get(port)[0] == 200
    with pytest.raises(MetricsPortUnavailable, match=r"cannot listen on 192\.0\.2\.1"):
        exporter.start(snap, f"192.0.2.1:{port}")  # not this host's: refused, not widened

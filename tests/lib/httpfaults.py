"""A fault-injecting HTTP/1.1 server (and forward proxy) on 127.0.0.1 for tests.

    with FaultServer() as srv:
        srv.add("/f.run", data, fail_times=2)        # 503 twice, then the file
        srv.add("/g.run", data, reset_after=1 << 20) # RST after 1 MiB, once
        url = srv.url("/f.run")
        ...
        assert srv.count("/f.run") == 3

Every route serves its body with Range support unless told otherwise; every request is
recorded (method, path, headers, status, body bytes sent) so tests can assert on traffic.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import socket
import ssl
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import pytest

_SEND_CHUNK = 64 * 1024


@dataclass
class Route:
    """What one path answers. Counters (`*_times`) decrease as faults are used."""

    body: bytes = b""
    status: int = 200  # a fixed status instead of the body (404, 401, 403, 500...)
    fail_times: int = 0  # answer `fail_status` this many times, then behave normally
    fail_status: int = 503
    retry_after: Optional[str] = None  # Retry-After header sent with fail_status
    reset_after: Optional[int] = None  # abort with a TCP reset after this many body bytes
    reset_times: int = 1
    truncate_after: Optional[int] = None  # close cleanly after this many body bytes
    truncate_times: int = 1  # (Content-Length still announces the whole body)
    ignore_range: bool = False  # answer 200 with the whole body even to a Range request
    stall: float = 0.0  # seconds to go silent...
    stall_after: Optional[int] = None  # ...before the headers (None) or after N body bytes
    stall_times: Optional[int] = None  # None: on every request
    headers: dict[str, str] = field(default_factory=dict)
    no_length: bool = False  # no Content-Length: the body ends when the server closes (RFC 9112)


@dataclass
class Request:
    """One request as the server saw it; recorded on arrival, status and bytes filled in as
    the answer goes out (so a test that returns early still sees the request)."""

    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    body_bytes: int = 0

    def header(self, name: str) -> Optional[str]:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


class FaultServer:
    """Threaded HTTP server on 127.0.0.1:<free port>; start()/stop() or use as a context."""

    def __init__(self, tls: Optional[ssl.SSLContext] = None) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.scheme = "http"
        if tls is not None:  # HTTPS (tests/tlskit.py): the handshake happens on accept
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
            self.scheme = "https"
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle

    def start(self) -> FaultServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (safe on a server never started: a dead port)."""
        self._stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def url(self, path: str, *, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{self.scheme}://{at}127.0.0.1:{self.port}{path}"

    def add(self, path: str, body: bytes = b"", **faults: Any) -> Route:
        route = Route(body=body, **faults)
        with self._lock:
            self.routes[path] = route
        return route

    def add_sha256sum(
        self, path: str, body: bytes, *, name: Optional[str] = None, wrong: bool = False
    ) -> str:
        """Serve `<path>.sha256sum` for `body` (or a wrong digest); returns the digest served."""
        digest = hashlib.sha256(body + (b"x" if wrong else b"")).hexdigest()
        listed = name or path.rsplit("/", 1)[-1]
        self.add(path + ".sha256sum", f"{digest}  {listed}\n".encode())
        return digest

    # -- observations

    def requests_for(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def count(self, path: str) -> int:
        return len(self.requests_for(path))

    def bytes_sent(self, path: str) -> int:
        return sum(r.body_bytes for r in self.requests_for(path))

    def range_requests(self, path: str) -> list[Request]:
        return [r for r in self.requests_for(path) if r.header("Range")]

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: FaultServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or abort mid-body are what these tests provoke; stay quiet.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Abort(Exception):
    pass


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (connections kept alive, as the clients under test keep them) and no access log
    on the test's stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass


def answer(h: BaseHTTPRequestHandler, status: int, body: bytes = b"",
           headers: dict[str, str] | None = None) -> None:
    """A whole answer from a test's stand-in server: status, `headers`, Content-Length and,
    but to a HEAD, `body`."""
    h.send_response(status)
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


class _Handler(QuietHandler):
    server: _Server
    timeout = 5  # idle keep-alive connections end on their own

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        owner = self.server.owner
        path = urlsplit(self.path).path
        headers = {k: v for k, v in self.headers.items()}
        seen = Request(self.command, path, headers)
        with owner._lock:
            owner.requests.append(seen)
            route = owner.routes.get(path)
            stall = 0.0
            stall_after: Optional[int] = None
            if route is not None and route.stall and route.stall_times != 0:
                stall, stall_after = route.stall, route.stall_after
                if route.stall_times is not None:
                    route.stall_times -= 1
            fail = route is not None and route.fail_times > 0
            if fail and route is not None:
                route.fail_times -= 1
            reset_after = truncate_after = None
            if route is not None and route.reset_after is not None and route.reset_times > 0:
                reset_after = route.reset_after
                route.reset_times -= 1
            if route is not None and route.truncate_after is not None and route.truncate_times:
                truncate_after = route.truncate_after
                route.truncate_times -= 1

        if stall and stall_after is None:
            owner._sleep(stall)
        if route is None or route.status != 200 or fail:
            status = 404 if route is None else (route.fail_status if fail else route.status)
            # A fixed status keeps its headers (a redirect's Location).
            extra = dict(route.headers) if route is not None and not fail else {}
            if fail and route is not None and route.retry_after is not None:
                extra["Retry-After"] = route.retry_after
            seen.status = status
            self._send_status(status, extra)
            return

        body = route.body
        size = len(body)
        start, end = 0, size - 1
        status = 200
        range_header = self.headers.get("Range")
        if range_header and not route.ignore_range:
            parsed = _parse_range(range_header, size)
            if parsed is None:
                seen.status = 416
                self._send_status(416, {"Content-Range": f"bytes */{size}"})
                return
            start, end = parsed
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        if route.no_length:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "none" if route.ignore_range else "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for key, value in route.headers.items():
            self.send_header(key, value)
        seen.status = status
        self.end_headers()
        if not head:
            self._send_body(
                seen, body[start : end + 1], reset_after, truncate_after, stall, stall_after
            )

    def _send_body(
        self,
        seen: Request,
        data: bytes,
        reset_after: Optional[int],
        truncate_after: Optional[int],
        stall: float,
        stall_after: Optional[int],
    ) -> int:
        owner = self.server.owner
        limit = len(data)
        for cut in (reset_after, truncate_after):
            if cut is not None:
                limit = min(limit, cut)
        view = memoryview(data)
        sent = 0

        def send_until(upto: int) -> None:
            nonlocal sent
            while sent < upto:
                step = min(_SEND_CHUNK, upto - sent)
                # counted before the write returns, so a client that has everything
                # never sees a smaller count than what it received
                seen.body_bytes = sent + step
                self.wfile.write(view[sent : sent + step])
                sent += step

        try:
            if stall and stall_after is not None:
                send_until(min(stall_after, limit))
                owner._sleep(stall)
            send_until(limit)
        except OSError:  # the client went away (timeout on its side, reset)
            self.close_connection = True
            return sent
        if reset_after is not None and sent == reset_after and sent < len(data):
            # Let what was sent reach the client, then abort: SO_LINGER 0 makes close() send
            # RST (dropping anything still queued), seen as "connection reset by peer".
            _wait_until_sent(self.connection)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        elif sent < len(data):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        return sent

    def _send_status(self, status: int, extra: dict[str, str]) -> None:
        body = f"{status} {http.client.responses.get(status, '')}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(body)
            except OSError:
                self.close_connection = True


def _wait_until_sent(sock: socket.socket, limit: float = 2.0) -> None:
    """Wait until the kernel holds no unacknowledged bytes for `sock` (Linux SIOCOUTQ)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            time.sleep(0.05)
            return
        if queued == 0:
            return
        time.sleep(0.002)


def _parse_range(header: str, size: int) -> Optional[tuple[int, int]]:
    """`bytes=N-` / `bytes=N-M` / `bytes=-K` → (start, end) inclusive; None if unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    if not first:
        if not last.isdigit() or int(last) == 0:
            return None
        return max(0, size - int(last)), size - 1
    if not first.isdigit():
        return None
    start = int(first)
    end = int(last) if last.isdigit() else size - 1
    if start >= size or end < start:
        return None
    return start, min(end, size - 1)


class ForwardProxy:
    """A plain-HTTP forward proxy on 127.0.0.1 that sends every request to `target`.

    Any host in the absolute request URI (e.g. http://mirror.invalid/f) reaches `target`,
    so a test proves the proxy was used without DNS. Records each request it forwarded.
    """

    def __init__(self, target: FaultServer) -> None:
        self.target = target
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 5

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                headers = {k: v for k, v in self.headers.items()}
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.target.port, timeout=10)
                path = urlsplit(self.path).path or "/"
                forward = {
                    k: v
                    for k, v in headers.items()
                    if k.lower() not in ("host", "proxy-connection")
                }
                upstream.request("GET", path, headers=forward)
                resp = upstream.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()
                with proxy._lock:
                    proxy.requests.append(
                        Request("GET", self.path, headers, resp.status, len(data))
                    )

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ForwardProxy:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def static_server(
    directory: Path, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[int, list[str]]]:
    """A plain static server for `directory` on 127.0.0.1 (over TLS with `tls`): yields its port
    and the list of request paths it receives."""
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(directory), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            requests.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], requests
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """A plain static server for `directory` on 127.0.0.1: yields its base URL and the list of
    request paths it receives (tests assert that a warm run asks for nothing)."""
    with static_server(directory) as (port, requests):
        yield f"http://127.0.0.1:{port}", requests


def serve_new_directory(
    factory: pytest.TempPathFactory, fill: Callable[[Path], object]
) -> Iterator[tuple[str, Path, list[str]]]:
    """The body of a module's `served` fixture: a new directory that `fill` writes, served on
    127.0.0.1 for as long as the fixture lasts; yields the base URL, the directory and the
    request paths the server receives."""
    www = factory.mktemp("www")
    fill(www)
    with serve_directory(www) as (base, requests):
        yield base, www, requests

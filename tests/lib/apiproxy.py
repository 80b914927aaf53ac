"""A fault-injecting HTTPS proxy in front of the real API server (tests/lib/controlplane.py):
what a real server cannot be made to do on cue (429 with Retry-After, 500, a 409 conflict, an
answer that never comes) at chosen moments, and a record of every request the installer made.
Everything else is passed through unchanged to the real server, the client's own token
included, so the server authenticates, authorizes and admits as it would.

    with ApiProxy(cp) as proxy:
        proxy.fail("PATCH", r"/api/v1/nodes/n1/status", 409, times=1)
        kubeconfig = proxy.kubeconfig(tmp_path / "kc", token)
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lib.controlplane import ControlPlane, kubeconfig
from lib.tlskit import make_tls

# What a real API server's body says for each injected status (a metav1.Status).
_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int  # 0: hang (no answer for `hang` seconds, then close)
    times: int
    retry_after: str | None = None
    hang: float = 0.0
    after: int = 0  # let this many matching requests through first
    body: bytes | None = None  # the answer's body instead of a metav1.Status


@dataclass
class Hook:
    method: str
    path: re.Pattern[str]
    action: Callable[[], object]
    times: int


@dataclass
class Rewrite:
    method: str
    path: re.Pattern[str]
    to: Callable[[str], str]  # the request's path with its query -> what is passed on
    times: int


@dataclass
class Seen:
    method: str
    path: str  # with the query
    status: int
    injected: bool
    bytes_in: int
    bytes_out: int
    at: float = field(default_factory=time.monotonic)
    body: bytes = b""  # what the client sent (a DELETE's options, a PATCH's patch)
    bearer: str | None = None  # the token the request carried (Authorization: Bearer)

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")


class ApiProxy:
    def __init__(self, cp: ControlPlane, directory: Path, *,
                 certificate: tuple[Path, Path] | None = None) -> None:
        """`certificate`: a PEM chain and its key to present instead of the proxy's own
        (a server certificate a test chose: another CA's, one for a name only); self.tls.ca_file
        then trusts nothing it serves."""
        self.cp = cp
        self.tls = make_tls(directory)
        if certificate is not None:
            chosen = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            chosen.load_cert_chain(*certificate)
            self.tls = self.tls._replace(context=chosen)
        self.faults: list[Fault] = []
        self.hooks: list[Hook] = []
        self.rewrites: list[Rewrite] = []
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        upstream = urlsplit(cp.url)
        self._upstream = (upstream.hostname or "127.0.0.1", upstream.port or 443)
        self._upstream_tls = ssl.create_default_context(cafile=str(cp.ca))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.socket = self.tls.context.wrap_socket(self._server.socket, server_side=True)
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, paid per test.
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ApiProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail(self, method: str, path: str, status: int, *, times: int = 1, after: int = 0,
             retry_after: str | None = None, hang: float = 0.0) -> None:
        """The next `times` requests (after `after` passed through) whose method and path
        (a regex, matched at the start of the path without its query) match are answered with
        `status` by the proxy, or with silence for `hang` seconds when status is 0."""
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), status, times, retry_after,
                                     hang, after))

    def answer(self, method: str, path: str, status: int, body: object, *,
               times: int = 1) -> None:
        """The next `times` matching requests are answered by the proxy with `status` and
        `body` (JSON): an API group's discovery as an older server would answer it."""
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), status, times,
                                     body=json.dumps(body).encode()))

    def before(self, method: str, path: str, action: Callable[[], object], *,
               times: int = 1) -> None:
        """Runs `action` (say, an administrator's write) just before the next `times` matching
        requests are passed on: the real server then answers them as it would after that
        change (a 409 for a write guarded by the resourceVersion read before it)."""
        with self.lock:
            self.hooks.append(Hook(method, re.compile(path), action, times))

    def rewrite(self, method: str, path: str, to: Callable[[str], str], *,
                times: int = 1_000_000) -> None:
        """The next `times` matching requests are passed on as `to(path with query)` asks,
        and the server's answer to that goes back: a list whose field selector the proxy
        drops is answered as a server that ignored it would answer (with every pod)."""
        with self.lock:
            self.rewrites.append(Rewrite(method, re.compile(path), to, times))

    def _rewritten(self, method: str, path: str) -> str:
        with self.lock:
            for rewrite in self.rewrites:
                if (rewrite.times > 0 and rewrite.method == method
                        and rewrite.path.match(path.split("?")[0])):
                    rewrite.times -= 1
                    return rewrite.to(path)
        return path

    def kubeconfig(self, path: Path, token: str) -> Path:
        return kubeconfig(path, self.url, self.tls.ca_file, token=token)

    def writes(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.is_write]

    def _take(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and fault.path.match(path):
                    if fault.after > 0:
                        fault.after -= 1
                        return None
                    fault.times -= 1
                    return fault
        return None

    def _hook(self, method: str, path: str) -> Hook | None:
        with self.lock:
            for hook in self.hooks:
                if hook.times > 0 and hook.method == method and hook.path.match(path):
                    hook.times -= 1
                    return hook
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take(self.command, self.path.split("?")[0])
                if fault is not None and fault.status == 0:
                    self._record(0, True, len(body), 0)  # on arrival: the client gives up first
                    time.sleep(fault.hang)
                    self.close_connection = True
                    return
                if fault is not None:
                    reason = _REASONS.get(fault.status, "InternalError")
                    payload = (f'{{"kind":"Status","apiVersion":"v1","status":"Failure",'
                               f'"message":"injected {fault.status}","reason":"{reason}",'
                               f'"code":{fault.status}}}').encode()
                    if fault.body is not None:
                        payload = fault.body
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/json")
                    if fault.retry_after is not None:
                        self.send_header("Retry-After", fault.retry_after)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    self._record(fault.status, True, len(body), len(payload))
                    return
                hook = proxy._hook(self.command, self.path.split("?")[0])
                if hook is not None:
                    hook.action()
                conn = http.client.HTTPSConnection(*proxy._upstream,
                                                   context=proxy._upstream_tls, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                conn.request(self.command, proxy._rewritten(self.command, self.path),
                             body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()
                self._record(resp.status, False, len(body), len(data), body)

            def _record(self, status: int, injected: bool, bytes_in: int, out: int,
                        body: bytes = b"") -> None:
                authorization = self.headers.get("Authorization") or ""
                bearer = (authorization.removeprefix("Bearer ")
                          if authorization.startswith("Bearer ") else None)
                with proxy.lock:
                    proxy.seen.append(Seen(self.command, self.path, status, injected, bytes_in,
                                           out, body=body, bearer=bearer))

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        return Handler

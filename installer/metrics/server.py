"""The exporter's HTTP side, bounded whatever clients do: one thread reads the request heads of
every connection (an idle client costs a socket, never a thread), a few workers answer them,
each connection has a deadline for its request, and the open connections are capped (the
oldest one still sending its request makes room for a new one)."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from email.parser import BytesHeaderParser
from typing import NamedTuple

log = logging.getLogger(__name__)

# A scraper sends its request at once; ten seconds is patient even across a loaded node.
READ_TIMEOUT = 10.0
# Prometheus (an HA pair), an operator's curl and a few retries, with room to spare.
MAX_CONNECTIONS = 64
# Each scrape reads a few small files; a TokenReview round trip is what takes longest.
WORKERS = 4
# A GET with a bearer token fits in far less; anything larger is not a scrape.
MAX_HEAD = 16 * 1024


class Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# (method, path with its query, headers with lower-case names) -> the answer
Respond = Callable[[str, str, Mapping[str, str]], Answer]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


class _Reading(NamedTuple):
    deadline: float
    head: bytearray


class Server:
    """Listens on (address, port) at once; `serve(stop)` answers until `stop` is set. Raises
    OSError when the address cannot be bound."""

    def __init__(self, address: str, port: int, respond: Respond, *,
                 read_timeout: float = READ_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 workers: int = WORKERS) -> None:
        self.respond, self.read_timeout = respond, read_timeout
        self.max_connections = max_connections
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((address, port))
            self.sock.listen(128)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.reading: dict[socket.socket, _Reading] = {}  # oldest first
        self.answering = 0  # connections handed to a worker
        self.dropped = 0  # connections closed before their request was answered
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="metrics-answer")

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def serve(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    self._turn()
                except Exception:  # a bug must not end the serving: log it, go on
                    log.exception("metrics: serving a connection failed")
                    time.sleep(0.1)
        finally:
            self.close()

    def _turn(self) -> None:
        for key, _events in self.selector.select(timeout=0.5):
            if key.fileobj is self.sock:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                self._read(key.fileobj)  # type: ignore[arg-type]
        self._expire(time.monotonic())

    def close(self) -> None:
        for conn in list(self.reading):
            self._drop(conn)
        self.pool.shutdown(wait=True)
        for sock in (self.sock, self._wake_r, self._wake_w):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
        self.selector.close()

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_r.recv(64)

    def _accept(self) -> None:
        for _ in range(64):  # what the backlog holds now, a bounded batch at a time
            try:
                conn, _peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the backlog waits
                log.warning("metrics: cannot accept a connection: %s", exc)
                return
            with self.lock:
                full = len(self.reading) + self.answering >= self.max_connections
            if full and self.reading:
                self._drop(next(iter(self.reading)))  # the oldest still sending its request
            elif full:
                self.dropped += 1
                conn.close()
                continue
            conn.setblocking(False)
            self.reading[conn] = _Reading(time.monotonic() + self.read_timeout, bytearray())
            self.selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        reading = self.reading.get(conn)
        if reading is None:
            return
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        reading.head.extend(chunk)
        end = reading.head.find(b"\r\n\r\n")
        if end < 0 and len(reading.head) <= MAX_HEAD:
            return
        self.selector.unregister(conn)
        del self.reading[conn]
        with self.lock:
            self.answering += 1
        head = bytes(reading.head[:end]) if 0 <= end <= MAX_HEAD else None
        self.pool.submit(self._answer, conn, head)

    def _expire(self, now: float) -> None:
        for conn, reading in list(self.reading.items()):
            if reading.deadline > now:
                break  # the rest came later
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        self.dropped += 1
        conn.close()

    def _answer(self, conn: socket.socket, head: bytes | None) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(self.read_timeout)
            method = ""
            try:
                method, answer = self._respond(head)
            except Exception:  # a scrape answers 500, the exporter goes on
                log.exception("metrics: answering a request failed")
                answer = Answer(500, b"internal error\n")
            reason = _REASONS.get(answer.status, "")
            lines = [f"HTTP/1.1 {answer.status} {reason}", f"Content-Type: {answer.content_type}",
                     f"Content-Length: {len(answer.body)}", "Connection: close"]
            if answer.status == 401:
                lines.append('WWW-Authenticate: Bearer realm="nvidia-driver-installer"')
            data = ("\r\n".join(lines) + "\r\n\r\n").encode()
            conn.sendall(data if method == "HEAD" else data + answer.body)
        except OSError:
            pass  # the client went away or stopped reading: its loss
        finally:
            conn.close()
            with self.lock:
                self.answering -= 1

    def _respond(self, head: bytes | None) -> tuple[str, Answer]:
        if head is None:
            return "", Answer(431, b"request head too large\n")
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "", Answer(400, b"bad request line\n")
        method, path = parts[0], parts[1]
        parsed = BytesHeaderParser().parsebytes(rest + b"\r\n\r\n")
        headers = {name.lower(): str(value) for name, value in parsed.items()}
        return method, self.respond(method, path, headers)

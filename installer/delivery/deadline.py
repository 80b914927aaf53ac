"""An overall deadline for one registry client: when it passes, every connection the client
opened is shut down, so a server that trickles a byte at a time (each read well inside the read
timeout, the whole never ending) cannot hold a node, in headers, TLS handshake or body."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class Deadline:
    """A timer that cuts the sockets handed to `track` once `seconds` have passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def track(self, sock: socket.socket) -> None:
        """Watch `sock` through a duplicate of its descriptor: shutdown(2) acts on the
        connection, so it works on the duplicate even after TLS wrapped (and detached) the
        original socket object."""
        try:
            dup = sock.dup()
        except OSError:
            return
        with self._lock:
            self._sockets.append(dup)
            if self.expired:
                _shut(dup)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the other side
        sock.shutdown(socket.SHUT_RDWR)  # a blocked recv on it returns at once


def watching_adapter(deadline: Deadline) -> Any:
    """A requests adapter whose every new connection `deadline` tracks (through the pool's
    connection class: urllib3 opens each socket in `_new_conn`)."""
    from requests.adapters import HTTPAdapter

    class _Adapter(HTTPAdapter):
        def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:
            return _watched(super().get_connection_with_tls_context(*args, **kwargs), deadline)

        def get_connection(self, *args: Any, **kwargs: Any) -> Any:  # requests < 2.32.2
            return _watched(super().get_connection(*args, **kwargs), deadline)

    return _Adapter()


def _watched(pool: Any, deadline: Deadline) -> Any:
    base = getattr(pool, "ConnectionCls", None)
    if base is None or getattr(base, "watched_by", None) is deadline:
        return pool

    class Watched(base):  # type: ignore[misc, valid-type]
        watched_by = deadline

        def _new_conn(self) -> Any:
            sock = super()._new_conn()
            deadline.track(sock)
            return sock

    pool.ConnectionCls = Watched
    return pool

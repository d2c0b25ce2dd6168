"""A small HTTP server for the agent's own endpoints that a hostile client cannot exhaust.

Role: the health (`agent.health`) and Prometheus (`agent.metrics`) servers. The standard
library's `ThreadingHTTPServer` starts one thread per connection and lets it read forever, so
a client that connects and sends nothing, or trickles a byte a second, holds a thread for as
long as it likes, and enough of them exhaust the process. `BoundedHTTPServer` adds two bounds:

- a connection cap (`max_connections`): while that many connections are being served, a new
  one is closed as soon as it is accepted (no thread is started for it) and counted in
  `pyfelix_http_connections_rejected_total{server}`;
- a deadline (`read_timeout`): the request line and headers must have arrived within
  `read_timeout` seconds of the connection being accepted, in total, not per read (a slow
  trickle is cut off too); the response then gets `read_timeout` seconds, in total, to be
  written. A connection that misses either is closed and counted in
  `pyfelix_http_connections_timed_out_total{server}`.

So no connection holds a thread much longer than 2 x `read_timeout` (plus the handler's own
work), and the server never has more than `max_connections` + 1 threads.
`pyfelix_http_connections_active{server}` is the number being served now.

Handlers are ordinary `BaseHTTPRequestHandler` subclasses (HTTP/1.0: one request per
connection); `serve_in_thread()` runs the accept loop in a daemon thread and `stop()` ends it.
An IPv6 literal host (one containing ':') binds an IPv6 socket, anything else IPv4.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

REJECTED = Counter(
    "pyfelix_http_connections_rejected",
    "Connections closed on accept because the server already had its maximum open.",
    ["server"],
)
TIMED_OUT = Counter(
    "pyfelix_http_connections_timed_out",
    "Connections closed because the request (or the response) took longer than the "
    "server's read timeout.",
    ["server"],
)
ACTIVE = Gauge(
    "pyfelix_http_connections_active",
    "Connections being served now.",
    ["server"],
)

DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_READ_TIMEOUT = 5.0


class _Deadline:
    """One budget for a direction of one connection: `remaining()` seconds, or TimeoutError."""

    def __init__(self, server_name: str, seconds: float, what: str) -> None:
        self._server_name = server_name
        self._seconds = seconds
        self._what = what
        self._ends: float | None = None
        self.expired = False

    def start(self) -> None:
        if self._ends is None:
            self._ends = time.monotonic() + self._seconds

    def remaining(self) -> float:
        self.start()
        assert self._ends is not None
        left = self._ends - time.monotonic()
        if left <= 0:
            if not self.expired:
                self.expired = True
                TIMED_OUT.labels(self._server_name).inc()
            raise TimeoutError(f"{self._what} not done within {self._seconds:g} s")
        return left


class _DeadlineReader(io.RawIOBase):
    """The socket's receive side, every recv limited to what is left of the read deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.remaining())
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            self._deadline.remaining()  # counts it once the budget is really gone
            raise


class _DeadlineWriter(io.BufferedIOBase):
    """The socket's send side; the write budget starts with the first byte of the response."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._sock.settimeout(self._deadline.remaining())
        try:
            self._sock.sendall(view)  # the timeout bounds the whole sendall (Python >= 3.5)
        except TimeoutError:
            self._deadline.remaining()
            raise
        return len(view)


class BoundedHTTPServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with a connection cap and whole-request/response deadlines."""

    daemon_threads = True
    request_queue_size = 128  # the accept loop drains it at once; a burst must not be dropped

    def __init__(self, name: str, host: str, port: int,
                 handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 read_timeout: float = DEFAULT_READ_TIMEOUT) -> None:
        if max_connections < 1:
            raise ValueError(f"{name}: max_connections must be >= 1, got {max_connections}")
        if read_timeout <= 0:
            raise ValueError(f"{name}: read_timeout must be > 0, got {read_timeout}")
        self.name = name
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self._active = 0
        self._active_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ACTIVE.labels(name).set(0)
        REJECTED.labels(name)
        TIMED_OUT.labels(name)
        super().__init__((host, port), _bounded(handler))

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def active_connections(self) -> int:
        return self._active

    # --- accept side (the serving thread) -------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
                ACTIVE.labels(self.name).set(self._active)
        if full:
            REJECTED.labels(self.name).inc()
            log.debug("%s: %d connections open; closing one from %s", self.name,
                      self.max_connections, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._active_lock:
            self._active -= 1
            ACTIVE.labels(self.name).set(self._active)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("%s: connection from %s failed", self.name, client_address, exc_info=True)

    # --- life cycle ----------------------------------------------------------------------

    def serve_in_thread(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name=f"{self.name}-http",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server_close()


def _bounded(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """`handler` with its socket reads and writes under the server's deadlines."""

    class Bounded(handler):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            # StreamRequestHandler.setup() without its socket.makefile() (whose reference
            # would keep the socket open after the server closes it)
            self.connection = self.request
            server: BoundedHTTPServer = self.server  # type: ignore[assignment]
            read = _Deadline(server.name, server.read_timeout, "request")
            read.start()  # from accept: an idle connection's budget is already running
            write = _Deadline(server.name, server.read_timeout, "response")
            self.rfile = io.BufferedReader(_DeadlineReader(self.connection, read))
            self.wfile = _DeadlineWriter(self.connection, write)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s: " + format, self.server.name, *args)  # type: ignore[attr-defined]

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{handler.__name__}"
    return Bounded

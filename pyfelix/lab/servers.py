"""TCP and UDP echo servers for every pod port, living in the pods' namespaces.

Role: give probes something to connect to. Each scenario port becomes a listening socket
created inside its pod's namespace (`in_netns`); one selector thread serves all of them:
TCP connections are accepted and whatever arrives is echoed back until the peer closes; UDP
datagrams are echoed to their sender.

Inputs: (pod namespace, port, protocol) triples via `add()`.
Outputs: open sockets in pod namespaces until `stop()`; `served` (connections accepted /
datagrams echoed per listener) and `peers` (the source addresses each listener saw).

Invariants:
- No process is started: sockets belong to their pod's namespace for life, so a crash or
  SIGKILL of the lab leaves no server behind, and closing them releases the namespaces.
- The serving loop is bounded: at most `MAX_CONNECTIONS` accepted connections are open at
  once (extra ones are closed at once), each idle connection is closed after
  `IDLE_TIMEOUT_SECONDS`, and `stop()` returns within `STOP_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from pyfelix.lab.netns import in_netns

MAX_CONNECTIONS = 256
IDLE_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 2.0
RECV_BYTES = 4096
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class _Listener:
    netns: str
    port: int
    protocol: str
    family: int = 4


class PodServers:
    """All echo servers of a lab, served by one thread."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._listeners: dict[_Listener, socket.socket] = {}
        self._connections: dict[socket.socket, float] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # what each listener served: connections / datagrams, and the peers' addresses (so
        # tests can see which backend a service probe reached and whom the backend saw)
        self.served: Counter[tuple[str, int, str]] = Counter()
        self.peers: dict[tuple[str, int, str], set[str]] = defaultdict(set)

    @property
    def listening(self) -> list[tuple[str, int, str]]:
        return sorted((key.netns, key.port, key.protocol) for key in self._listeners)

    def add(self, netns: str, port: int, protocol: str, family: int = 4) -> None:
        """Open a listening socket in `netns` (wildcard address) for `port`/`protocol`,
        over IP version `family` (an IPv6 listener is IPv6-only: the IPv4 one is apart)."""
        kind = socket.SOCK_STREAM if protocol == "TCP" else socket.SOCK_DGRAM
        with in_netns(netns):
            sock = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET,
                                 kind | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == 6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(("::" if family == 6 else "0.0.0.0", port))
            if protocol == "TCP":
                sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        key = _Listener(netns, port, protocol, family)
        self._listeners[key] = sock
        self._selector.register(sock, selectors.EVENT_READ, key)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="lab-pod-servers",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every socket (idempotent)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_SECONDS)
            self._thread = None
        for sock in [*self._listeners.values(), *self._connections]:
            sock.close()
        self._listeners.clear()
        self._connections.clear()
        with contextlib.suppress(OSError, ValueError, KeyError):
            self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

    # --- serving thread ----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping.is_set():
            for key, _events in self._selector.select(POLL_SECONDS):
                if key.data == "wake":
                    continue
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if isinstance(key.data, _Listener):
                    if key.data.protocol == "TCP":
                        self._accept(sock, key.data)
                    else:
                        self._echo_datagram(sock, key.data)
                else:
                    self._echo_stream(sock)
            self._close_idle()

    def _record(self, listener: _Listener, peer: object) -> None:
        where = (listener.netns, listener.port, listener.protocol)
        self.served[where] += 1
        if isinstance(peer, tuple) and peer:
            self.peers[where].add(str(peer[0]))

    def _accept(self, listener: socket.socket, key: _Listener) -> None:
        try:
            conn, peer = listener.accept()
        except OSError:
            return
        self._record(key, peer)
        if len(self._connections) >= MAX_CONNECTIONS:
            conn.close()
            return
        conn.setblocking(False)
        self._connections[conn] = time.monotonic()
        self._selector.register(conn, selectors.EVENT_READ, "conn")

    def _echo_stream(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(RECV_BYTES)
            if data:
                conn.send(data)  # probes send a few bytes; a short write is a failed probe
                self._connections[conn] = time.monotonic()
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._drop(conn)

    def _echo_datagram(self, sock: socket.socket, key: _Listener) -> None:
        with contextlib.suppress(OSError):
            data, peer = sock.recvfrom(RECV_BYTES)
            self._record(key, peer)
            sock.sendto(data, peer)

    def _close_idle(self) -> None:
        cutoff = time.monotonic() - IDLE_TIMEOUT_SECONDS
        for conn in [c for c, last in self._connections.items() if last < cutoff]:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        self._connections.pop(conn, None)
        conn.close()

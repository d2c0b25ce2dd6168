"""The Typha server: one datastore syncer per syncer type, fanned out to many clients.

Role: `pyfelix typha`. For each syncer type it serves ("felix": every kind; "bgp": the kinds
confd needs, `BGP_KINDS`) it runs ONE syncer against the real datastore into a
`SnapshotCache`, and serves clients over TCP or TLS with the protocol of
`agent.typha.protocol` (docs/typha-protocol.md).

```
 datastore ──> syncer (felix) ──> SnapshotCache ──┐            ┌─> connection ──> client
 datastore ──> syncer (bgp)   ──> SnapshotCache ──┴─> _Fanout ─┼─> connection ──> client
              (syncer threads)   (entries encoded     (event    └─> ...
                                   once, shared)       loop)
```

Inputs: a `syncer_factory(syncer_type) -> Syncer` (so tests and the CLI choose the
datastore), a `ServerConfig`. Outputs: bytes to clients; the metrics of
`agent.typha.metrics`; health (`health`, served on HTTP `/liveness` and `/readiness` when
`health_port` is set, as Calico Typha's TYPHA_HEALTHENABLED/TYPHA_HEALTHPORT).

In sync and ready: the server passes on its syncers' status; it says `in-sync` (and
clients delete what its snapshot lacks) only once its own syncer is. Readiness is the same
fact: ready when listening and EVERY syncer type it serves is in sync, so a Kubernetes
Service (and the clients discovering its endpoints) skips a replica still listing the
datastore. Liveness: the event loop reports every second (stale after 30 s).

Threads: the syncers run in their own threads; every connection is a coroutine on ONE
asyncio event loop in the server's thread; snapshot encoding runs in the loop's executor.
A cache wakes the loop with `call_soon_threadsafe` when it has a new entry.

Fan-out cost: a client's pending entries go out in one write, runs of KV entries merged into
one `kvs` message (`cache.batch_frames`); clients at the same place in the log (nearly all)
share those bytes (`_Fanout.batch`), so an update is encoded and compressed once however
many clients there are. The fan-out latency histogram gets one observation per write.

Connections that have not said hello yet are bounded: at most `max_pending_handshakes`
at a time (more are refused at once, counted as `typha_connections_dropped{reason=
"pending-limit"}`), and each must complete its TLS handshake AND its client_hello within
`handshake_timeout` of being accepted (one deadline, however slowly the bytes trickle in).
So idle or slow peers (port scanners, half-open connections, a slowloris) hold no more than
that many sockets for that long. TLS is started by the connection itself
(`StreamWriter.start_tls`) after the limit is checked, so pending TLS handshakes count too.

One connection's life: accept (pending limit) -> TLS handshake and identity check ->
client_hello (all within `handshake_timeout` of the accept) ->
server_hello -> decoder_restart if compressing -> snapshot -> log entries as they come
(an entry waits at most `batch_delay` so that the entries following it go in the same
write: per client at most 1/`batch_delay` writes per second, whatever the update rate),
and a ping every `ping_interval`. The server closes it, sending an `error` message first when the
client can still read one, when:
- the hello is malformed, names an unsupported version ("unsupported-version": this server
  cannot serve that client; it should try another) or a syncer type not served;
- the TLS handshake and the hello do not complete within `handshake_timeout`;
- a frame is malformed (bad length, bad JSON, unknown type): "malformed";
- no pong (nor anything else) arrives for `pong_timeout` seconds: "ping-timeout";
- the client is slow: its queued bytes are not taken within `write_timeout` (the server
  waits whenever more than half of `max_send_buffer` is queued, and refuses to queue more
  once over it), or the client's next log entry has left the bounded log ("behind").
  Memory per client is therefore bounded (`max_send_buffer` plus one write); the client
  reconnects and gets a fresh snapshot.
A bad client never affects the others: every failure ends only its own coroutine.

Easy to get wrong: a drop must `abort()` (a slow client would keep `close()` waiting for
its buffer forever); error messages must be encoded with the connection's CURRENT
compression; a snapshot is consistent only with the log entries after ITS sequence number;
a TLS connection must stop reading before its first await (bytes of the peer's TLS hello
read into the plain stream would be lost to `start_tls`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyfelix.agent.health import HealthAggregator, HealthServer
from pyfelix.agent.kinds import BGP_KINDS, FELIX_KINDS, secret_namespace
from pyfelix.agent.syncer.api import Syncer, SyncStatus
from pyfelix.agent.typha import metrics
from pyfelix.agent.typha.cache import (
    DEFAULT_MAX_LOG_BYTES,
    DEFAULT_MAX_LOG_ENTRIES,
    Breadcrumb,
    SnapshotCache,
    batch_frames,
)
from pyfelix.agent.typha.protocol import (
    CLIENT_HELLO,
    CLIENT_MAX_FRAME_BYTES,
    CLIENT_MESSAGE_TYPES,
    COMPRESSION_NONE,
    ERR_BAD_HELLO,
    ERR_MALFORMED,
    ERR_NOT_AUTHORIZED,
    ERR_PING_TIMEOUT,
    ERR_SERVER_FULL,
    ERR_SHUTDOWN,
    ERR_TOO_SLOW,
    ERR_UNKNOWN_SYNCER_TYPE,
    ERR_UNSUPPORTED_VERSION,
    FRAME_HEADER,
    KNOWN_COMPRESSIONS,
    PING,
    PONG,
    SUPPORTED_PROTOCOL_VERSIONS,
    FrameReader,
    MessageDecoder,
    ProtocolError,
    decoder_restart,
    encode_message,
    error_message,
    require,
    server_hello,
)
from pyfelix.agent.typha.tls import ServerTLS

log = logging.getLogger(__name__)

SERVER_VERSION = "pyfelix-typha/1"
SYNCER_TYPE_FELIX = "felix"
SYNCER_TYPE_BGP = "bgp"
# the kinds each syncer type carries (from the kind catalogue: FELIX_KINDS what the agent
# reads, BGP_KINDS what confd reads; Secrets go to confd only)
SYNCER_TYPES: dict[str, frozenset[str] | None] = {
    SYNCER_TYPE_FELIX: FELIX_KINDS,  # every kind but the confd-only Secrets
    SYNCER_TYPE_BGP: BGP_KINDS,
}
DEFAULT_PORT = 5473
BATCH_CACHE_SIZE = 8  # merged batches kept per syncer type (a few positions in the log)
# Connections accepted that have not completed TLS + hello (TYPHA_SERVERMAXPENDINGHANDSHAKES).
# Each pending TLS connection costs ~300 KB (asyncio's TLS protocol allocates a 256 KiB read
# buffer per connection): 250 of them ~75 MB, plain TCP ~2.5 MB. The server completes a few
# hundred TLS handshakes + hellos a second, so 250 is about a second of that work queued.
DEFAULT_MAX_PENDING_HANDSHAKES = 250
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # seconds from accept to hello (TYPHA_SERVERHANDSHAKETIMEOUTSECS)
DEFAULT_HEALTH_PORT = 9098  # Calico Typha's TYPHA_HEALTHPORT
HEALTH_SERVER = "typha-server"  # health reporter: the event loop (live) and listener (ready)
HEALTH_HEARTBEAT = 1.0  # seconds between the event loop's liveness reports
HEALTH_LIVENESS_TIMEOUT = 30.0  # no report for this long: not live
REJECTION_LOG_INTERVAL = 10.0  # seconds between log lines about pending-limit refusals


def health_reporter_name(syncer_type: str) -> str:
    """The readiness reporter of one syncer type's datastore syncer."""
    return f"typha-syncer-{syncer_type}"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: any free port (see TyphaServer.address)
    tls: ServerTLS | None = None  # None: plain TCP (the CLI insists on --insecure)
    syncer_types: tuple[str, ...] = (SYNCER_TYPE_FELIX, SYNCER_TYPE_BGP)
    compression: tuple[str, ...] = KNOWN_COMPRESSIONS  # preference order
    # from accept to a valid client_hello, TLS handshake included
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    # connections accepted but not yet past their hello; more are refused at once
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    ping_interval: float = 10.0
    pong_timeout: float = 60.0
    write_timeout: float = 30.0
    # an update waits up to this long so that it goes out with those that follow it: fewer,
    # bigger writes (per client at most 1/batch_delay writes per second)
    batch_delay: float = 0.1
    max_send_buffer: int = 8 * 1024 * 1024
    max_log_entries: int = DEFAULT_MAX_LOG_ENTRIES
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    snapshot_reuse_seconds: float = 1.0
    max_connections: int = 10_000
    socket_send_buffer: int | None = None  # SO_SNDBUF for client sockets (tests shrink it)
    health_port: int | None = None  # HTTP /liveness and /readiness; None: off, 0: any free
    health_host: str = "localhost"
    syncer_kinds: dict[str, frozenset[str] | None] = field(
        default_factory=lambda: dict(SYNCER_TYPES))

    def validate(self) -> None:
        unknown = [t for t in self.syncer_types if t not in self.syncer_kinds]
        if unknown or not self.syncer_types:
            raise ValueError(f"syncer types {unknown or '(none)'} not known; known: "
                             f"{', '.join(sorted(self.syncer_kinds))}")
        bad = [c for c in self.compression if c not in KNOWN_COMPRESSIONS]
        if bad:
            raise ValueError(f"unknown compression {bad}; known: {', '.join(KNOWN_COMPRESSIONS)}")
        if self.pong_timeout <= self.ping_interval:
            raise ValueError(f"pong_timeout ({self.pong_timeout} s) must exceed ping_interval "
                             f"({self.ping_interval} s)")
        for name in ("handshake_timeout", "ping_interval", "write_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 <= self.batch_delay <= 1:
            raise ValueError("batch_delay must be between 0 and 1 s")
        if self.max_send_buffer < 64 * 1024:
            raise ValueError("max_send_buffer must be at least 64 KiB")
        if self.max_pending_handshakes < 1:
            raise ValueError("max_pending_handshakes must be at least 1")
        if self.health_port is not None and not 0 <= self.health_port < 65536:
            raise ValueError(f"health_port {self.health_port} is not a port (0-65535)")


class HealthListenError(Exception):
    """The health endpoint's port cannot be bound."""


class _Disconnect(Exception):
    """End a connection: `reason` is the metric label, `code` the error to send (or None)."""

    def __init__(self, reason: str, code: str | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class _PeerClosed(Exception):
    """The client went away (EOF or reset); nothing to send."""


class _Fanout:
    """Loop-side view of one cache: the newest published entry and the waiting writers."""

    def __init__(self, cache: SnapshotCache, loop: asyncio.AbstractEventLoop) -> None:
        self.cache = cache
        self.loop = loop
        self.published_seq = cache.latest_seq
        self._waiters: set[asyncio.Future[None]] = set()
        self._batches: OrderedDict[tuple[int, int, str], bytes] = OrderedDict()
        self.latency = metrics.FANOUT_LATENCY.labels(cache.syncer_type)

    def publish_threadsafe(self, seq: int) -> None:
        try:
            self.loop.call_soon_threadsafe(self._publish, seq)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    def _publish(self, seq: int) -> None:
        if seq <= self.published_seq:
            return
        self.published_seq = seq
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def batch(self, crumbs: list[Breadcrumb], compression: str) -> bytes:
        """`batch_frames(crumbs)`, shared: clients that are at the same place in the log
        (nearly all, most of the time) send the same bytes, encoded once."""
        key = (crumbs[0].seq, crumbs[-1].seq, compression)
        data = self._batches.get(key)
        if data is None:
            data = batch_frames(crumbs, compression)
            self._batches[key] = data
            while len(self._batches) > BATCH_CACHE_SIZE:
                self._batches.popitem(last=False)
        return data

    async def wait(self, timeout: float) -> None:
        """Until a new entry is published or `timeout` seconds pass."""
        waiter = self.loop.create_future()
        self._waiters.add(waiter)
        timer = self.loop.call_later(max(timeout, 0.0), _settle, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)


async def _within(awaitable: Any, timeout: float) -> Any:
    """`awaitable`'s result, or TimeoutError after `timeout` seconds. Unlike Python 3.11's
    `asyncio.wait_for`, a cancellation arriving as the awaitable completes is never
    swallowed (bpo-42130), so a connection's loops always stop when cancelled."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise TimeoutError
    return task.result()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Connection:
    """One client, from accept to close (see the module docstring)."""

    def __init__(self, server: TyphaServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.config = server.config
        self.reader = reader
        self.writer = writer
        self.peer = _peer_name(writer.get_extra_info("peername"))
        self.hostname = ""
        self.syncer_type = ""
        self.compression = COMPRESSION_NONE
        self.frames = FrameReader(CLIENT_MAX_FRAME_BYTES)
        self.decoder = MessageDecoder(CLIENT_MESSAGE_TYPES,
                                      max_message_bytes=CLIENT_MAX_FRAME_BYTES * 16)
        self.next_seq = 0
        self.counted = False
        self.pending = True  # accepted, hello not done yet (counted in server.pending_count)
        self.closed = False
        self.ending = False
        self.clock = server.clock
        self.deadline = self.clock() + self.config.handshake_timeout  # for TLS + hello

    def __str__(self) -> str:
        who = f"{self.hostname}@{self.peer}" if self.hostname else self.peer
        return f"client {who}" + (f" ({self.syncer_type})" if self.syncer_type else "")

    async def run(self) -> None:
        try:
            await self._serve()
        except _Disconnect as exc:
            self._drop(exc)
        except (_PeerClosed, ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            log.info("typha: %s disconnected (%s)", self, exc or type(exc).__name__)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug: this connection ends, the server goes on
            log.exception("typha: %s failed unexpectedly", self)
            self._drop(_Disconnect("internal", None, f"internal error: {exc!r}"))
        finally:
            self._close()

    # -- stages --

    async def _serve(self) -> None:
        if self.server.ssl_context is not None:
            await self._start_tls(self.server.ssl_context)
        sock = self.writer.get_extra_info("socket")
        if self.config.socket_send_buffer and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.socket_send_buffer)
        self.writer.transport.set_write_buffer_limits(high=self.config.max_send_buffer // 2)
        if self.config.tls is not None:
            refusal = self.config.tls.refusal(self.writer.get_extra_info("peercert"))
            if refusal:
                raise _Disconnect("unauthorized", ERR_NOT_AUTHORIZED, refusal)
        if self.server.client_count >= self.config.max_connections:
            raise _Disconnect("full", ERR_SERVER_FULL, f"the server already has "
                              f"{self.config.max_connections} clients (its limit)")
        fanout = await self._handshake()
        reading = asyncio.ensure_future(self._read_loop())
        writing = asyncio.ensure_future(self._write_loop(fanout))
        try:
            done, _ = await asyncio.wait({reading, writing},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.ending = True  # the loops also check it: a cancel can be lost (see _within)
            for task in (reading, writing):
                task.cancel()
            await asyncio.wait({reading, writing}, timeout=5)
        for task in done:
            error = task.exception()
            if error is not None:
                raise error

    async def _start_tls(self, context: ssl.SSLContext) -> None:
        """The TLS handshake, within what is left of the hello deadline. (Reading was
        paused at accept, see TyphaServer._accept; start_tls resumes it.)"""
        left = self.deadline - self.clock()
        try:
            # asyncio's own handshake timer a little later than ours: ours names the reason
            await _within(self.writer.start_tls(context, ssl_handshake_timeout=left + 1.0),
                          left)
        except TimeoutError:
            raise _Disconnect("hello-timeout", None, (
                f"no TLS handshake within {self.config.handshake_timeout:g} s of "
                "connecting")) from None
        except ssl.SSLError as exc:
            raise _Disconnect("tls", None, f"the TLS handshake failed: {exc}") from None

    async def _handshake(self) -> _Fanout:
        try:
            hello = await self._read_message(0.0, "client_hello", deadline=self.deadline)
        except _Disconnect as exc:
            if exc.reason == "ping-timeout":
                raise _Disconnect("hello-timeout", ERR_BAD_HELLO, (
                    f"no client_hello within {self.config.handshake_timeout:g} s of "
                    "connecting")) from None
            raise
        try:
            if hello["type"] != CLIENT_HELLO:
                raise ProtocolError(f"the first message must be client_hello, got "
                                    f"{hello['type']!r}", ERR_BAD_HELLO)
            version = require(hello, "protocol_version", int)
            if version not in SUPPORTED_PROTOCOL_VERSIONS:
                raise ProtocolError(
                    f"protocol version {version} is not supported; this server speaks "
                    f"version {', '.join(map(str, SUPPORTED_PROTOCOL_VERSIONS))}"[:300],
                    ERR_UNSUPPORTED_VERSION)
            hostname = hello.get("hostname")
            self.hostname = hostname[:253] if isinstance(hostname, str) else ""
            syncer_type = require(hello, "syncer_type", str)
            fanout = self.server.fanouts.get(syncer_type)
            if fanout is None:
                raise ProtocolError(
                    f"syncer type {syncer_type[:64]!r} is not served here; this server serves "
                    f"{', '.join(sorted(self.server.fanouts))}", ERR_UNKNOWN_SYNCER_TYPE)
            offered = hello.get("compression", [COMPRESSION_NONE])
            if not isinstance(offered, list):
                raise ProtocolError("client_hello message: field 'compression' must be a list "
                                    "of strings", ERR_BAD_HELLO)
        except ProtocolError as exc:
            code = exc.code if exc.code != ERR_MALFORMED else ERR_BAD_HELLO
            raise _Disconnect("handshake", code, str(exc)) from None
        compression = next((c for c in self.config.compression if c in offered),
                           COMPRESSION_NONE)
        self.syncer_type = syncer_type
        self.server.hello_done(self)
        self._write(encode_message(server_hello(syncer_type=syncer_type,
                                                compression=compression,
                                                server_version=SERVER_VERSION,
                                                protocol_version=version)))
        if compression != COMPRESSION_NONE:
            self._write(encode_message(decoder_restart(compression)))
            self.compression = compression
        self.counted = True
        metrics.CONNECTIONS_ACCEPTED.labels(syncer_type).inc()
        metrics.CONNECTIONS_ACTIVE.labels(syncer_type).inc()
        log.info("typha: %s connected (protocol %d, compression %s)", self, version,
                 compression)
        return fanout

    async def _read_loop(self) -> None:
        """After the hello only pongs may come; each must come within `pong_timeout`."""
        while not self.ending:
            message = await self._read_message(self.config.pong_timeout, "pong")
            if message["type"] != PONG:
                raise _Disconnect("malformed", ERR_MALFORMED,
                                  f"unexpected {message['type']!r} after the hello")
            sent = message.get("timestamp")
            if isinstance(sent, int | float) and not isinstance(sent, bool):
                metrics.PING_LATENCY.labels(self.syncer_type).observe(
                    max(self.clock() - sent, 0.0))

    async def _write_loop(self, fanout: _Fanout) -> None:
        loop = asyncio.get_running_loop()
        snapshot = fanout.cache.snapshot()
        frames = await loop.run_in_executor(None, snapshot.frames, self.compression)
        await self._write_all(frames)
        log.info("typha: %s got a snapshot of %d keys at update %d", self,
                 snapshot.kv_count, snapshot.seq)
        self.next_seq = snapshot.seq + 1
        batch_bytes = max(self.config.max_send_buffer // 4, 1)
        next_ping = self.clock() + self.config.ping_interval
        while not self.ending:
            upto = fanout.published_seq
            if upto >= self.next_seq:
                crumbs = fanout.cache.entries_after(self.next_seq - 1, upto,
                                                    max_bytes=batch_bytes)
                if crumbs is None:
                    raise _Disconnect("behind", ERR_TOO_SLOW, (
                        f"fell behind: its next update {self.next_seq} has left the update "
                        f"log (which now starts at {fanout.cache.oldest_seq()}); reconnect "
                        "for a fresh snapshot"))
                # batch: let the oldest unsent entry wait up to batch_delay for company,
                # unless the client already has half a log's worth of entries pending
                # (waiting could then let its next entry leave the log)
                wait = crumbs[0].created + self.config.batch_delay - self.clock()
                if (wait > 0 and sum(crumb.size for crumb in crumbs) < batch_bytes
                        and upto - self.next_seq < self.config.max_log_entries // 2):
                    await asyncio.sleep(wait)
                    continue
                await self._send_entries(fanout, crumbs)
                continue
            now = self.clock()
            if now >= next_ping:
                self._write(encode_message({"type": PING, "timestamp": now}, self.compression))
                await self._drain()
                next_ping = now + self.config.ping_interval
                continue
            await fanout.wait(next_ping - now)

    async def _send_entries(self, fanout: _Fanout, crumbs: list[Breadcrumb]) -> None:
        self._write(fanout.batch(crumbs, self.compression))
        await self._drain()
        # one observation per write: the latency of its oldest update (the batch's worst);
        # one per update would cost more than the fan-out itself with many clients
        oldest = next((crumb.created for crumb in crumbs if crumb.kv_count), None)
        if oldest is not None:
            fanout.latency.observe(max(self.clock() - oldest, 0.0))
        self.next_seq = crumbs[-1].seq + 1

    # -- I/O helpers --

    async def _read_message(self, timeout: float, expecting: str, *,
                            deadline: float | None = None) -> dict[str, Any]:
        """The next message: its header, then its payload, each within `timeout` seconds,
        or both before `deadline` (clock time) when given."""
        def left() -> float:
            return timeout if deadline is None else max(deadline - self.clock(), 0.0)

        try:
            header = await _within(self.reader.readexactly(FRAME_HEADER.size), left())
            (length,) = FRAME_HEADER.unpack(header)
            self.frames.check_length(length)
            payload = await _within(self.reader.readexactly(length), left())
            self.frames.frames_read += 1
            return self.decoder.decode(payload)
        except TimeoutError:
            raise _Disconnect("ping-timeout", ERR_PING_TIMEOUT,
                              f"no {expecting} within {timeout:g} s") from None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise _PeerClosed(f"closed in the middle of a frame ({len(exc.partial)} "
                                  f"of {exc.expected} bytes)") from None
            raise _PeerClosed("closed the connection") from None
        except ProtocolError as exc:
            raise _Disconnect("malformed", exc.code, str(exc)) from None

    def _write(self, data: bytes) -> None:
        """Queue bytes, refusing when the queue is already over the bound. Every write is
        followed by a drain (which waits while the queue is over half the bound), so the
        queue never holds more than the bound plus one write."""
        queued = self.writer.transport.get_write_buffer_size()
        if queued > self.config.max_send_buffer:
            raise _Disconnect("slow", ERR_TOO_SLOW, (
                f"send queue of {queued} bytes is over the bound of "
                f"{self.config.max_send_buffer}: the client does not read fast enough"))
        self.writer.write(data)

    async def _drain(self) -> None:
        transport = self.writer.transport
        if transport.get_write_buffer_size() == 0 and not transport.is_closing():
            return  # all taken by the kernel: nothing to wait for (the usual case)
        try:
            await _within(self.writer.drain(), self.config.write_timeout)
        except TimeoutError:
            raise _Disconnect("slow", ERR_TOO_SLOW, (
                f"the client did not read its queued "
                f"{self.writer.transport.get_write_buffer_size()} bytes within "
                f"{self.config.write_timeout:g} s (write timeout)")) from None

    async def _write_all(self, frames: list[bytes]) -> None:
        chunk: list[bytes] = []
        size = 0
        limit = max(self.config.max_send_buffer // 4, 1)
        for data in frames:
            chunk.append(data)
            size += len(data)
            if size >= limit:
                self._write(b"".join(chunk))
                await self._drain()
                chunk, size = [], 0
        if chunk:
            self._write(b"".join(chunk))
            await self._drain()

    # -- closing --

    def _drop(self, reason: _Disconnect) -> None:
        metrics.CONNECTIONS_DROPPED.labels(reason.reason).inc()
        level = logging.INFO if reason.reason == "shutdown" else logging.WARNING
        log.log(level, "typha: dropping %s: %s: %s", self, reason.reason, reason)
        if reason.code is None or self.writer.transport.is_closing():
            return
        if reason.reason in ("slow", "behind"):
            # its queue is full: an error message would only wait behind it
            self.writer.transport.abort()
            return
        try:
            self.writer.write(encode_message(error_message(reason.code, str(reason)),
                                             self.compression))
        except (ConnectionError, OSError, RuntimeError):
            pass

    def shutdown(self) -> None:
        """Server stopping: tell the client (it will reconnect elsewhere) and close."""
        if self.closed:
            return
        self._drop(_Disconnect("shutdown", ERR_SHUTDOWN, "the server is shutting down"))
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.hello_done(self)  # if it never got that far
        if self.counted:
            metrics.CONNECTIONS_ACTIVE.labels(self.syncer_type).dec()
        transport = self.writer.transport
        if transport.get_write_buffer_size() > self.config.max_send_buffer // 2:
            transport.abort()
        else:
            transport.close()
        self.server.forget(self)


def _peer_name(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(peer)


class TyphaServer:
    """See the module docstring. `start()` returns once listening; `stop()` undoes it all."""

    def __init__(self, syncer_factory: Callable[[str], Syncer], config: ServerConfig, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config.validate()
        self.config = config
        self.clock = clock
        self._syncer_factory = syncer_factory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: asyncio.Server | None = None
        self._syncers: list[Syncer] = []
        self._connections: set[_Connection] = set()
        self._running = threading.Event()
        self.caches: dict[str, SnapshotCache] = {}
        self.fanouts: dict[str, _Fanout] = {}
        self.address: tuple[str, int] = (config.host, config.port)
        self._stopped = False
        self.ssl_context: ssl.SSLContext | None = None
        self.pending_count = 0  # connections accepted, hello not done (loop thread only)
        self._rejected_unlogged = 0
        self._rejection_logged_at = float("-inf")
        self.health = HealthAggregator()
        self.health.register(HEALTH_SERVER, live=True, ready=True,
                             timeout=HEALTH_LIVENESS_TIMEOUT)
        for syncer_type in config.syncer_types:
            self.health.register(health_reporter_name(syncer_type), live=False, ready=True)
            self.health.report(health_reporter_name(syncer_type), live=True, ready=False)
        self._health_server: HealthServer | None = None
        self.health_address: tuple[str, int] | None = None

    # -- life cycle --

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("TyphaServer already started")
        ssl_context = self.config.tls.context() if self.config.tls is not None else None
        self.ssl_context = ssl_context
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run_loop, name="typha-server",
                                        daemon=True)
        self._thread.start()
        self._running.wait(10)
        try:
            for syncer_type in self.config.syncer_types:
                cache = SnapshotCache(
                    syncer_type, self.config.syncer_kinds[syncer_type],
                    secret_namespace=(secret_namespace() if syncer_type == SYNCER_TYPE_BGP
                                      else None),
                    max_log_entries=self.config.max_log_entries,
                    max_log_bytes=self.config.max_log_bytes,
                    snapshot_reuse_seconds=self.config.snapshot_reuse_seconds,
                    clock=self.clock)
                fanout = _Fanout(cache, loop)
                cache.on_publish = fanout.publish_threadsafe
                cache.on_status_change = self._syncer_status_reporter(syncer_type)
                self.caches[syncer_type] = cache
                self.fanouts[syncer_type] = fanout
            for syncer_type, cache in self.caches.items():
                syncer = self._syncer_factory(syncer_type)
                syncer.start(cache)
                self._syncers.append(syncer)
                metrics.DATASTORE_SYNCERS.inc()
            future = asyncio.run_coroutine_threadsafe(self._listen(), loop)
            future.result(timeout=30)
            if self.config.health_port is not None:
                try:
                    self._health_server = HealthServer(self.health, self.config.health_host,
                                                       self.config.health_port)
                except OSError as exc:
                    raise HealthListenError(
                        f"cannot serve health checks on {self.config.health_host}:"
                        f"{self.config.health_port}: {exc.strerror or exc}") from exc
                self._health_server.start()
                self.health_address = (self.config.health_host, self._health_server.port)
        except BaseException:
            self.stop()
            raise
        log.info("typha: serving %s on %s:%d (%s)", ", ".join(self.config.syncer_types),
                 *self.address, "TLS" if ssl_context else "plain TCP")

    def _run_loop(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._running.set)
        self._loop.run_forever()

    async def _listen(self) -> None:
        # plain TCP: a TLS connection starts TLS itself, once it is within the pending limit
        self._listener = await asyncio.start_server(
            self._accept, self.config.host, self.config.port, reuse_address=True,
            backlog=1024)
        sockname = self._listener.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        self._heartbeat()

    def _heartbeat(self) -> None:
        """Liveness from the event loop itself; ready while listening."""
        self.health.report(HEALTH_SERVER, live=True, ready=not self._stopped)
        if not self._stopped and self._loop is not None:
            self._loop.call_later(HEALTH_HEARTBEAT, self._heartbeat)

    def _syncer_status_reporter(self, syncer_type: str) -> Callable[[SyncStatus], None]:
        name = health_reporter_name(syncer_type)

        def report(status: SyncStatus) -> None:
            ready = status == SyncStatus.IN_SYNC
            self.health.report(name, live=True, ready=ready)
            log.info("typha: the %s syncer is %s: %s", syncer_type, status.value,
                     "ready" if ready else "not ready (clients keep what they have)")

        return report

    def is_ready(self) -> bool:
        """What /readiness answers: listening, and every syncer type in sync."""
        return self.health.is_ready()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # nothing may await before this: see the module docstring (TLS)
        if self._stopped:
            writer.transport.abort()
            return
        if self.pending_count >= self.config.max_pending_handshakes:
            self._refuse_pending(writer)
            return
        if self.ssl_context is not None:
            writer.transport.pause_reading()  # until start_tls hands the bytes to TLS
        connection = _Connection(self, reader, writer)
        self.pending_count += 1
        metrics.CONNECTIONS_PENDING.inc()
        self._connections.add(connection)
        await connection.run()

    def _refuse_pending(self, writer: asyncio.StreamWriter) -> None:
        """Over the pending-handshake limit: close at once (plain TCP: with an error)."""
        metrics.CONNECTIONS_DROPPED.labels("pending-limit").inc()
        limit = self.config.max_pending_handshakes
        self._rejected_unlogged += 1
        now = self.clock()
        if now - self._rejection_logged_at >= REJECTION_LOG_INTERVAL:
            log.warning("typha: refused %d connection(s) since the last such message "
                        "(the latest from %s): %d connections were already waiting for their "
                        "hello, the limit (max_pending_handshakes)", self._rejected_unlogged,
                        _peer_name(writer.get_extra_info("peername")), limit)
            self._rejection_logged_at = now
            self._rejected_unlogged = 0
        if self.ssl_context is not None:
            writer.transport.abort()  # no TLS yet: nothing we could say
            return
        writer.write(encode_message(error_message(ERR_SERVER_FULL, (
            f"the server already has {limit} connections waiting for their hello (its "
            "limit); try again later or another server"))))
        writer.transport.close()

    def hello_done(self, connection: _Connection) -> None:
        """`connection` is no longer pending (its hello was accepted, or it closed)."""
        if connection.pending:
            connection.pending = False
            self.pending_count -= 1
            metrics.CONNECTIONS_PENDING.dec()

    def forget(self, connection: _Connection) -> None:
        self._connections.discard(connection)

    @property
    def client_count(self) -> int:
        return sum(1 for c in self._connections if c.counted and not c.closed)

    def clients(self) -> list[dict[str, Any]]:
        """The connected clients (hostname, peer, syncer type, next update): for tests and
        debugging. Call from any thread."""
        return self._call(lambda: [
            {"hostname": c.hostname, "peer": c.peer, "syncer_type": c.syncer_type,
             "next_seq": c.next_seq} for c in self._connections if c.counted and not c.closed])

    def _call(self, function: Callable[[], Any]) -> Any:
        assert self._loop is not None

        async def run() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection (clients are told), stop the syncers."""
        if self._stopped:
            return
        self._stopped = True
        self.health.report(HEALTH_SERVER, live=True, ready=False)
        if self._health_server is not None:
            self._health_server.stop()
            self._health_server = None
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
            except Exception:  # a wedged loop must not keep the syncers running
                log.exception("typha: shutdown did not complete cleanly")
            loop.call_soon_threadsafe(loop.stop)
        for syncer in self._syncers:
            try:
                syncer.stop()
            finally:
                metrics.DATASTORE_SYNCERS.dec()
        self._syncers.clear()
        if self._thread is not None:
            self._thread.join(timeout)
        if loop is not None and not loop.is_running():
            loop.close()

    async def _shutdown(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for connection in list(self._connections):
            connection.shutdown()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._listener is not None:
            await asyncio.wait_for(self._listener.wait_closed(), 5)

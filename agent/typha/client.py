"""`TyphaSyncer`: a `Syncer` that reads a datastore through a Typha server.

Role: the backend for `--datastore typha://HOST:PORT[,HOST:PORT...]` (agent, confd, calc):
it connects to a Typha server, says hello (protocol version, hostname, syncer type,
compressions it can read), and turns the server's snapshot and deltas into `RawUpdate`s and
statuses on the usual `SyncerCallbacks`.

Inputs: addresses (or a `Discovery`), the syncer type ("felix" for the agent and calc,
"bgp" for confd), TLS settings, timeouts. Outputs: `on_updates`, `on_status`, `on_error`
from the syncer's thread; `failure` / `failed` once it gave up.

Connection attempts (per outage): the address list comes from discovery before the first
attempt (and again after each pass over it); attempts go round it in order (local-node
endpoints first, see `agent.typha.discovery`) with a jittered growing delay between them, at
most max(`min_attempts` (6), `attempts_per_address` (2) x addresses) of them. A refused
hello (unsupported version, syncer type not served, server full) counts as a failed
attempt; a server that does not speak this client's protocol version is logged as such,
naming the server tried next. When all fail, the syncer reports ONE DatastoreError listing
the addresses and the last error of each, sets `failed`, and its thread ends (the agent
should then exit, as Felix does when it cannot reach Typha).

Reconnecting (failing over to another replica) keeps the downstream state correct: the
syncer remembers the fingerprint of every value it emitted; a fresh snapshot emits only keys
whose value changed. Deletes for the keys the new server lacks (deleted while we were away)
wait until that server says `in-sync` after its snapshot: a replica whose own datastore
syncer is still listing sends a PARTIAL snapshot, and deleting what it lacks would delete
policy from the node until it caught up. Until then the client keeps every key it had and
only adds and updates (and passes on the deletes the server sends explicitly); at the
server's `in-sync` it deletes every emitted key neither the snapshot nor the updates since
held. Status goes back to RESYNC while this happens (never back to WAIT_FOR_DATASTORE once
data flowed) and is IN_SYNC only once the server's snapshot is complete and it is in sync.

Hostile or broken servers: every bad frame or message (bad length, bad JSON or zlib, a
message out of place, a malformed KV) raises ProtocolError inside `ClientConnection.feed`;
the syncer logs it, counts it (`pyfelix_typha_client_protocol_errors_total`), drops the
connection and reconnects after one retry delay (a broken server is not hammered). Frames
before the bad one take effect. Nothing else escapes a frame (tests/typha/test_typha_fuzz.py).
A bad frame arriving with a good server_hello is a broken session, not a failed attempt.

Timeouts: `read_timeout` (FELIX_TYPHAREADTIMEOUT, default 30 s): no message at all (the
server pings every 10 s) -> reconnect; `write_timeout` (FELIX_TYPHAWRITETIMEOUT, 10 s) for
the hello and pongs; `connect_timeout` for TCP + TLS + hello.

Structure: the protocol state lives in transport-free pieces, `check_server_hello`,
`ClientState` (what was emitted, across connections), `StreamFollower` (one connection's
snapshot, deltas and statuses) and `ClientConnection` (one connection's bytes -> those
pieces -> replies); `TyphaSyncer` drives a `ClientConnection` from a thread with a blocking
socket (the benchmark drives the same pieces from asyncio).

Easy to get wrong: decoding must follow `decoder_restart` frame by frame; a delete for a key
never emitted must not be forwarded (the validator would see an unknown delete); the end of
a snapshot is NOT the moment to delete what it lacks (the server's `in-sync` is); `stop()`
must unblock a thread stuck in `recv` (it shuts the socket down).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import ssl
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter

from pyfelix.agent.syncer.api import (
    DatastoreError,
    RawUpdate,
    ResourceKey,
    SyncerCallbacks,
    SyncStatus,
)
from pyfelix.agent.typha.discovery import (
    Discovery,
    DiscoveryError,
    StaticDiscovery,
    discovery_from_env,
    split_address,
)
from pyfelix.agent.typha.protocol import (
    COMPRESSION_NONE,
    DECODER_RESTART,
    DEFAULT_MAX_FRAME_BYTES,
    ERR_UNSUPPORTED_VERSION,
    ERROR,
    KNOWN_COMPRESSIONS,
    KVS,
    PING,
    PONG,
    PROTOCOL_VERSION,
    SERVER_HELLO,
    SERVER_MESSAGE_TYPES,
    SNAPSHOT_BEGIN,
    SNAPSHOT_END,
    STATUS,
    SUPPORTED_PROTOCOL_VERSIONS,
    FrameReader,
    MessageDecoder,
    ProtocolError,
    brief,
    client_hello,
    decode_kv,
    decode_status,
    encode_message,
    require,
)
from pyfelix.agent.typha.tls import ClientTLS, client_tls_from_env

log = logging.getLogger(__name__)

SOURCE = "typha"
CLIENT_VERSION = "pyfelix-typha-client/1"
RECV_BYTES = 256 * 1024

CLIENT_SESSIONS = Counter(
    "pyfelix_typha_client_sessions_total",
    "Number of sessions (successful hello exchanges) this process's Typha clients opened; "
    "more than one per client means reconnections.",
    ["syncer_type"],
)
CLIENT_CONNECT_FAILURES = Counter(
    "pyfelix_typha_client_connect_failures_total",
    "Number of failed attempts to connect to a Typha server (TCP, TLS or hello refused).",
    ["syncer_type"],
)
CLIENT_PROTOCOL_ERRORS = Counter(
    "pyfelix_typha_client_protocol_errors_total",
    "Number of connections to a Typha server this process's clients dropped because the "
    "server sent a bad frame or message (bad length, JSON or zlib; a message out of place; a "
    "malformed key/value). Each is logged with the reason; the client reconnects.",
    ["syncer_type"],
)
MAX_ERROR_TEXT = 500  # of a server's error message, in our logs and errors


class TyphaConfigError(ValueError):
    """Client settings that cannot work (bad address, bad FELIX_TYPHA* value)."""


class TyphaUnavailable(Exception):
    """Every connection attempt of a round failed."""


class _SessionLost(Exception):
    """The current connection ended (timeout, EOF, server error, protocol error)."""

    def __init__(self, message: str, *, protocol_error: bool = False) -> None:
        super().__init__(message)
        self.protocol_error = protocol_error


class HelloRefused(Exception):
    """The server answered the hello with an error, or with something unusable. `code` is
    the error code (ERR_UNSUPPORTED_VERSION also when the server_hello names a version this
    client does not speak); `detail` the reason without the "refused: " prefix."""

    def __init__(self, message: str, *, code: str | None = None,
                 detail: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.detail = detail or message


class _Stopped(Exception):
    pass


class _Session:
    """One connected socket and its protocol state (a `ClientConnection`)."""

    def __init__(self, sock: socket.socket, address: str, connection: ClientConnection, *,
                 read_timeout: float, write_timeout: float) -> None:
        self.sock = sock
        self.address = address
        self.connection = connection
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.settimeout(self.write_timeout)
            self.sock.sendall(encode_message(message))
        except TimeoutError:
            raise _SessionLost(f"could not send {message['type']} to {self.address} within "
                               f"{self.write_timeout:g} s (write timeout)") from None
        except OSError as exc:
            raise _SessionLost(f"sending {message['type']} to {self.address} failed: "
                               f"{exc}") from None

    def receive(self, timeout: float | None = None) -> bytes:
        """The next bytes; _SessionLost on timeout, EOF or socket error."""
        wait = self.read_timeout if timeout is None else timeout
        try:
            self.sock.settimeout(wait)
            data = self.sock.recv(RECV_BYTES)
        except TimeoutError:
            raise _SessionLost(f"no message from {self.address} for {wait:g} s "
                               "(read timeout)") from None
        except OSError as exc:
            raise _SessionLost(f"reading from {self.address} failed: {exc}") from None
        if not data:
            raise _SessionLost(f"{self.address} closed the connection")
        return data

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class TyphaSyncer:
    """See the module docstring."""

    def __init__(self, addresses: Sequence[str] = (), *, syncer_type: str = "felix",
                 hostname: str | None = None, discovery: Discovery | None = None,
                 tls: ClientTLS | None = None,
                 compression: Sequence[str] = KNOWN_COMPRESSIONS,
                 connect_timeout: float = 10.0, read_timeout: float = 30.0,
                 write_timeout: float = 10.0, min_attempts: int = 6,
                 attempts_per_address: int = 2, retry_initial: float = 0.2,
                 retry_max: float = 2.0, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 socket_receive_buffer: int | None = None,
                 protocol_version: int = PROTOCOL_VERSION,
                 rng: random.Random | None = None) -> None:
        if discovery is None:
            if not addresses:
                raise TyphaConfigError(
                    "no Typha address: give typha://HOST:PORT[,HOST:PORT...] or set "
                    "FELIX_TYPHAK8SSERVICENAME (and FELIX_TYPHAK8SNAMESPACE)")
            try:
                discovery = StaticDiscovery(addresses)
            except ValueError as exc:
                raise TyphaConfigError(str(exc)) from None
        unknown = [c for c in compression if c not in KNOWN_COMPRESSIONS]
        if unknown:
            raise TyphaConfigError(f"unknown compression {unknown}; known: "
                                   f"{', '.join(KNOWN_COMPRESSIONS)}")
        if min(connect_timeout, read_timeout, write_timeout) <= 0:
            raise TyphaConfigError("Typha timeouts must be positive")
        if tls is not None:
            tls.validate()
        self.discovery = discovery
        self.syncer_type = syncer_type
        self.hostname = hostname or os.environ.get("FELIX_FELIXHOSTNAME") or socket.gethostname()
        self.tls = tls
        self.compression = tuple(compression) or ("none",)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.min_attempts = min_attempts
        self.attempts_per_address = attempts_per_address
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.max_frame_bytes = max_frame_bytes
        self.socket_receive_buffer = socket_receive_buffer
        self.protocol_version = protocol_version
        self._rng = rng or random.Random()
        self._ssl_context = tls.context() if tls is not None else None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._thread: threading.Thread | None = None
        self._callbacks: SyncerCallbacks | None = None
        self._state: ClientState | None = None
        self.sessions = 0  # successful hello exchanges so far
        self.connected_to = ""  # address of the current session
        self.failed = threading.Event()
        self.failure: str | None = None

    # -- Syncer --

    def start(self, callbacks: SyncerCallbacks) -> None:
        if self._thread is not None:
            raise RuntimeError("TyphaSyncer already started")
        self._callbacks = callbacks
        self._state = ClientState(callbacks, self.syncer_type)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"typha-client:{self.syncer_type}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            session = self._session
        if session is not None:
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def disconnect(self) -> None:
        """Drop the current connection (it reconnects): for tests and operators."""
        with self._lock:
            session = self._session
        if session is not None:
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def emitted_keys(self) -> int:
        return len(self._state.emitted) if self._state is not None else 0

    # -- the thread --

    def _run(self) -> None:
        assert self._callbacks is not None and self._state is not None
        self._state.set_status(SyncStatus.WAIT_FOR_DATASTORE)
        while not self._stop.is_set():
            try:
                session = self._connect()
            except _Stopped:
                return
            except TyphaUnavailable as exc:
                self.failure = str(exc)
                log.error("typha client: %s", exc)
                self._callbacks.on_error(DatastoreError(SOURCE, str(exc)))
                self.failed.set()
                return
            try:
                self._follow(session)
            except _SessionLost as exc:
                if not self._stop.is_set():
                    log.warning("typha client (%s): connection to %s lost: %s; reconnecting",
                                self.syncer_type, session.address, exc)
                    self._state.connection_lost()
                    if exc.protocol_error:  # a broken server: do not hammer it
                        self._stop.wait(self._delay(1))
            except Exception as exc:  # a bug: report it, reconnect with a fresh snapshot
                log.exception("typha client failed unexpectedly")
                self._callbacks.on_error(DatastoreError(
                    SOURCE, f"typha client failed unexpectedly ({exc!r}); reconnecting"))
            finally:
                with self._lock:
                    self._session = None
                session.close()

    def _connect(self) -> _Session:
        errors: dict[str, str] = {}
        attempts = 0
        addresses: list[str] = []
        budget = self.min_attempts
        position = 0
        while attempts < budget:
            if self._stop.is_set():
                raise _Stopped
            if position >= len(addresses):
                position = 0
                try:
                    addresses = self.discovery.discover()
                except DiscoveryError as exc:
                    addresses = []
                    errors[self.discovery.description] = str(exc)
                budget = max(budget, self.attempts_per_address * len(addresses))
            attempts += 1
            if addresses:
                address = addresses[position]
                position += 1
                try:
                    return self._open(address)
                except _Stopped:
                    raise
                except (OSError, ssl.SSLError, HelloRefused, _SessionLost) as exc:
                    errors[address] = str(exc) or type(exc).__name__
                    CLIENT_CONNECT_FAILURES.labels(self.syncer_type).inc()
                    if isinstance(exc, HelloRefused) and exc.code == ERR_UNSUPPORTED_VERSION:
                        following = (f"trying {addresses[position % len(addresses)]} next"
                                     if attempts < budget else "no attempts left")
                        log.warning("typha client (%s): %s cannot serve this client (it does "
                                    "not speak protocol version %d): %s; %s (attempt %d of "
                                    "%d)", self.syncer_type, address, self.protocol_version,
                                    exc.detail, following, attempts, budget)
                    else:
                        log.warning("typha client (%s): attempt %d/%d at %s failed: %s",
                                    self.syncer_type, attempts, budget, address,
                                    errors[address])
            if attempts < budget and self._stop.wait(self._delay(attempts)):
                raise _Stopped
        detail = "; ".join(f"{where}: {error}" for where, error in errors.items())
        raise TyphaUnavailable(
            f"could not connect to Typha ({self.discovery.description}) for the "
            f"{self.syncer_type} syncer after {attempts} attempts; last errors: {detail}")

    def _delay(self, attempt: int) -> float:
        base = min(self.retry_max, self.retry_initial * 2 ** (attempt - 1))
        return base * self._rng.uniform(0.8, 1.2)

    def _open(self, address: str) -> _Session:
        host, port = split_address(address)
        raw = socket.create_connection((host, port), timeout=self.connect_timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.socket_receive_buffer:
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.socket_receive_buffer)
            sock: socket.socket = raw
            if self._ssl_context is not None and self.tls is not None:
                sock = self._ssl_context.wrap_socket(raw)
                refusal = self.tls.refusal(sock.getpeercert())
                if refusal:
                    raise HelloRefused(refusal)
        except BaseException:
            raw.close()
            raise
        assert self._state is not None
        connection = ClientConnection(self._state, address, syncer_type=self.syncer_type,
                                      offered=self.compression,
                                      max_frame_bytes=self.max_frame_bytes)
        session = _Session(sock, address, connection, read_timeout=self.read_timeout,
                           write_timeout=self.write_timeout)
        with self._lock:
            if self._stop.is_set():
                session.close()
                raise _Stopped
            self._session = session
        try:
            self._hello(session)
        except BaseException:
            with self._lock:
                self._session = None
            session.close()
            raise
        return session

    def _hello(self, session: _Session) -> None:
        session.send(client_hello(hostname=self.hostname, syncer_type=self.syncer_type,
                                  compression=self.compression,
                                  protocol_version=self.protocol_version,
                                  client_version=CLIENT_VERSION))
        deadline = time.monotonic() + self.connect_timeout
        while not session.connection.hello_done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _SessionLost(f"no server_hello from {session.address} within "
                                   f"{self.connect_timeout:g} s")
            self._feed(session, session.receive(left), until_hello=True)
        self.sessions += 1
        self.connected_to = session.address
        CLIENT_SESSIONS.labels(self.syncer_type).inc()
        log.info("typha client (%s): connected to %s (compression %s)", self.syncer_type,
                 session.address, session.connection.compression)

    def _follow(self, session: _Session) -> None:
        self._feed(session, b"")  # what came with the server_hello
        while not self._stop.is_set():
            try:
                data = session.receive()
            except _SessionLost:
                if self._stop.is_set():
                    return
                raise
            self._feed(session, data)

    def _feed(self, session: _Session, data: bytes, *, until_hello: bool = False) -> None:
        """Bytes from the server -> the connection's state; replies sent. A bad frame or an
        `error` from the server ends the session (_SessionLost); HelloRefused passes."""
        try:
            replies = session.connection.feed(data, until_hello=until_hello)
        except ProtocolError as exc:
            CLIENT_PROTOCOL_ERRORS.labels(self.syncer_type).inc()
            raise _SessionLost(f"protocol error from {session.address}: {exc}; dropping "
                               "the connection", protocol_error=True) from None
        except ServerClosed as exc:
            raise _SessionLost(str(exc)) from None
        for reply in replies:
            session.send(reply)


# --------------------------------------------------------------------------------------------
# The protocol state, shared by every transport (TyphaSyncer's threads, the benchmark's
# asyncio clients)


class ServerClosed(Exception):
    """The server sent an `error` message: it is closing the connection."""


def check_server_hello(reply: dict[str, Any], syncer_type: str,
                       offered: Sequence[str]) -> str:
    """The compression the server chose; HelloRefused when the reply is an error or does
    not fit what this client asked for."""
    if reply["type"] == ERROR:
        code = reply.get("code")
        detail = f"{_text(code)}: {_text(reply.get('message'))}"[:MAX_ERROR_TEXT]
        raise HelloRefused(f"refused: {detail}", code=code if isinstance(code, str) else None,
                           detail=detail)
    try:
        if reply["type"] != SERVER_HELLO:
            raise ProtocolError(f"expected server_hello, got {reply['type']!r}")
        version = require(reply, "protocol_version", int)
        answered = require(reply, "syncer_type", str)
        compression = require(reply, "compression", str)
    except ProtocolError as exc:
        raise HelloRefused(str(exc)) from None
    if version not in SUPPORTED_PROTOCOL_VERSIONS:
        raise HelloRefused(f"server speaks protocol version {version}; this client "
                           f"speaks {', '.join(map(str, SUPPORTED_PROTOCOL_VERSIONS))}"[:300],
                           code=ERR_UNSUPPORTED_VERSION)
    if answered != syncer_type:
        raise HelloRefused(f"server answered for syncer type {answered!r}; this "
                           f"client asked for {syncer_type!r}")
    if compression not in offered:
        raise HelloRefused(f"server chose compression {compression!r}, which this "
                           f"client did not offer ({', '.join(offered)})")
    return compression


def _text(value: Any) -> str:
    """A server's string field for our logs (anything else, briefly)."""
    return value[:MAX_ERROR_TEXT] if isinstance(value, str) else brief(value)


class ClientState:
    """What a client has told its callbacks, across connections: the fingerprint of every
    key's value, and the last status. Owned by one thread (or one event loop)."""

    def __init__(self, callbacks: SyncerCallbacks, syncer_type: str = "felix") -> None:
        self.callbacks = callbacks
        self.syncer_type = syncer_type
        self.emitted: dict[tuple[str, str, str], str] = {}  # key -> value fingerprint
        self.status: SyncStatus | None = None

    def set_status(self, status: SyncStatus) -> None:
        if status == self.status:
            return
        self.status = status
        self.callbacks.on_status(status)

    def server_status(self, status: SyncStatus) -> None:
        """A status the server sent, as our callbacks should see it: once data flowed
        (RESYNC or IN_SYNC reported), a server still waiting for its datastore means we are
        resyncing, not back at the start."""
        if status == SyncStatus.WAIT_FOR_DATASTORE and self.status in (SyncStatus.RESYNC,
                                                                        SyncStatus.IN_SYNC):
            status = SyncStatus.RESYNC
        self.set_status(status)

    def connection_lost(self) -> None:
        if self.status == SyncStatus.IN_SYNC:
            self.set_status(SyncStatus.RESYNC)

    def apply(self, entries: list[Any], seen: set[tuple[str, str, str]] | None,
              *, snapshot: bool | None = None) -> None:
        """KV entries of a `kvs` message -> on_updates with those that change something.
        `seen` (from a snapshot's start until the server is in sync) collects the keys the
        server has sent a value for. In a snapshot (`snapshot`, by default: `seen` given) a
        delete is a protocol error.

        A hot path (every client decodes every update): well-formed entries take a quick
        route; anything irregular goes through `decode_kv`, which names the entry and field
        (and accepts exactly what the quick route does: a fuzz test checks they agree).
        """
        if snapshot is None:
            snapshot = seen is not None
        updates: list[RawUpdate] = []
        try:
            self._apply(entries, seen, snapshot, updates)
        finally:
            # also when an entry was bad: the ones before it are remembered in `emitted`,
            # so they must reach the callbacks (or a reconnect would skip them as known)
            if updates:
                self.callbacks.on_updates(updates)

    def _apply(self, entries: list[Any], seen: set[tuple[str, str, str]] | None,
               snapshot: bool, updates: list[RawUpdate]) -> None:
        emitted = self.emitted
        for index, entry in enumerate(entries):
            try:
                key = entry["k"]
                kind, namespace, name = key
                value = entry["v"]
                fingerprint = entry.get("f")
                revision = entry.get("r", "")
                source = entry.get("s", "")
                regular = (type(key) is list and type(kind) is str and type(namespace) is str
                           and type(name) is str and kind != "" and name != ""
                           and type(revision) is str and type(source) is str
                           and (value is None or (type(value) is dict
                                                  and type(fingerprint) is str)))
            except (KeyError, TypeError, ValueError, AttributeError):
                regular = False
            if not regular:
                kv = decode_kv(entry, f"kvs message, entry {index}")  # raises if it must
                (kind, namespace, name), value, fingerprint, revision, source = kv
            key = (kind, namespace, name)
            if value is None:
                if snapshot:
                    raise ProtocolError(f"snapshot entry {index} ({kind} {name}) is a delete")
                if emitted.pop(key, None) is not None:
                    updates.append(RawUpdate(ResourceKey(kind, namespace, name), None, source,
                                             revision))
                continue
            if seen is not None:
                seen.add(key)
            known = emitted.get(key)
            if known == fingerprint:
                continue
            if known is None:  # a new key: share the few kind/namespace strings
                key = (sys.intern(kind), sys.intern(namespace), name)
            emitted[key] = fingerprint
            updates.append(RawUpdate(ResourceKey(kind, namespace, name), value, source,
                                     revision))

    def missing(self, seen: set[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """The emitted keys `seen` lacks."""
        return [key for key in self.emitted if key not in seen]

    def delete_missing(self, seen: set[tuple[str, str, str]], where: str = "") -> None:
        """After a complete snapshot from a server in sync: delete every emitted key that
        neither the snapshot nor the updates since held."""
        gone = self.missing(seen)
        for key in gone:
            del self.emitted[key]
        if gone:
            log.info("typha client (%s): %d keys are gone from the datastore (deleted while "
                     "this client was disconnected or following another server), as %s says "
                     "now that it is in sync; deleting them", self.syncer_type, len(gone),
                     where or "the server")
            self.callbacks.on_updates([RawUpdate(ResourceKey(*key), None, SOURCE)
                                       for key in sorted(gone)])


class StreamFollower:
    """One connection's messages after the hello -> `ClientState` (snapshot, deltas,
    statuses). `handle` returns a message to send back (a pong) or None; it raises
    ProtocolError for a message out of place and ServerClosed for an `error`.

    Resync: from `snapshot_begin` until the server reports `in-sync` after `snapshot_end`,
    `seen` collects every key the server sent a value for; only then are the emitted keys it
    lacks deleted. Before that the server may be a replica still listing its datastore."""

    def __init__(self, state: ClientState, where: str) -> None:
        self.state = state
        self.where = where
        self.in_snapshot = False
        self.snapshot_done = False
        self.seen: set[tuple[str, str, str]] | None = None  # None: no resync in progress
        self._told_kept = False

    @property
    def resyncing(self) -> bool:
        """Deletes of keys the server lacks are still waiting for its `in-sync`."""
        return self.seen is not None

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        kind = message["type"]
        if kind == KVS:
            if not (self.in_snapshot or self.snapshot_done):
                raise ProtocolError("kvs message before snapshot_begin")
            self.state.apply(require(message, "kvs", list), self.seen,
                             snapshot=self.in_snapshot)
        elif kind == SNAPSHOT_BEGIN:
            if self.in_snapshot or self.snapshot_done:
                raise ProtocolError("a second snapshot_begin on one connection")
            self.in_snapshot = True
            self.seen = set()
            self.state.connection_lost()  # in sync before: resyncing now
        elif kind == SNAPSHOT_END:
            if not self.in_snapshot:
                raise ProtocolError("snapshot_end without snapshot_begin")
            self.in_snapshot, self.snapshot_done = False, True
        elif kind == STATUS:
            if not self.snapshot_done:
                raise ProtocolError("status message before the snapshot completed")
            status = decode_status(message)
            if self.seen is not None:
                if status == SyncStatus.IN_SYNC:
                    self.state.delete_missing(self.seen, self.where)
                    self.seen = None
                elif not self._told_kept:
                    self._told_kept = True
                    kept = len(self.state.missing(self.seen))
                    if kept:
                        log.warning(
                            "typha client (%s): %s is not in sync with its datastore yet "
                            "(%s); keeping the %d keys its snapshot lacks until it is",
                            self.state.syncer_type, self.where, status.value, kept)
            self.state.server_status(status)
        elif kind == PING:
            # echo a number only: the server measures latency with it, and echoing any
            # structure would let a server make us encode (and recurse into) anything
            stamp = message.get("timestamp")
            if not isinstance(stamp, int | float) or isinstance(stamp, bool):
                stamp = None
            return {"type": PONG, "timestamp": stamp}
        elif kind == ERROR:
            raise ServerClosed(f"server closed the connection: {_text(message.get('code'))}: "
                               f"{_text(message.get('message'))}"[:MAX_ERROR_TEXT])
        elif kind != DECODER_RESTART:
            raise ProtocolError(f"unexpected {kind!r} message after the hello")
        return None


class ClientConnection:
    """One connection's protocol without its socket: the bytes the server sends go in
    (`feed`, in any chunks), the replies to send (pongs) come out. The first message must be
    an acceptable `server_hello` (`check_server_hello`); the rest go to a `StreamFollower`.

    `feed` raises only ProtocolError (a bad frame or message: drop the connection),
    HelloRefused (the first message refuses or does not fit our hello) and ServerClosed (an
    `error` after the hello). Frames are decoded and handled one at a time, in order: the
    frames before a bad one take effect."""

    def __init__(self, state: ClientState, where: str, *, syncer_type: str,
                 offered: Sequence[str], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
                 ) -> None:
        self.state = state
        self.where = where
        self.syncer_type = syncer_type
        self.offered = tuple(offered)
        self.frames = FrameReader(max_frame_bytes)
        self.decoder = MessageDecoder(SERVER_MESSAGE_TYPES,
                                      max_message_bytes=max_frame_bytes * 8)
        self.follower: StreamFollower | None = None
        self.compression = COMPRESSION_NONE  # what the server_hello announced

    @property
    def hello_done(self) -> bool:
        return self.follower is not None

    def feed(self, data: bytes = b"", *, until_hello: bool = False) -> list[dict[str, Any]]:
        """`until_hello`: stop after the server_hello, leaving later frames buffered (the
        next `feed` handles them): a bad frame after a good hello is a broken session, not
        a failed connection attempt."""
        replies: list[dict[str, Any]] = []
        self.frames.push(data)
        while (payload := self.frames.pop()) is not None:
            message = self.decoder.decode(payload)  # a decoder_restart affects the next one
            if self.follower is None:
                self.compression = check_server_hello(message, self.syncer_type, self.offered)
                self.follower = StreamFollower(self.state, self.where)
                if until_hello:
                    break
                continue
            reply = self.follower.handle(message)
            if reply is not None:
                replies.append(reply)
        return replies


# --------------------------------------------------------------------------------------------
# The factory for `--datastore typha://...`


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise TyphaConfigError(f"{name}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise TyphaConfigError(f"{name}={text!r} must be positive")
    return value


def make_typha_syncer(endpoints: Sequence[str], *, env: Mapping[str, str] | None = None,
                      **options: Any) -> TyphaSyncer:
    """The syncer for `--datastore typha://HOST:PORT[,...]` (endpoints as parsed from the
    URL; empty means discover: FELIX_TYPHAADDR, else FELIX_TYPHAK8SSERVICENAME).

    Settings come from Calico's environment variables unless given in `options`:
    FELIX_TYPHACAFILE / FELIX_TYPHACERTFILE / FELIX_TYPHAKEYFILE / FELIX_TYPHACN /
    FELIX_TYPHAURISAN (TLS), FELIX_TYPHAREADTIMEOUT, FELIX_TYPHAWRITETIMEOUT,
    FELIX_FELIXHOSTNAME (hostname, which also orders Kubernetes endpoints). confd passes
    `syncer_type="bgp"`. Raises TyphaConfigError (a ValueError) for unusable settings.
    """
    env = os.environ if env is None else env
    hostname = options.pop("hostname", None) or env.get("FELIX_FELIXHOSTNAME") \
        or socket.gethostname()
    if "tls" not in options:
        try:
            options["tls"] = client_tls_from_env(env)
        except ValueError as exc:
            raise TyphaConfigError(str(exc)) from None
    options.setdefault("read_timeout", _seconds(env, "FELIX_TYPHAREADTIMEOUT", 30.0))
    options.setdefault("write_timeout", _seconds(env, "FELIX_TYPHAWRITETIMEOUT", 10.0))
    if not endpoints and "discovery" not in options:
        discovery = discovery_from_env(env, node_name=hostname)
        if discovery is None:
            raise TyphaConfigError("typha:// names no HOST:PORT and neither FELIX_TYPHAADDR "
                                   "nor FELIX_TYPHAK8SSERVICENAME is set")
        options["discovery"] = discovery
    return TyphaSyncer(list(endpoints), hostname=hostname, **options)

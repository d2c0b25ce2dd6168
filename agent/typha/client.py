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
attempt. When all fail, the syncer reports ONE DatastoreError listing the addresses and the
last error of each, sets `failed`, and its thread ends (the agent should then exit, as Felix
does when it cannot reach Typha).

Reconnecting keeps the downstream state correct: the syncer remembers the fingerprint of
every value it emitted; a fresh snapshot emits only keys whose value changed, then (at
`snapshot_end`) a delete for every emitted key the snapshot lacks (deletes missed while
disconnected). Status goes back to RESYNC while this happens, and never reports IN_SYNC
before the snapshot is complete.

Timeouts: `read_timeout` (FELIX_TYPHAREADTIMEOUT, default 30 s): no message at all (the
server pings every 10 s) -> reconnect; `write_timeout` (FELIX_TYPHAWRITETIMEOUT, 10 s) for
the hello and pongs; `connect_timeout` for TCP + TLS + hello.

Structure: the protocol state lives in transport-free pieces, `check_server_hello`,
`ClientState` (what was emitted, across connections) and `StreamFollower` (one connection's
snapshot and deltas); `TyphaSyncer` drives them from a thread with a blocking socket (the
benchmark drives the same pieces from asyncio).

Easy to get wrong: decoding must follow `decoder_restart` frame by frame; a delete for a key
never emitted must not be forwarded (the validator would see an unknown delete); `stop()`
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
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import Counter

from agent.syncer.api import DatastoreError, RawUpdate, ResourceKey, SyncerCallbacks, SyncStatus
from agent.typha.discovery import (
    Discovery,
    DiscoveryError,
    StaticDiscovery,
    discovery_from_env,
    split_address,
)
from agent.typha.protocol import (
    DECODER_RESTART,
    DEFAULT_MAX_FRAME_BYTES,
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
    client_hello,
    decode_kv,
    decode_status,
    encode_message,
    require,
)
from agent.typha.tls import ClientTLS, client_tls_from_env

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


class TyphaConfigError(ValueError):
    """Client settings that cannot work (bad address, bad FELIX_TYPHA* value)."""


class TyphaUnavailable(Exception):
    """Every connection attempt of a round failed."""


class _SessionLost(Exception):
    """The current connection ended (timeout, EOF, server error, protocol error)."""


class HelloRefused(Exception):
    """The server answered the hello with an error, or with something unusable."""


class _Stopped(Exception):
    pass


class _Session:
    """One connected socket, its framing state, and what the server said in its hello."""

    def __init__(self, sock: socket.socket, address: str, *, max_frame_bytes: int,
                 read_timeout: float, write_timeout: float) -> None:
        self.sock = sock
        self.address = address
        self.frames = FrameReader(max_frame_bytes)
        self.decoder = MessageDecoder(SERVER_MESSAGE_TYPES,
                                      max_message_bytes=max_frame_bytes * 8)
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.compression = "none"
        self._pending: list[dict[str, Any]] = []

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

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message; _SessionLost on timeout, EOF, socket or protocol error."""
        while not self._pending:
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
            try:
                # decode in order: a decoder_restart changes how the next payload is read
                self._pending.extend(self.decoder.decode(p) for p in self.frames.feed(data))
            except ProtocolError as exc:
                raise _SessionLost(f"protocol error from {self.address}: {exc}") from None
        return self._pending.pop(0)

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
                    log.warning("typha client (%s): attempt %d/%d at %s failed: %s",
                                self.syncer_type, attempts, budget, address, errors[address])
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
        session = _Session(sock, address, max_frame_bytes=self.max_frame_bytes,
                           read_timeout=self.read_timeout, write_timeout=self.write_timeout)
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
        reply = session.receive(self.connect_timeout)
        session.compression = check_server_hello(reply, self.syncer_type, self.compression)
        self.sessions += 1
        self.connected_to = session.address
        CLIENT_SESSIONS.labels(self.syncer_type).inc()
        log.info("typha client (%s): connected to %s (compression %s)", self.syncer_type,
                 session.address, session.compression)

    def _follow(self, session: _Session) -> None:
        assert self._state is not None
        follower = StreamFollower(self._state, session.address)
        while not self._stop.is_set():
            try:
                message = session.receive()
            except _SessionLost:
                if self._stop.is_set():
                    return
                raise
            try:
                reply = follower.handle(message)
            except ProtocolError as exc:
                raise _SessionLost(f"protocol error from {session.address}: {exc}") from None
            except ServerClosed as exc:
                raise _SessionLost(str(exc)) from None
            if reply is not None:
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
        raise HelloRefused(f"refused: {reply.get('code')}: {reply.get('message')}")
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
                           f"speaks {', '.join(map(str, SUPPORTED_PROTOCOL_VERSIONS))}")
    if answered != syncer_type:
        raise HelloRefused(f"server answered for syncer type {answered!r}; this "
                           f"client asked for {syncer_type!r}")
    if compression not in offered:
        raise HelloRefused(f"server chose compression {compression!r}, which this "
                           f"client did not offer ({', '.join(offered)})")
    return compression


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

    def connection_lost(self) -> None:
        if self.status == SyncStatus.IN_SYNC:
            self.set_status(SyncStatus.RESYNC)

    def apply(self, entries: list[Any], seen: set[tuple[str, str, str]] | None) -> None:
        """KV entries of a `kvs` message -> on_updates with those that change something.
        `seen` (during a snapshot) collects the keys the snapshot holds.

        A hot path (every client decodes every update): well-formed entries take a quick
        route; anything irregular goes through `decode_kv`, which names the entry and field.
        """
        updates: list[RawUpdate] = []
        emitted = self.emitted
        for index, entry in enumerate(entries):
            try:
                kind, namespace, name = entry["k"]
                value = entry["v"]
                fingerprint = entry.get("f")
                revision = entry.get("r", "")
                source = entry.get("s", "")
                regular = (type(kind) is str and type(namespace) is str and type(name) is str
                           and kind != "" and name != "" and type(revision) is str
                           and type(source) is str
                           and (value is None or (type(value) is dict
                                                  and type(fingerprint) is str)))
            except (KeyError, TypeError, ValueError, AttributeError):
                regular = False
            if not regular:
                kv = decode_kv(entry, f"kvs message, entry {index}")  # raises if it must
                (kind, namespace, name), value, fingerprint, revision, source = kv
            key = (kind, namespace, name)
            if seen is not None:
                if value is None:
                    raise ProtocolError(f"snapshot entry {index} ({kind} {name}) is a delete")
                seen.add(key)
            if value is None:
                if emitted.pop(key, None) is not None:
                    updates.append(RawUpdate(ResourceKey(kind, namespace, name), None, source,
                                             revision))
                continue
            known = emitted.get(key)
            if known == fingerprint:
                continue
            if known is None:  # a new key: share the few kind/namespace strings
                key = (sys.intern(kind), sys.intern(namespace), name)
            emitted[key] = fingerprint
            updates.append(RawUpdate(ResourceKey(kind, namespace, name), value, source,
                                     revision))
        if updates:
            self.callbacks.on_updates(updates)

    def delete_missing(self, seen: set[tuple[str, str, str]]) -> None:
        """After a snapshot: delete every emitted key the snapshot lacked."""
        gone = [key for key in self.emitted if key not in seen]
        for key in gone:
            del self.emitted[key]
        if gone:
            log.info("typha client (%s): %d keys vanished while disconnected; deleting them",
                     self.syncer_type, len(gone))
            self.callbacks.on_updates([RawUpdate(ResourceKey(*key), None, SOURCE)
                                       for key in sorted(gone)])


class StreamFollower:
    """One connection's messages after the hello -> `ClientState` (snapshot, deltas,
    statuses). `handle` returns a message to send back (a pong) or None; it raises
    ProtocolError for a message out of place and ServerClosed for an `error`."""

    def __init__(self, state: ClientState, where: str) -> None:
        self.state = state
        self.where = where
        self.in_snapshot = False
        self.snapshot_done = False
        self.seen: set[tuple[str, str, str]] = set()

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        kind = message["type"]
        if kind == KVS:
            if not (self.in_snapshot or self.snapshot_done):
                raise ProtocolError("kvs message before snapshot_begin")
            self.state.apply(require(message, "kvs", list),
                             self.seen if self.in_snapshot else None)
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
            self.state.delete_missing(self.seen)
            self.seen = set()
        elif kind == STATUS:
            if not self.snapshot_done:
                raise ProtocolError("status message before the snapshot completed")
            self.state.set_status(decode_status(message))
        elif kind == PING:
            return {"type": PONG, "timestamp": message.get("timestamp")}
        elif kind == ERROR:
            raise ServerClosed(f"server closed the connection: {message.get('code')}: "
                               f"{message.get('message')}")
        elif kind != DECODER_RESTART:
            raise ProtocolError(f"unexpected {kind!r} message after the hello")
        return None


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

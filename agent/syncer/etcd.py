"""The etcd3 datastore syncer: list at a revision, then watch from the next one.

Role: implements `agent.syncer.api.Syncer` for `--datastore etcd3://HOST:PORT[,...]`,
reading Calico's v3 key layout (`agent.syncer.etcd_keys`) under `/calico/resources/v3/`.

Inputs: an `EtcdConfig` (endpoints, TLS, request timeout). Outputs, from the syncer thread:
`RawUpdate`s (source = the etcd key, revision = the key's mod revision), statuses and
`DatastoreError`s for values that are not a valid document at their key.

How it follows etcd:
1. List: range the whole prefix in pages, every page at the revision R of the first, and
   send the difference from what was sent before (updates for keys whose mod revision
   changed, deletes for keys that vanished; nothing for unchanged keys).
2. Watch the prefix from R + 1 and send each watch response's events as one batch.
3. The watch cannot start because R was compacted, or etcd cancels it with a compact
   revision (the watcher fell behind the compaction) -> relist (step 1) and watch again.
4. The connection is lost (an RPC fails, the stream breaks, the member lost its quorum and
   cancelled the watch (require-leader, see etcd_conn), or the liveness probe gets no
   answer: after `liveness_interval` s of silence the syncer asks etcd for a progress
   response and gives up after `liveness_timeout` s more) -> status RESYNC, jittered
   backoff, reconnect to the next endpoint in turn, and resume the watch from the last
   revision seen. etcd replays everything since, so nothing is relisted.
   To know when that replay has caught up, the syncer reads the KEYS (no values) under
   the prefix at the watch's creation revision H: keys modified after the last revision
   it had seen, and sent keys that are gone, must all be seen in the replay; once they
   are, status goes back to IN_SYNC.

Every list after the first is counted in `pyfelix_datastore_resyncs_total{backend="etcd3",
reason}` (compacted, or error for an unexpected failure); a reconnect is not.

Statuses: WAIT_FOR_DATASTORE until the first list succeeds, RESYNC during a list and while
catching up after a reconnect, IN_SYNC otherwise; never the same status twice in a row.

Invariants: a key's updates are sent in revision order, at most once per revision; a value
that is not valid JSON, breaks an input limit (`agent.inputs.decode_json_document`: size,
depth, duplicate keys...), or holds a document whose kind/namespace/name disagree with its
key, is reported as a `DatastoreError` and handled as a delete of that key (etcd holds no
valid resource there); keys under the prefix that are not in the layout (Calico kinds
pyfelix does not use) are ignored. Like an update, a rejected value is reported (logged, counted in
`pyfelix_datastore_parse_errors_total`, sent to `on_error`) once per revision: a relist
finding it unchanged says nothing again.

Easy to get wrong: a relist must compare with what was SENT (and with what was REJECTED),
not re-send or re-report everything; the pages of a list must share one revision or a
concurrent write can be missed; a key created and deleted while the syncer was
disconnected (after every change it waits for) may still be replayed, as a put then its
delete, just after IN_SYNC.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from pyfelix.agent.syncer.api import (
    DatastoreError,
    RawUpdate,
    ResourceKey,
    SyncerCallbacks,
    SyncStatus,
)
from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.etcd_conn import (
    EndpointRotation,
    EtcdCompacted,
    EtcdConfig,
    EtcdConnection,
    EtcdError,
    WatchStream,
)
from pyfelix.agent.syncer.etcd_keys import ETCD_ROOT, EtcdKeyError, decode_value, parse_etcd_key
from pyfelix.agent.syncer.metrics import (
    DATASTORE_PARSE_ERRORS,
    DATASTORE_RESYNCS,
    RESYNC_COMPACTED,
    RESYNC_ERROR,
)

log = logging.getLogger(__name__)

BACKEND = "etcd3"
DELETE_EVENT = 1  # mvccpb.Event.DELETE

ETCD_RELISTS = Counter(
    "pyfelix_etcd_relists_total",
    "Number of times the etcd syncer listed every resource again because the revision it "
    "was watching from had been compacted (the first list at start is not counted).",
)
ETCD_RECONNECTS = Counter(
    "pyfelix_etcd_reconnects_total",
    "Number of times the etcd syncer lost its connection to etcd (a request failed, the "
    "watch stream broke, or etcd stopped answering the liveness probe) and reconnected.",
)


for _reason in (RESYNC_COMPACTED, RESYNC_ERROR):  # exported as 0 until the first one
    DATASTORE_RESYNCS.labels(backend=BACKEND, reason=_reason)


class _LivenessTimeout(EtcdError):
    """etcd did not answer a progress request in time."""


@dataclass(frozen=True)
class _Sent:
    key: ResourceKey
    mod_revision: int


class _CatchUp:
    """What a resumed watch must still replay before the syncer is back in sync."""

    def __init__(self, puts: dict[bytes, int], deletes: set[bytes]) -> None:
        self.puts = puts  # etcd key -> the mod revision it has at the watch's start
        self.deletes = deletes  # sent keys that no longer exist there

    def observe(self, path: bytes, revision: int) -> None:
        wanted = self.puts.get(path)
        if wanted is not None and revision >= wanted:
            del self.puts[path]
        self.deletes.discard(path)  # its delete, or anything after it, has been replayed

    @property
    def done(self) -> bool:
        return not self.puts and not self.deletes


class EtcdSyncer:
    """List + watch of the etcd v3 resource prefix (see module docstring)."""

    def __init__(self, config: EtcdConfig, *, prefix: str = ETCD_ROOT, page_size: int = 1000,
                 backoff: Backoff | None = None, liveness_interval: float = 5.0,
                 liveness_timeout: float = 5.0) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.config = config
        self._prefix = prefix.encode()
        self._page_size = page_size
        self._backoff = backoff or Backoff()
        self._liveness_interval = liveness_interval
        self._liveness_timeout = liveness_timeout
        self._endpoints = EndpointRotation(config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: SyncerCallbacks | None = None
        self._lock = threading.Lock()
        self._connection: EtcdConnection | None = None
        self._stream: WatchStream | None = None
        # State owned by the syncer thread:
        self._sent: dict[bytes, _Sent] = {}
        # keys whose value at this mod revision was reported as unusable (not in _sent)
        self._rejected: dict[bytes, int] = {}
        self._revision = 0  # every change up to this revision has been sent
        self._listed = False
        self._status: SyncStatus | None = None

    # -- Syncer interface --

    def start(self, callbacks: SyncerCallbacks) -> None:
        if self._thread is not None:
            raise RuntimeError("EtcdSyncer already started")
        self._callbacks = callbacks
        self._thread = threading.Thread(target=self._run, name="etcd-syncer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._stream is not None:
                self._stream.close()
        if self._thread is not None:
            self._thread.join(timeout=self.config.request_timeout + 5.0)

    @property
    def revision(self) -> int:
        """The revision up to which every change has been sent (for tests and debug)."""
        return self._revision

    @property
    def endpoint(self) -> str:
        """The endpoint the syncer is connected to, or will try next (for tests and debug)."""
        return self._endpoints.current

    # -- thread body --

    def _run(self) -> None:
        self._set_status(SyncStatus.WAIT_FOR_DATASTORE)
        while not self._stop.is_set():
            try:
                self._connect()
                if not self._listed:
                    self._list()
                self._watch()
            except EtcdCompacted as exc:
                log.info("etcd revision %d was compacted (%s); listing again",
                         self._revision, exc)
                ETCD_RELISTS.inc()
                DATASTORE_RESYNCS.labels(backend=BACKEND, reason=RESYNC_COMPACTED).inc()
                self._listed = False
            except EtcdError as exc:
                if self._stop.is_set():
                    break
                self._connection_lost(exc)
            except Exception as exc:  # a bug: report, back off, start over from a list
                log.exception("etcd syncer failed unexpectedly")
                assert self._callbacks is not None
                self._callbacks.on_error(DatastoreError(
                    self.config.description, f"etcd syncer failed unexpectedly ({exc!r}); "
                                             "listing again"))
                if self._listed:
                    DATASTORE_RESYNCS.labels(backend=BACKEND, reason=RESYNC_ERROR).inc()
                self._listed = False
                self._disconnect()
                self._stop.wait(self._backoff.failed())
        self._disconnect()

    def _connect(self) -> None:
        if self._connection is None:
            self._connection = self._endpoints.connect()

    def _disconnect(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connection_lost(self, exc: EtcdError) -> None:
        ETCD_RECONNECTS.inc()
        self._disconnect()
        self._endpoints.advance()
        delay = self._backoff.failed()
        log.warning("%s; reconnecting to %s in %.2f s", exc, self._endpoints.current, delay)
        if self._listed:
            self._set_status(SyncStatus.RESYNC)
        self._stop.wait(delay)

    def _set_status(self, status: SyncStatus) -> None:
        if status is not self._status:
            self._status = status
            assert self._callbacks is not None
            self._callbacks.on_status(status)

    # -- listing --

    def _list(self) -> None:
        assert self._connection is not None
        seen: set[bytes] = set()
        list_revision = 0
        for page_revision, kvs in self._connection.range_pages(self._prefix,
                                                               page_size=self._page_size):
            if not list_revision:  # etcd answered: no longer waiting for the datastore
                self._set_status(SyncStatus.RESYNC)
            list_revision = page_revision
            updates: list[RawUpdate] = []
            for kv in kvs:
                seen.add(kv.key)
                sent = self._sent.get(kv.key)
                if sent is not None and sent.mod_revision == kv.mod_revision:
                    continue  # sent already
                if sent is None and self._rejected.get(kv.key) == kv.mod_revision:
                    continue  # reported already
                updates.extend(self._put(kv.key, kv.value, kv.mod_revision))
            self._emit(updates)
        gone = [path for path in self._sent if path not in seen]
        self._emit([update for path in sorted(gone)
                    for update in self._delete(path, list_revision)])
        for path in [path for path in self._rejected if path not in seen]:
            del self._rejected[path]
        self._revision = list_revision
        self._listed = True
        self._backoff.succeeded()
        self._set_status(SyncStatus.IN_SYNC)

    # -- watching --

    def _watch(self) -> None:
        assert self._connection is not None
        stream = self._connection.watch(self._prefix, self._revision + 1)
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        try:
            self._follow(stream)
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def _follow(self, stream: WatchStream) -> None:
        created = self._receive(stream)
        while created is None or not created.created:
            if self._stop.is_set():
                return
            if created is not None:
                self._handle(created, None)
            created = self._receive(stream)
        if created.compact_revision:
            raise EtcdCompacted(f"watch from revision {self._revision + 1} refused",
                                created.compact_revision)
        if created.canceled:
            raise EtcdError(f"etcd refused the watch: {created.cancel_reason}")
        self._backoff.succeeded()
        catch_up = _CatchUp({}, set())
        if self._status is not SyncStatus.IN_SYNC:  # resumed after a reconnect
            catch_up = self._catch_up(int(created.header.revision))
            if catch_up.done:
                self._set_status(SyncStatus.IN_SYNC)
        while not self._stop.is_set():
            response = self._receive(stream)
            if response is not None:
                self._handle(response, catch_up)
                if catch_up.done:
                    self._set_status(SyncStatus.IN_SYNC)

    def _receive(self, stream: WatchStream) -> Any | None:
        """The next watch response; probes liveness after `liveness_interval` s of silence.

        Returns None only when stopping or after a progress response (nothing to do).
        """
        response = stream.receive(self._liveness_interval)
        if response is not None or self._stop.is_set():
            return response
        stream.request_progress()
        response = stream.receive(self._liveness_timeout)
        if response is None and not self._stop.is_set():
            raise _LivenessTimeout(f"etcd {stream.endpoint} did not answer a progress "
                                   f"request within {self._liveness_timeout} s")
        return response

    def _catch_up(self, watch_revision: int) -> _CatchUp:
        """After a reconnect: which replayed events the syncer still needs (see module doc)."""
        if watch_revision <= self._revision:
            return _CatchUp({}, set())
        assert self._connection is not None
        current: dict[bytes, int] = {}
        for _, kvs in self._connection.range_pages(self._prefix, revision=watch_revision,
                                                   page_size=self._page_size,
                                                   keys_only=True):
            for kv in kvs:
                current[kv.key] = int(kv.mod_revision)
        # Every event under the prefix is replayed (and observed), ours or not.
        puts = {path: mod for path, mod in current.items() if mod > self._revision}
        deletes = {path for path in self._sent if path not in current}
        return _CatchUp(puts, deletes)

    def _handle(self, response: Any, catch_up: _CatchUp | None) -> None:
        if response.compact_revision:
            raise EtcdCompacted(f"watch canceled at compact revision "
                                f"{response.compact_revision}", response.compact_revision)
        if response.canceled:
            raise EtcdError(f"etcd canceled the watch: {response.cancel_reason or 'no reason'}")
        updates: list[RawUpdate] = []
        for event in response.events:
            kv = event.kv
            revision = int(kv.mod_revision)
            if revision <= self._revision:
                continue  # already sent (a replay overlapping the list)
            if event.type == DELETE_EVENT:
                updates.extend(self._delete(kv.key, revision))
            else:
                updates.extend(self._put(kv.key, kv.value, revision))
            if catch_up is not None:
                catch_up.observe(kv.key, revision)
        self._emit(updates)
        if response.events:
            self._revision = max(self._revision, max(int(e.kv.mod_revision)
                                                     for e in response.events))

    # -- turning keys and values into updates --

    def _put(self, path: bytes, value: bytes, revision: int) -> list[RawUpdate]:
        source = path.decode("utf-8", "replace")
        try:
            key = parse_etcd_key(source)
        except EtcdKeyError as exc:
            return self._reject(path, revision, str(exc))
        if key is None:  # not ours
            return self._delete(path, revision)
        try:
            doc = decode_value(source, key, value)
        except ValueError as exc:
            return self._reject(path, revision, f"{exc}; handled as a delete")
        self._rejected.pop(path, None)
        self._sent[path] = _Sent(key, revision)
        return [RawUpdate(key, doc, source, str(revision))]

    def _reject(self, path: bytes, revision: int, message: str) -> list[RawUpdate]:
        """Report an unusable key or value; what was sent for the key before is deleted."""
        updates = self._delete(path, revision)
        self._rejected[path] = revision
        self._report(path.decode("utf-8", "replace"), message)
        return updates

    def _delete(self, path: bytes, revision: int) -> list[RawUpdate]:
        self._rejected.pop(path, None)
        sent = self._sent.pop(path, None)
        if sent is None:
            return []
        return [RawUpdate(sent.key, None, path.decode("utf-8", "replace"), str(revision))]

    def _report(self, source: str, message: str) -> None:
        DATASTORE_PARSE_ERRORS.labels(backend=BACKEND).inc()
        log.warning("etcd datastore: %s", message)
        assert self._callbacks is not None
        self._callbacks.on_error(DatastoreError(source, message))

    def _emit(self, updates: Iterable[RawUpdate]) -> None:
        batch = list(updates)
        if batch:
            assert self._callbacks is not None
            self._callbacks.on_updates(batch)




def make_etcd_syncer(endpoints: Sequence[str], *, ca_cert: str | None = None,
                     cert_file: str | None = None, key_file: str | None = None,
                     request_timeout: float = 5.0, **options: Any) -> EtcdSyncer:
    """The syncer for `--datastore etcd3://HOST:PORT[,...]` (endpoints as parsed by
    `agent.datastore.parse_datastore_url`); TLS files default to Calico's ETCD_*_FILE
    variables; `options` go to EtcdSyncer. Raises DatastoreURLError for bad options."""
    config = EtcdConfig.from_options(endpoints, ca_cert=ca_cert, cert_file=cert_file,
                                     key_file=key_file, request_timeout=request_timeout)
    return EtcdSyncer(config, **options)

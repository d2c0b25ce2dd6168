"""The server's snapshot cache and bounded update log, one per syncer type (Typha's snapcache).

Role: receive one datastore syncer's output (it is that syncer's `SyncerCallbacks`) and
keep (1) the current value of every key, already encoded as protocol KV text, and (2) a log
of numbered entries ("breadcrumbs"), each one protocol message: a batch of KV updates or a
status change. A new client gets a `Snapshot` (every current KV plus the status, as of
sequence number S) and then the log entries after S.

Inputs: `on_status`, `on_updates`, `on_error` from the syncer thread. Outputs: `snapshot()`,
`entries_after(seq, upto)` and `latest_seq` for the server's connections (any thread),
`on_publish(seq)` called after each new entry (the server wakes its connections there), and
`on_status_change(status)` after each status change (the server's readiness follows it).

The status is the datastore syncer's own, passed on as is: a snapshot says `in-sync` only
when the syncer behind it is (clients delete the keys a snapshot lacks only then; a Typha
whose syncer is still listing serves partial snapshots marked `resync`).

Invariants:
- sequence numbers start at 1 and grow by one per entry; the snapshot at S plus entries
  S+1..N, applied in order, give exactly the cache's state at N;
- updates that change nothing (same KV text again; delete of an absent key) make no entry;
- an update batch is split so that no entry holds more than `SNAPSHOT_CHUNK` KVs (an initial
  list of 50,000 keys must not become one giant message every client must swallow);
- the log is bounded in entries AND bytes; a client whose next entry was dropped from the
  log cannot catch up and must be disconnected (it gets a fresh snapshot when it returns);
- message bytes are encoded once per compression and shared by every client;
  `batch_frames` merges a run of KV entries into one message for a client that has
  several pending.

Easy to get wrong: the snapshot must be taken under the same lock as the entry sequence, or
a client could miss or repeat an entry; encoding a big snapshot must happen outside that
lock (the syncer thread would stall) and outside the server's event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, ResourceKey, SyncStatus
from pyfelix.agent.typha import metrics
from pyfelix.agent.typha.protocol import (
    SNAPSHOT_BEGIN,
    SNAPSHOT_CHUNK,
    SNAPSHOT_END,
    compress,
    encode_kv,
    encode_message,
    encode_text,
    frame,
    kvs_text,
    status_text,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_LOG_ENTRIES = 10_000
DEFAULT_MAX_LOG_BYTES = 64 * 1024 * 1024


class Breadcrumb:
    """One log entry: a batch of KV fragments (a `kvs` message) or a status message; its
    frames are cached per compression."""

    __slots__ = ("_frames", "_text", "created", "fragments", "kv_count", "seq", "size")

    def __init__(self, seq: int, created: float, *, fragments: list[str] | None = None,
                 text: str | None = None) -> None:
        if (fragments is None) == (text is None):
            raise ValueError("a breadcrumb holds either KV fragments or a message text")
        self.seq = seq
        self.created = created  # clock() when the update reached the server
        self.fragments = fragments  # None for a status entry
        self.kv_count = len(fragments) if fragments is not None else 0
        self._text = text
        self.size = len(text) if text is not None else sum(map(len, fragments or ()))
        self._frames: dict[str, bytes] = {}

    @property
    def text(self) -> str:
        """The entry as one protocol message."""
        if self._text is not None:
            return self._text
        return kvs_text(self.fragments or (), self.seq)

    def frame(self, compression: str) -> bytes:
        """The whole frame for `compression` (encoded on first use; idempotent, so two
        threads encoding at once only waste work)."""
        data = self._frames.get(compression)
        if data is None:
            data = encode_text(self.text, compression)
            self._frames[compression] = data
        return data


def batch_frames(crumbs: list[Breadcrumb], compression: str) -> bytes:
    """The frames sending `crumbs` in order, each run of consecutive KV entries merged into
    ONE `kvs` message (seq = the run's last entry): a client behind by several entries
    decodes one message, not one per entry."""
    out: list[bytes] = []
    run: list[Breadcrumb] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0].frame(compression))
        elif run:
            fragments = [f for crumb in run for f in crumb.fragments or ()]
            out.append(encode_text(kvs_text(fragments, run[-1].seq), compression))
        run.clear()

    for crumb in crumbs:
        if crumb.fragments is not None:
            run.append(crumb)
            continue
        flush()
        out.append(crumb.frame(compression))
    flush()
    return b"".join(out)


@dataclass
class Snapshot:
    """Every KV and the status at sequence `seq`, encoded lazily per compression."""

    syncer_type: str
    seq: int
    status: SyncStatus
    fragments: list[str]
    created: float
    _frames: dict[str, list[bytes]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def kv_count(self) -> int:
        return len(self.fragments)

    def frames(self, compression: str) -> list[bytes]:
        """snapshot_begin, kvs chunks, snapshot_end, status: whole frames. The first caller
        per compression encodes; others wait for it and share the result."""
        with self._lock:
            cached = self._frames.get(compression)
            if cached is None:
                cached = self._encode(compression)
                self._frames[compression] = cached
                metrics.SNAPSHOTS_GENERATED.labels(self.syncer_type).inc()
                metrics.SNAPSHOT_BYTES.labels(self.syncer_type, compression).set(
                    sum(len(f) for f in cached))
            return cached

    def _encode(self, compression: str) -> list[bytes]:
        frames = [encode_message({"type": SNAPSHOT_BEGIN, "seq": self.seq,
                                  "kv_count": self.kv_count}, compression)]
        for start in range(0, len(self.fragments), SNAPSHOT_CHUNK):
            text = kvs_text(self.fragments[start:start + SNAPSHOT_CHUNK])
            frames.append(frame(compress(text.encode(), compression)))
        frames.append(encode_message({"type": SNAPSHOT_END, "seq": self.seq}, compression))
        frames.append(encode_text(status_text(self.seq, self.status), compression))
        return frames


class SnapshotCache:
    """See the module docstring. `kinds` limits the cache to those kinds (None: all);
    `secret_namespace` (set for the bgp syncer type) drops Secrets of any other namespace,
    so BGP passwords leave Typha only from the namespace confd reads them in."""

    def __init__(self, syncer_type: str, kinds: frozenset[str] | None = None, *,
                 secret_namespace: str | None = None,
                 max_log_entries: int = DEFAULT_MAX_LOG_ENTRIES,
                 max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
                 snapshot_reuse_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_log_entries < 1 or max_log_bytes < 1:
            raise ValueError("the update log needs room for at least one entry")
        self.syncer_type = syncer_type
        self.kinds = kinds
        self.secret_namespace = secret_namespace
        self.max_log_entries = max_log_entries
        self.max_log_bytes = max_log_bytes
        self.snapshot_reuse_seconds = snapshot_reuse_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._fragments: dict[ResourceKey, str] = {}
        self._log: deque[Breadcrumb] = deque()
        self._log_bytes = 0
        self._seq = 0
        self._status = SyncStatus.WAIT_FOR_DATASTORE
        self._snapshot: Snapshot | None = None
        self.on_publish: Callable[[int], None] | None = None
        self.on_status_change: Callable[[SyncStatus], None] | None = None
        self.errors = 0

    # -- the syncer side (SyncerCallbacks) --

    def on_status(self, status: SyncStatus) -> None:
        with self._lock:
            if status == self._status:
                return
            self._status = status
            seq = self._append_locked(
                Breadcrumb(self._seq + 1, self._clock(), text=status_text(self._seq + 1, status)))
        self._publish(seq)
        callback = self.on_status_change
        if callback is not None:
            callback(status)

    def on_updates(self, updates: list[RawUpdate]) -> None:
        received = self._clock()
        wanted = [u for u in updates if (self.kinds is None or u.key.kind in self.kinds)
                  and not (self.secret_namespace is not None and u.key.kind == "Secret"
                           and u.key.namespace != self.secret_namespace)]
        encoded = [encode_kv(update) for update in wanted]  # outside the lock: the slow part
        seq = 0
        skipped = 0
        with self._lock:
            changes: list[str] = []
            for kv in encoded:
                current = self._fragments.get(kv.key)
                if kv.fingerprint is None:
                    if current is None:
                        skipped += 1
                        continue
                    del self._fragments[kv.key]
                elif current == kv.text:
                    skipped += 1
                    continue
                else:
                    self._fragments[kv.key] = kv.text
                changes.append(kv.text)
            for start in range(0, len(changes), SNAPSHOT_CHUNK):
                seq = self._append_locked(Breadcrumb(
                    self._seq + 1, received, fragments=changes[start:start + SNAPSHOT_CHUNK]))
            size = len(self._fragments)
        labels = self.syncer_type
        metrics.UPDATES_TOTAL.labels(labels).inc(len(wanted) - skipped)
        if skipped:
            metrics.UPDATES_SKIPPED.labels(labels).inc(skipped)
        metrics.SNAPSHOT_SIZE.labels(labels).set(size)
        if seq:
            self._publish(seq)

    def on_error(self, error: DatastoreError) -> None:
        self.errors += 1
        metrics.DATASTORE_ERRORS.labels(self.syncer_type).inc()
        log.warning("typha %s syncer: datastore error: %s", self.syncer_type, error)

    def _append_locked(self, crumb: Breadcrumb) -> int:
        assert crumb.seq == self._seq + 1
        self._seq = crumb.seq
        self._log.append(crumb)
        self._log_bytes += crumb.size
        while len(self._log) > 1 and (len(self._log) > self.max_log_entries
                                      or self._log_bytes > self.max_log_bytes):
            self._log_bytes -= self._log.popleft().size
        metrics.UPDATE_LOG_ENTRIES.labels(self.syncer_type).set(len(self._log))
        return self._seq

    def _publish(self, seq: int) -> None:
        callback = self.on_publish
        if callback is not None:
            callback(seq)

    # -- the reader side --

    @property
    def latest_seq(self) -> int:
        with self._lock:
            return self._seq

    @property
    def status(self) -> SyncStatus:
        with self._lock:
            return self._status

    @property
    def kv_count(self) -> int:
        with self._lock:
            return len(self._fragments)

    def oldest_seq(self) -> int:
        """The sequence number of the oldest entry still in the log (latest + 1 if empty)."""
        with self._lock:
            return self._log[0].seq if self._log else self._seq + 1

    def entries_after(self, seq: int, upto: int, *, max_bytes: int | None = None
                      ) -> list[Breadcrumb] | None:
        """Entries seq+1 .. upto, in order (at most `max_bytes` of text, but at least one);
        None when entry seq+1 has already left the log (the reader fell behind)."""
        with self._lock:
            if seq >= upto:
                return []
            if not self._log or self._log[0].seq > seq + 1:
                return None
            start = seq + 1 - self._log[0].seq
            result: list[Breadcrumb] = []
            total = 0
            for index in range(start, min(len(self._log), start + upto - seq)):
                crumb = self._log[index]
                if result and max_bytes is not None and total + crumb.size > max_bytes:
                    break
                result.append(crumb)
                total += crumb.size
            return result

    def snapshot(self) -> Snapshot:
        """The current state as a Snapshot, reusing the last one while it is younger than
        `snapshot_reuse_seconds` and a client taking it can still catch up from the log."""
        now = self._clock()
        with self._lock:
            last = self._snapshot
            oldest = self._log[0].seq if self._log else self._seq + 1
            if (last is not None and now - last.created < self.snapshot_reuse_seconds
                    and (last.seq == self._seq or last.seq + 1 >= oldest)):
                return last
            snapshot = Snapshot(self.syncer_type, self._seq, self._status,
                                list(self._fragments.values()), now)
            self._snapshot = snapshot
            return snapshot

"""CalcPipeline: syncer callbacks -> validator -> calc graph -> event sequencer -> dataplane.

Role: the glue (docs/ARCHITECTURE.md section 1) between the datastore and a dataplane
driver, used by `pyfelix calc` and the agent. The pipeline implements `SyncerCallbacks`,
so a syncer can be started with it directly; syncer calls only enqueue (they run on the
syncer's thread).
Everything else runs on ONE thread: either the pipeline's own (`start()` / `stop()`), or
the caller's (`process_pending()`, for tests and one-shot tools).

Processing: take everything queued (raw update batches, statuses, datastore errors),
validate the updates (`agent.validator.Validator`: invalid documents become deletes, with a
logged warning), feed the graph, and when the queue is empty FLUSH the graph and the
sequencer, which sends the batch to `target` (anything with `send(message)`, a list, or a
callable). Nothing is flushed before the datastore has first been in sync: the initial
load is coalesced into one batch (as Felix's PolicyResolver waits for in-sync), and that
first flush ends with `InSync`; `in_sync` (a threading.Event) is set once it is sent.

`on_batch(seconds, messages)` (optional) is called after every processed batch, for the
agent's `felix_calc_graph_update_time_seconds`; `idle()` and `failure` are for its status
reporting, `is_alive()` for noticing a dead thread.

Liveness: `heartbeat` (optional, no arguments) is called from the pipeline's own thread when
it starts, after every batch, between the items of a long batch (at most every
`heartbeat_interval` s) and every `heartbeat_interval` s while the queue is empty (the
queue wait has that timeout). The agent reports the `calc-graph` health reporter from it
(`agent.health`): a graph update or flush that never returns stops the heartbeats.

Invariants: the validator, graph and sequencer are touched by one thread only; the
dataplane receives messages only from `flush()`; a datastore error never stops the
pipeline (it is logged and kept in `errors`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyfelix.agent.calc.event_sequencer import EventSequencer
from pyfelix.agent.calc.graph import CalcGraph, build_calc_graph
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, SyncStatus

log = logging.getLogger(__name__)

_STOP = object()


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a batch is processed.

    The graph's state is large (10,000s of small dicts, sets and frozen dataclasses) and
    acyclic: reference counting frees what the graph drops. Left running, the collector's
    full passes rescan all of that state many times during a big batch (the initial load
    spent ~40% of its time there). Cycles made meanwhile are collected once it resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CalcPipeline:
    def __init__(self, hostname: str, target: Any, *, validator: Any = None,
                 naive_ipsets: bool = False,
                 on_batch: Callable[[float, int], None] | None = None,
                 heartbeat: Callable[[], None] | None = None,
                 heartbeat_interval: float = 10.0) -> None:
        if heartbeat_interval <= 0:
            raise ValueError("CalcPipeline: heartbeat_interval must be > 0")
        if validator is None:
            from pyfelix.agent.validator import Validator

            validator = Validator()
        self.hostname = hostname
        self.validator = validator
        self.sequencer = EventSequencer(target)
        self.graph: CalcGraph = build_calc_graph(hostname, self.sequencer,
                                                 naive_ipsets=naive_ipsets)
        self.errors: list[DatastoreError] = []
        self.status = SyncStatus.WAIT_FOR_DATASTORE
        self.datastore_in_sync = False
        self.in_sync = threading.Event()
        self.batches_flushed = 0
        self.flush_seconds = 0.0
        self._on_batch = on_batch
        self._heartbeat = heartbeat
        self._heartbeat_interval = heartbeat_interval
        self._last_beat = float("-inf")
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._busy = False

    # --- SyncerCallbacks (any thread) ---------------------------------------------------

    def on_status(self, status: SyncStatus) -> None:
        self._queue.put(status)

    def on_updates(self, updates: list[RawUpdate]) -> None:
        self._queue.put(list(updates))

    def on_error(self, error: DatastoreError) -> None:
        self._queue.put(error)

    # --- running on a thread of its own -------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="calc-pipeline", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def is_alive(self) -> bool:
        """True while the pipeline's own thread runs (False if it died or never started)."""
        return self._thread is not None and self._thread.is_alive()

    def idle(self) -> bool:
        """Nothing queued and no batch being processed right now."""
        return not self._busy and self._queue.empty()

    @property
    def failure(self) -> BaseException | None:
        """The exception that ended the pipeline thread, if one did."""
        return self._failure

    def wait_in_sync(self, timeout: float) -> bool:
        """Wait until InSync has been sent; re-raises a failure of the pipeline thread."""
        deadline = time.monotonic() + timeout
        while not self.in_sync.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self._failure is not None:
                raise RuntimeError("calc pipeline failed") from self._failure
            if time.monotonic() >= deadline:
                return False
        return True

    def _run(self) -> None:
        try:
            self._beat()
            while True:
                try:
                    item = self._queue.get(timeout=self._heartbeat_interval)
                except queue.Empty:
                    self._beat()
                    continue
                if item is _STOP or not self._process_available(item):
                    return
                self._beat()
        except BaseException as exc:  # surfaced by wait_in_sync; the thread must not vanish
            self._failure = exc
            log.exception("calc pipeline thread failed")

    # --- running on the caller's thread -------------------------------------------------

    def process_pending(self) -> None:
        """Process everything queued so far, then flush (if in sync)."""
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            self._maybe_flush()
            return
        self._process_available(item)

    def feed(self, updates: Iterable[RawUpdate] = (), status: SyncStatus | None = None) -> None:
        """Synchronous convenience: queue updates (and a status) and process them now."""
        self.on_updates(list(updates))
        if status is not None:
            self.on_status(status)
        self.process_pending()

    # --- processing ---------------------------------------------------------------------

    def _process_available(self, item: Any) -> bool:
        """Process `item` and everything queued behind it, then flush. False on stop."""
        self._busy = True
        started = time.perf_counter()
        sent_before = self.sequencer.messages_sent
        try:
            with _cyclic_gc_paused():
                while True:
                    if item is _STOP:
                        self._maybe_flush()
                        return False
                    self._process(item)
                    if time.monotonic() - self._last_beat >= self._heartbeat_interval:
                        self._beat()
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                self._maybe_flush()
        finally:
            self._busy = False
            if self._on_batch is not None:
                self._on_batch(time.perf_counter() - started,
                               self.sequencer.messages_sent - sent_before)
        return True

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        if self._heartbeat is None:
            return
        try:
            self._heartbeat()
        except Exception:  # health reporting must never stop the pipeline
            log.exception("calc pipeline heartbeat failed")

    def _process(self, item: Any) -> None:
        if isinstance(item, SyncStatus):
            self.status = item
            if item is SyncStatus.IN_SYNC:
                self.datastore_in_sync = True
            self.graph.on_status(item)
        elif isinstance(item, DatastoreError):
            self.errors.append(item)
            log.warning("datastore: %s", item)
        else:
            self.graph.on_updates(self.validator.on_updates(item))

    def _maybe_flush(self) -> None:
        if not self.datastore_in_sync:
            return
        started = time.perf_counter()
        self.graph.flush()
        sent = self.sequencer.flush()
        self.flush_seconds += time.perf_counter() - started
        if sent:
            self.batches_flushed += 1
        if self.sequencer.in_sync_sent:
            self.in_sync.set()

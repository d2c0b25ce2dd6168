"""The dataplane driver loop: messages in, managers' `on_update`, then `apply()` in order.

Role: Felix's `InternalDataplane.loop()` in Python. One thread:

    queue (calc-graph proto messages + interface-monitor events)
      │  drain a batch (block for the first, then take what is queued, up to batch_max)
      v
    every manager.on_update(msg), for every msg, in order      (cheap, no kernel I/O)
      │  only after `agent.proto.InSync` has been seen (never write a half-known dataplane)
      v
    phase 1: manager.apply() for every manager, in the given order
    phase 2: manager.finish_apply() for every manager (deferred deletions), only if phase 1
             succeeded everywhere (IP sets are destroyed after the rules using them are gone)

Failures: any exception from apply()/finish_apply() keeps the round dirty; the next round is
scheduled after a jittered exponential backoff (`felix_int_dataplane_failures_total` counts
failed rounds). A *policy-critical* manager that keeps failing for longer than
`fail_closed_after` seconds makes the loop stop and signal fatal (`fatal` event, `on_fatal`
callback): the agent must exit non-zero rather than run with policy it cannot program.

Liveness: `heartbeat` (optional, no arguments) is called from the loop's thread when it
starts and after every step, and a step waits at most `heartbeat_interval` seconds for a
message, so an idle loop still calls it on a timer. The agent reports the `dataplane`
health reporter from it (`agent.health`): an apply() stuck in a syscall stops the
heartbeats, and liveness fails after the reporter's timeout.

Pause: `DatastoreReady(ready=False)` (ClusterInformation datastoreReady false, as Felix
honours it) stops every apply round, resyncs included; messages keep updating the managers'
desired state, and the first round after `DatastoreReady(ready=True)` writes the result.

Resync: every `resync_interval` seconds every manager is asked to re-read the kernel on its
next apply (drift is repaired). `in_sync` is set after the first fully successful round that
followed InSync. Time comes from an injectable clock; `run_once()` lets tests step the loop
without a thread.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Gauge, Summary

from pyfelix.agent.dataplane.manager import Manager
from pyfelix.agent.proto import DatastoreReady, InSync
from pyfelix.agent.shims.clock import Clock, SystemClock

log = logging.getLogger(__name__)

FAILURES = Counter(
    "felix_int_dataplane_failures",
    "Number of times a dataplane apply round failed and will be retried.",
)
APPLY_TIME = Summary(
    "felix_int_dataplane_apply_time_seconds",
    "Time in seconds that it took to apply a dataplane update round.",
)
MESSAGES = Counter(
    "felix_int_dataplane_messages",
    "Number of messages received by the dataplane driver, by message type.",
    ["type"],
)
BATCH_SIZE = Summary(
    "felix_int_dataplane_msg_batch_size",
    "Number of messages processed in each batch by the dataplane driver.",
)
UPDATE_ERRORS = Counter(
    "pyfelix_dataplane_update_errors",
    "Number of messages a dataplane manager's on_update could not handle (bad input).",
)

PAUSED = Gauge(
    "pyfelix_dataplane_paused",
    "1 while ClusterInformation datastoreReady is false: no kernel writes, state kept.",
)

_STOP = object()


class DataplaneLoop:
    """Drives a fixed, ordered list of managers from a queue of messages."""

    def __init__(
        self,
        managers: Sequence[Manager],
        *,
        clock: Clock | None = None,
        resync_interval: float = 90.0,
        retry_initial: float = 0.1,
        retry_max: float = 30.0,
        fail_closed_after: float = 300.0,
        on_fatal: Callable[[str], None] | None = None,
        batch_max: int = 1000,
        rng: random.Random | None = None,
        heartbeat: Callable[[], None] | None = None,
        heartbeat_interval: float = 10.0,
    ) -> None:
        if resync_interval <= 0 or retry_initial <= 0 or retry_max < retry_initial:
            raise ValueError(
                "DataplaneLoop: resync_interval and retry_initial must be > 0 and "
                "retry_max >= retry_initial"
            )
        if heartbeat_interval <= 0:
            raise ValueError("DataplaneLoop: heartbeat_interval must be > 0")
        self.managers: tuple[Manager, ...] = tuple(managers)
        self.queue: queue.Queue[object] = queue.Queue()
        self.in_sync = threading.Event()
        self.fatal = threading.Event()
        self.fatal_reason: str | None = None
        self._clock = clock or SystemClock()
        self._resync_interval = resync_interval
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._fail_closed_after = fail_closed_after
        self._on_fatal = on_fatal
        self._batch_max = batch_max
        self._rng = rng or random.Random()
        self._heartbeat = heartbeat
        self._heartbeat_interval = heartbeat_interval
        self._datastore_in_sync = False
        self.paused = False  # ClusterInformation datastoreReady false
        # settled(): every message enqueued so far dispatched AND applied by a successful
        # round (an empty queue alone says nothing while a round is being applied)
        self._enqueued = 0
        self._enqueued_lock = threading.Lock()
        self._dispatched = 0
        self._applied = 0
        self._dirty = False
        self._consecutive_failures = 0
        self._next_retry_at: float | None = None
        self._next_resync_at = self._clock.monotonic() + resync_interval
        self._failing_since: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.rounds_applied = 0

    # --- input -----------------------------------------------------------------------------

    def enqueue(self, msg: object) -> None:
        """Thread-safe: called by the calc graph's sequencer and the interface monitor."""
        with self._enqueued_lock:
            self._enqueued += 1
        self.queue.put(msg)

    def settled(self) -> bool:
        """Every message enqueued so far is in the kernel: dispatched to the managers and
        applied by a successful round, none pending. (The queue being empty is not enough:
        the loop drains it before it dispatches and applies.)"""
        return not self._dirty and self._applied == self._enqueued

    # --- thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("DataplaneLoop already started")
        self._thread = threading.Thread(target=self._run, name="dataplane-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        self._beat()
        while not self._stopping and not self.fatal.is_set():
            self.run_once(min(self._wait_timeout(), self._heartbeat_interval))
            self._beat()

    def _beat(self) -> None:
        if self._heartbeat is None:
            return
        try:
            self._heartbeat()
        except Exception:  # health reporting must never stop the dataplane
            log.exception("dataplane loop heartbeat failed")

    def _wait_timeout(self) -> float:
        now = self._clock.monotonic()
        deadlines = [self._next_resync_at]
        if self._next_retry_at is not None:
            deadlines.append(self._next_retry_at)
        return max(0.0, min(deadlines) - now)

    # --- one step --------------------------------------------------------------------------

    def run_once(self, timeout: float = 0.0) -> bool:
        """Take one batch (waiting up to `timeout` s for its first message), then maybe apply.

        Returns True when an apply round ran (successful or not).
        """
        batch = self._drain(timeout)
        if batch:
            BATCH_SIZE.observe(len(batch))
            for msg in batch:
                self._dispatch(msg)
            self._dispatched += len(batch)
            self._dirty = True
        now = self._clock.monotonic()
        if now >= self._next_resync_at:
            for manager in self.managers:
                manager.request_resync()
            self._next_resync_at = now + self._resync_interval
            self._dirty = True
        if not self._dirty:
            self._applied = self._dispatched  # nothing to write for what came
        if not self._datastore_in_sync or not self._dirty or self.paused:
            return False
        if self._next_retry_at is not None and now < self._next_retry_at:
            return False
        upto = self._dispatched
        self._apply_round()
        if not self._dirty:
            self._applied = upto
        return True

    def _drain(self, timeout: float) -> list[object]:
        batch: list[object] = []
        try:
            first = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return batch
        if first is _STOP:
            return batch
        batch.append(first)
        while len(batch) < self._batch_max:
            try:
                msg = self.queue.get_nowait()
            except queue.Empty:
                break
            if msg is _STOP:
                break
            batch.append(msg)
        return batch

    def _dispatch(self, msg: object) -> None:
        MESSAGES.labels(type(msg).__name__).inc()
        if isinstance(msg, InSync):
            self._datastore_in_sync = True
        elif isinstance(msg, DatastoreReady):
            if self.paused == msg.ready:
                log.warning("ClusterInformation datastoreReady is %s: dataplane updates %s",
                            str(msg.ready).lower(),
                            "resume" if msg.ready else "paused (the kernel keeps what is "
                            "programmed)")
            self.paused = not msg.ready
            PAUSED.set(0 if msg.ready else 1)
        for manager in self.managers:
            try:
                manager.on_update(msg)
            except Exception:
                UPDATE_ERRORS.inc()
                log.exception("manager %s could not handle %s", manager.name, type(msg).__name__)

    def _apply_round(self) -> None:
        start = self._clock.monotonic()
        failed: dict[str, BaseException] = {}
        for manager in self.managers:
            self._try(manager, manager.apply, failed)
        if not failed:
            for manager in self.managers:
                self._try(manager, manager.finish_apply, failed)
        end = self._clock.monotonic()
        APPLY_TIME.observe(end - start)
        self.rounds_applied += 1
        for manager in self.managers:
            if manager.name not in failed:
                self._failing_since.pop(manager.name, None)
        if not failed:
            self._dirty = False
            self._consecutive_failures = 0
            self._next_retry_at = None
            self.in_sync.set()
            return
        FAILURES.inc()
        self._consecutive_failures += 1
        delay = self._backoff(self._consecutive_failures)
        self._next_retry_at = end + delay
        log.warning(
            "dataplane apply failed (%s); retry %d in %.2f s",
            ", ".join(f"{name}: {exc}" for name, exc in failed.items()),
            self._consecutive_failures,
            delay,
        )
        self._check_fail_closed(end, failed)

    def _try(self, manager: Manager, step: Callable[[], None], failed: dict) -> None:
        try:
            step()
        except Exception as exc:
            failed[manager.name] = exc
            self._failing_since.setdefault(manager.name, self._clock.monotonic())

    def _backoff(self, attempt: int) -> float:
        base = min(self._retry_max, self._retry_initial * (2 ** min(attempt - 1, 32)))
        return base * self._rng.uniform(0.75, 1.25)

    def _check_fail_closed(self, now: float, failed: dict[str, BaseException]) -> None:
        for manager in self.managers:
            since = self._failing_since.get(manager.name)
            if not manager.policy_critical or since is None:
                continue
            if now - since >= self._fail_closed_after:
                reason = (
                    f"dataplane manager {manager.name} could not program policy for "
                    f"{now - since:.1f} s (bound {self._fail_closed_after} s): "
                    f"{failed.get(manager.name)}"
                )
                log.error("failing closed: %s", reason)
                self.fatal_reason = reason
                self.fatal.set()
                if self._on_fatal is not None:
                    self._on_fatal(reason)
                return

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    @property
    def next_retry_at(self) -> float | None:
        return self._next_retry_at

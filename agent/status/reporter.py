"""StatusReporter: the agent's thread that writes its status records to the datastore.

Role: Felix's status reporter. Inputs: `set_in_sync(bool)` (from the agent's main loop),
`on_endpoint_status(kind, endpoint, status | None)` (from the dataplane's
`EndpointStatusManager`, any thread). Output: records in a `StatusStore`:
- the node record, written at start (`first_update` true), then every `interval` seconds
  and at once when in-sync changes; its TTL is ReportingTTLSecs;
- when EndpointReportingEnabled, one record per endpoint, written when its status changes
  and deleted when the endpoint goes.
`stop(clean=True)` removes this host's records (etcd: revokes the lease), so a cleanly
stopped agent leaves nothing behind; a crashed one leaves records that expire after the TTL.

Failures to write are logged and retried on the next tick (status must never take the
agent down). Time comes from injectable clocks; `tick()` runs one step for tests.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from pyfelix.agent.status.records import EndpointStatus, NodeStatus
from pyfelix.agent.status.stores import StatusStore, StatusStoreError

log = logging.getLogger(__name__)

DEFAULT_TTL = 90.0


class StatusReporter:
    def __init__(self, store: StatusStore, hostname: str, *, ttl: float = DEFAULT_TTL,
                 interval: float | None = None, endpoint_reporting: bool = False,
                 wall_clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0:
            raise ValueError(f"ReportingTTLSecs: must be > 0, got {ttl}")
        self._store = store
        self.hostname = hostname
        self.ttl = ttl
        self.interval = interval if interval is not None else min(30.0, ttl / 3)
        if self.interval <= 0 or self.interval >= ttl:
            raise ValueError(f"status interval {self.interval} must be > 0 and < the TTL {ttl}")
        self.endpoint_reporting = endpoint_reporting
        self._wall = wall_clock
        self._monotonic = monotonic
        self._started = monotonic()
        self._first = True
        self._in_sync = False
        self._node_dirty = True
        self._next_node_write = self._started
        self._pending: queue.Queue[tuple[str, str, str | None]] = queue.Queue()
        self._unwritten: dict[tuple[str, str], str | None] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.failures = 0

    # --- inputs (any thread) ----------------------------------------------------------------

    def set_in_sync(self, in_sync: bool) -> None:
        if in_sync != self._in_sync:
            self._in_sync = in_sync
            self._node_dirty = True
            self._wake.set()

    def on_endpoint_status(self, kind: str, endpoint: str, status: str | None) -> None:
        if self.endpoint_reporting:
            self._pending.put((kind, endpoint, status))
            self._wake.set()

    # --- thread -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="status-reporter",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            wait = max(0.0, self._next_node_write - self._monotonic())
            self._wake.wait(min(wait, 1.0) if self._unwritten else wait)
            self._wake.clear()

    def stop(self, *, clean: bool = True, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if clean:
            try:
                self._store.remove_host(self.hostname)
            except StatusStoreError as exc:
                log.warning("removing our status records: %s", exc)
        self._store.close()

    # --- one step ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = self._monotonic()
        if self._node_dirty or now >= self._next_node_write:
            record = NodeStatus(hostname=self.hostname, timestamp=self._wall(),
                                uptime=round(now - self._started, 3),
                                first_update=self._first, in_sync=self._in_sync, ttl=self.ttl)
            try:
                self._store.write_node(record)
            except StatusStoreError as exc:
                self.failures += 1
                log.warning("writing node status: %s", exc)
                self._next_node_write = now + min(self.interval, 1.0)
            else:
                self.writes += 1
                self._first = False
                self._node_dirty = record.in_sync != self._in_sync  # changed meanwhile?
                self._next_node_write = now + self.interval
        while True:
            try:
                kind, endpoint, status = self._pending.get_nowait()
            except queue.Empty:
                break
            self._unwritten[(kind, endpoint)] = status
        for (kind, endpoint), status in list(self._unwritten.items()):
            try:
                if status is None:
                    self._store.delete_endpoint(self.hostname, kind, endpoint)
                else:
                    self._store.write_endpoint(EndpointStatus(
                        self.hostname, kind, endpoint, status, self._wall()))
            except StatusStoreError as exc:
                self.failures += 1
                log.warning("writing endpoint status %s: %s", endpoint, exc)
                continue
            self.writes += 1
            del self._unwritten[(kind, endpoint)]

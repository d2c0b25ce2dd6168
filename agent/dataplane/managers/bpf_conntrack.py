"""BPF conntrack cleanup: a small thread that deletes expired flows every
`BPFConntrackCleanupInterval` seconds.

Why a thread and not the loop's apply(): the driver loop applies only when messages or a
resync made something dirty, so a quiet cluster would never clean. The thread starts at
the first apply (after InSync: a restarted agent does not start deleting before it is in
charge) and stops at `close()`. It uses its OWN handle on the pinned conntrack map (map
handles are not shared between threads) and `agent.bpf.conntrack.ConntrackCleaner`, which
re-reads each candidate before deleting it so a flow refreshed meanwhile is kept. A failed
run is logged and counted; the next run retries. The programs treat expired entries as
misses anyway, so cleaning is about room and accurate dumps, not correctness.

Outputs: `pyfelix_bpf_conntrack_cleaned_total`, `pyfelix_bpf_map_entries{map="conntrack"}`
(entries left after the last run), `pyfelix_bpf_conntrack_cleaner_errors_total`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pyfelix.agent.bpf.conntrack import CleanStats, ConntrackCleaner
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics

log = logging.getLogger(__name__)


class BpfConntrackManager(ManagerBase):
    name = "bpf-conntrack"
    policy_critical = False

    def __init__(self, open_map: Callable[[], Any], *, interval: float = 10.0,
                 timeouts: ct_map.Timeouts = ct_map.DEFAULT_TIMEOUTS) -> None:
        super().__init__()
        if interval <= 0:
            raise ValueError(f"BPFConntrackCleanupInterval: must be > 0, got {interval}")
        self._open_map = open_map
        self._interval = interval
        self._timeouts = timeouts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.last: CleanStats | None = None
        self.on_close: Callable[[], None] | None = None  # releases the shared build
        # each expired entry deleted (raw key, value): the flow logs' flow-end records
        self.on_expired: Callable[[bytes, bytes], None] | None = None

    def on_update(self, msg: object) -> None:
        return None

    def apply(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bpf-ct-cleaner",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        ct = self._open_map()
        try:
            cleaner = ConntrackCleaner(ct, timeouts=self._timeouts,
                                       on_expired=self.on_expired)
            while not self._stop.wait(self._interval):
                self.run_once(cleaner)
        finally:
            ct.close()

    def run_once(self, cleaner: ConntrackCleaner) -> CleanStats | None:
        try:
            stats = cleaner.run_once()
        except Exception:
            metrics.CONNTRACK_CLEANER_ERRORS.inc()
            log.exception("BPF conntrack cleanup failed; retrying in %.0f s", self._interval)
            return None
        self.runs += 1
        self.last = stats
        metrics.CONNTRACK_CLEANED.inc(stats.deleted)
        metrics.MAP_ENTRIES.labels("conntrack").set(stats.scanned - stats.deleted)
        if stats.deleted:
            log.debug("BPF conntrack: %d of %d entries expired and deleted in %.3f s",
                      stats.deleted, stats.scanned, stats.seconds)
        return stats

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

"""The conntrack cleaner: delete expired entries from the pinned conntrack map.

Role: the programs already treat an expired entry as a miss (conntrack.h), so cleaning is
about space and accuracy of dumps, not correctness; the map is an LRU, so it never fills
up either, but live flows could be evicted in favour of dead ones without cleaning.

Inputs: a conntrack map handle (BpfMap or FakeMap), the `Timeouts` the programs were built
with (loader BuildConfig.ct_timeouts), and a clock returning CLOCK_MONOTONIC_COARSE ns (the
programs' clock, `ct_map.now_ns`). Output: `CleanStats` per run. `run_once()` reads every entry (one
batch syscall per 4096 entries) and deletes the expired ones, re-reading each candidate
just before deleting it so a flow refreshed meanwhile by a packet is kept. `on_expired(key,
value)`, when given, hears each deleted entry (its raw key and last value): the flow logs'
flow-end records with the flow's packet and byte counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.bpf.maps import conntrack as ct_map


@dataclass(frozen=True)
class CleanStats:
    scanned: int
    deleted: int
    seconds: float


class ConntrackCleaner:
    def __init__(self, ct: Any, *, timeouts: ct_map.Timeouts = ct_map.DEFAULT_TIMEOUTS,
                 clock_ns: Callable[[], int] = ct_map.now_ns,
                 on_expired: Callable[[bytes, bytes], None] | None = None) -> None:
        self.ct = ct
        self.on_expired = on_expired
        self.timeouts = timeouts
        self.clock_ns = clock_ns

    def expired(self, key: bytes, value: bytes, now_ns: int) -> bool:
        k, v = ct_map.decode_key(key), ct_map.decode_value(value)
        return now_ns - v.last_seen_ns > self.timeouts.timeout_ns(k.proto, v.flags)

    def run_once(self) -> CleanStats:
        t0 = time.monotonic()
        now = self.clock_ns()
        entries = self.ct.items()
        deleted = 0
        for key, value in entries:
            if not self.expired(key, value, now):
                continue
            current = self.ct.lookup(key)
            if (current is not None and self.expired(key, current, self.clock_ns())
                    and self.ct.delete(key)):
                deleted += 1
                if self.on_expired is not None:
                    self.on_expired(bytes(key), bytes(current))
        return CleanStats(scanned=len(entries), deleted=deleted, seconds=time.monotonic() - t0)

"""MapMirror: one pinned BPF map's desired and actual entries (a `DeltaTracker`), and the
writes that make the kernel match.

Role: the BPF managers' desired-vs-actual bookkeeping for one map, with the kernel writes
that go with it. The bookkeeping is the dataplane's one `DeltaTracker` (agent.dataplane
.delta) over raw `bytes` keys and values; the BPF compilers produce a map's whole desired
content at each apply, so `updates(desired)` replaces the desired side in one pass and
returns the entries to write, and `stale(desired)` the keys to delete (never for arrays:
their slots always exist). `reload()` reads the kernel (first apply, resync). `write()` /
`delete()` change the kernel (batched where the map type allows) and the tracker's
dataplane side together, counting `pyfelix_bpf_map_writes_total{map,op}`. A write that
does not fit (MapFullError) is retried entry by entry and the keys that did not fit are
returned; any other error raises, and the manager re-reads the kernel before trusting the
mirror again.

Invariant: `actual` (the tracker's dataplane side) only ever holds entries the kernel was
read to hold or was written successfully; a failed write leaves its entries pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyfelix.agent.bpf.maps.base import ARRAY_TYPES, MapFullError
from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics


class MapMirror(DeltaTracker[bytes, bytes]):
    """One pinned map's tracker plus its writes. `actual` is None until read from the
    kernel."""

    def __init__(self, bpf_map: Any) -> None:
        super().__init__()
        self.map = bpf_map
        self._loaded = False

    @property
    def name(self) -> str:
        return str(self.map.params.name)

    @property
    def is_array(self) -> bool:
        return self.map.params.map_type in ARRAY_TYPES

    @property
    def actual(self) -> Mapping[bytes, bytes] | None:
        """What the kernel holds, as far as this mirror knows (None before `reload`)."""
        return self.dataplane() if self._loaded else None

    def reload(self) -> None:
        self.replace_all_dataplane(self.map.items())
        self._loaded = True

    def updates(self, desired: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        """Take `desired` as the map's whole desired content; the entries to write."""
        self.replace_all_desired(desired)
        return self.pending_updates()

    def stale(self, desired: Mapping[bytes, bytes]) -> list[bytes]:
        """Take `desired` as the map's whole desired content; the keys to delete."""
        if self.is_array:
            return []
        self.replace_all_desired(desired)
        return self.pending_deletions()

    def write(self, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        """Write items (batched where the map allows); returns the keys that did not fit.
        Other errors raise (after recording what is known to be written)."""
        if not items:
            return []
        assert self._loaded
        try:
            self.map.update_many(items)
        except MapFullError:
            return self._write_one_by_one(items)
        for key, value in items:
            self.set_dataplane(key, value)
        metrics.MAP_WRITES.labels(self.name, "update").inc(len(items))
        return []

    def _write_one_by_one(self, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        failed = []
        for key, value in items:
            try:
                self.map.update(key, value)
            except MapFullError:
                failed.append(key)
                continue
            self.set_dataplane(key, value)
            metrics.MAP_WRITES.labels(self.name, "update").inc()
        return failed

    def delete(self, keys: list[bytes]) -> None:
        if not keys:
            return
        assert self._loaded
        self.map.delete_many(keys)
        for key in keys:
            self.delete_dataplane(key)
        metrics.MAP_WRITES.labels(self.name, "delete").inc(len(keys))

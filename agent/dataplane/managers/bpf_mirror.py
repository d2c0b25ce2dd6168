"""MapMirror: what one pinned BPF map holds, as far as its manager knows, and the writes
that keep that knowledge true.

Role: the BPF managers' desired-vs-actual bookkeeping for one map. `reload()` reads the
kernel (first apply, resync); `updates(desired)` are the entries that differ;
`stale(desired)` the keys to delete (never for arrays: their slots always exist);
`write()` / `delete()` change the kernel (batched where the map type allows) and the
mirror together, counting `pyfelix_bpf_map_writes_total{map,op}`. A write that does not
fit (MapFullError) is retried entry by entry and the keys that did not fit are returned;
any other error raises, and the manager re-reads the kernel before trusting the mirror
again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.bpf.maps.base import ARRAY_TYPES, MapFullError
from agent.dataplane.managers import bpf_metrics as metrics


class MapMirror:
    """What one pinned map holds, as far as this manager knows, and the writes that keep
    that knowledge true. `actual` is None until read from the kernel."""

    def __init__(self, bpf_map: Any) -> None:
        self.map = bpf_map
        self.actual: dict[bytes, bytes] | None = None

    @property
    def name(self) -> str:
        return str(self.map.params.name)

    @property
    def is_array(self) -> bool:
        return self.map.params.map_type in ARRAY_TYPES

    def reload(self) -> None:
        self.actual = dict(self.map.items())

    def updates(self, desired: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        actual = self.actual or {}
        return [(k, v) for k, v in desired.items() if actual.get(k) != v]

    def stale(self, desired: Mapping[bytes, bytes]) -> list[bytes]:
        if self.is_array:
            return []
        return [k for k in (self.actual or {}) if k not in desired]

    def write(self, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        """Write items (batched where the map allows); returns the keys that did not fit.
        Other errors raise (after recording what is known to be written)."""
        if not items:
            return []
        assert self.actual is not None
        try:
            self.map.update_many(items)
        except MapFullError:
            return self._write_one_by_one(items)
        self.actual.update(items)
        metrics.MAP_WRITES.labels(self.name, "update").inc(len(items))
        return []

    def _write_one_by_one(self, items: list[tuple[bytes, bytes]]) -> list[bytes]:
        assert self.actual is not None
        failed = []
        for key, value in items:
            try:
                self.map.update(key, value)
            except MapFullError:
                failed.append(key)
                continue
            self.actual[key] = value
            metrics.MAP_WRITES.labels(self.name, "update").inc()
        return failed

    def delete(self, keys: list[bytes]) -> None:
        if not keys:
            return
        assert self.actual is not None
        self.map.delete_many(keys)
        for key in keys:
            self.actual.pop(key, None)
        metrics.MAP_WRITES.labels(self.name, "delete").inc(len(keys))

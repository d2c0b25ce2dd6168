"""DeltaTracker: desired state vs. what the dataplane holds, and the difference between them.

Role: the one reusable bookkeeping structure behind every dataplane manager (Felix's
`deltatracker`). Routes, IP sets, iptables chains, sysctls and the BPF maps' entries
(`agent.dataplane.managers.bpf_mirror.MapMirror`, a `DeltaTracker[bytes, bytes]` that
also writes its map) all keep one:

- the *desired* map (what the calc graph asked for; written by `on_update`),
- a cache of the *dataplane* map (what the kernel holds; refreshed by a resync that reads the
  kernel, and updated after each successful write),
- the pending work derived from the two: keys to write (missing or different in the
  dataplane) and keys to delete (in the dataplane but not desired).

Inputs: `set_desired` / `delete_desired` from managers' `on_update` (or
`replace_all_desired` where a compiler produces the whole desired map at once);
`replace_all_dataplane`
after reading the kernel; `set_dataplane` / `delete_dataplane` after each write succeeded.
Outputs: `pending_updates()` / `pending_deletions()`.

Invariants (checked by tests after every operation):
- k is a pending update  <=> k is desired and (k not in dataplane or values differ);
- k is a pending deletion <=> k is in dataplane and not desired.

Easy to get wrong: a failed write must NOT call `set_dataplane`, so the work stays pending
and the next `apply()` retries it. Values are compared with `values_equal` (default `==`):
pass a custom one when the kernel read-back is a lossy view of the desired value (iptables
chains compare rule hashes, not rule text).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _default_equal(a: object, b: object) -> bool:
    return a == b


class DeltaTracker(Generic[K, V]):
    """Desired map, dataplane cache, and the pending updates/deletions between them."""

    def __init__(self, *, values_equal: Callable[[V, V], bool] | None = None) -> None:
        self._values_equal: Callable[[V, V], bool] = values_equal or _default_equal
        self._desired: dict[K, V] = {}
        self._dataplane: dict[K, V] = {}
        self._pending_updates: dict[K, V] = {}
        self._pending_deletions: set[K] = set()

    # --- desired side --------------------------------------------------------------------

    def set_desired(self, key: K, value: V) -> None:
        self._desired[key] = value
        self._recompute(key)

    def delete_desired(self, key: K) -> None:
        self._desired.pop(key, None)
        self._recompute(key)

    def replace_all_desired(self, desired: Mapping[K, V]) -> None:
        """Make `desired` the whole desired state (a compiler's full output, each apply):
        one pass over it, and only the keys whose desired value changed are recomputed."""
        old = self._desired
        self._desired = dict(desired)
        for key, value in self._desired.items():
            if key not in old or not self._values_equal(old[key], value):
                self._recompute(key)
        for key in old.keys() - self._desired.keys():
            self._recompute(key)

    def delete_all_desired(self) -> None:
        for key in list(self._desired):
            self.delete_desired(key)

    def get_desired(self, key: K) -> V | None:
        return self._desired.get(key)

    def iter_desired(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._desired.items()))

    def desired_keys(self) -> frozenset[K]:
        return frozenset(self._desired)

    # --- dataplane side ------------------------------------------------------------------

    def replace_all_dataplane(self, actual: Mapping[K, V] | Iterable[tuple[K, V]]) -> None:
        """Resync: `actual` is everything the kernel holds (of ours) right now."""
        items = actual.items() if isinstance(actual, Mapping) else actual
        old_keys = set(self._dataplane)
        self._dataplane = dict(items)
        for key in old_keys | set(self._dataplane) | set(self._desired):
            self._recompute(key)

    def set_dataplane(self, key: K, value: V) -> None:
        """Record that the kernel now holds `value` at `key` (call after a successful write)."""
        self._dataplane[key] = value
        self._recompute(key)

    def delete_dataplane(self, key: K) -> None:
        """Record that the kernel no longer holds `key` (after a delete, or it vanished)."""
        self._dataplane.pop(key, None)
        self._recompute(key)

    def dataplane(self) -> Mapping[K, V]:
        """The dataplane cache itself (read-only use: counting, lookups)."""
        return self._dataplane

    def get_dataplane(self, key: K) -> V | None:
        return self._dataplane.get(key)

    def iter_dataplane(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._dataplane.items()))

    # --- pending work --------------------------------------------------------------------

    def pending_updates(self) -> list[tuple[K, V]]:
        """Snapshot of (key, desired value) to write; safe to mutate the tracker meanwhile."""
        return list(self._pending_updates.items())

    def pending_deletions(self) -> list[K]:
        """Snapshot of keys to remove from the dataplane."""
        return list(self._pending_deletions)

    def is_pending_update(self, key: K) -> bool:
        return key in self._pending_updates

    def is_pending_deletion(self, key: K) -> bool:
        return key in self._pending_deletions

    def mark_update_applied(self, key: K) -> None:
        """Shorthand: the pending update for `key` was written successfully."""
        value = self._pending_updates.get(key)
        if value is not None:
            self.set_dataplane(key, value)

    def mark_deletion_applied(self, key: K) -> None:
        self.delete_dataplane(key)

    @property
    def in_sync(self) -> bool:
        return not self._pending_updates and not self._pending_deletions

    def __len__(self) -> int:
        return len(self._desired)

    # --- internals -----------------------------------------------------------------------

    def _recompute(self, key: K) -> None:
        in_desired = key in self._desired
        in_dataplane = key in self._dataplane
        if in_desired and (
            not in_dataplane or not self._values_equal(self._dataplane[key], self._desired[key])
        ):
            self._pending_updates[key] = self._desired[key]
        else:
            self._pending_updates.pop(key, None)
        if in_dataplane and not in_desired:
            self._pending_deletions.add(key)
        else:
            self._pending_deletions.discard(key)

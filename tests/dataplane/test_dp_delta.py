"""DeltaTracker: pending work always equals the difference between desired and dataplane."""

from __future__ import annotations

import random

from pyfelix.agent.dataplane.delta import DeltaTracker


def _check_invariants(t: DeltaTracker[str, int], desired: dict, dataplane: dict) -> None:
    expected_updates = {
        k: v for k, v in desired.items() if k not in dataplane or dataplane[k] != v
    }
    expected_deletes = {k for k in dataplane if k not in desired}
    assert dict(t.pending_updates()) == expected_updates
    assert set(t.pending_deletions()) == expected_deletes
    assert t.in_sync == (not expected_updates and not expected_deletes)


def test_new_desired_key_is_pending_until_applied() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.set_desired("a", 1)
    assert t.pending_updates() == [("a", 1)]
    t.mark_update_applied("a")
    assert t.pending_updates() == []
    assert t.get_dataplane("a") == 1
    assert t.in_sync


def test_resync_finds_drift_and_stale_keys() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.set_desired("a", 1)
    t.set_desired("b", 2)
    t.replace_all_dataplane({"a": 1, "b": 3, "stale": 9})
    assert t.pending_updates() == [("b", 2)]
    assert t.pending_deletions() == ["stale"]
    t.mark_deletion_applied("stale")
    t.mark_update_applied("b")
    assert t.in_sync


def test_deleting_desired_key_present_in_dataplane_is_a_pending_deletion() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.replace_all_dataplane({"a": 1})
    t.set_desired("a", 1)
    assert t.in_sync
    t.delete_desired("a")
    assert t.pending_deletions() == ["a"]
    t.set_desired("a", 1)  # re-added before apply: nothing to do
    assert t.in_sync


def test_failed_write_stays_pending() -> None:
    t: DeltaTracker[str, int] = DeltaTracker()
    t.set_desired("a", 1)
    for _key, _value in t.pending_updates():
        pass  # the write "failed": no mark_update_applied
    assert t.is_pending_update("a")


def test_custom_equality_compares_only_what_the_kernel_reports() -> None:
    t: DeltaTracker[str, tuple[str, str]] = DeltaTracker(values_equal=lambda a, b: a[0] == b[0])
    t.set_desired("chain", ("hash1", "full rule text"))
    t.replace_all_dataplane({"chain": ("hash1", "")})
    assert t.in_sync
    t.replace_all_dataplane({"chain": ("hash0", "")})
    assert t.pending_updates() == [("chain", ("hash1", "full rule text"))]


def test_random_operation_sequences_keep_invariants() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        t: DeltaTracker[str, int] = DeltaTracker()
        desired: dict[str, int] = {}
        dataplane: dict[str, int] = {}
        for _ in range(40):
            key = rng.choice("abcdef")
            value = rng.randint(0, 2)
            op = rng.randrange(6)
            if op == 0:
                t.set_desired(key, value)
                desired[key] = value
            elif op == 1:
                t.delete_desired(key)
                desired.pop(key, None)
            elif op == 2:
                t.set_dataplane(key, value)
                dataplane[key] = value
            elif op == 3:
                t.delete_dataplane(key)
                dataplane.pop(key, None)
            elif op == 4:
                actual = {k: rng.randint(0, 2) for k in rng.sample("abcdef", rng.randint(0, 6))}
                t.replace_all_dataplane(actual)
                dataplane = dict(actual)
            else:
                for k, v in t.pending_updates():
                    t.mark_update_applied(k)
                    dataplane[k] = v
                for k in t.pending_deletions():
                    t.mark_deletion_applied(k)
                    dataplane.pop(k, None)
            _check_invariants(t, desired, dataplane)

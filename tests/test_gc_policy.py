"""agent.gc_policy: when the collector is settled, frozen, and fully run."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.gc_policy import GcPolicy


class RecordingGc:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.frozen = 0

    def collect(self) -> int:
        self.calls.append("collect")
        return 3

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.frozen += 10

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.frozen = 0

    def get_freeze_count(self) -> int:
        return self.frozen


def test_nothing_happens_before_the_dataplane_is_in_sync():
    fake = RecordingGc()
    policy = GcPolicy(gc_module=fake)
    for t in range(100):
        policy.tick(float(t), in_sync=False)
    assert fake.calls == []


def test_first_in_sync_tick_settles_then_refreezes_and_fully_collects_on_schedule():
    fake = RecordingGc()
    policy = GcPolicy(refreeze_interval=10, full_interval=30, gc_module=fake)
    policy.tick(5.0, in_sync=True)
    assert fake.calls == ["collect", "freeze"]
    for t in (6.0, 10.0, 14.9):
        policy.tick(t, in_sync=True)
    assert len(fake.calls) == 2
    policy.tick(15.0, in_sync=True)  # refreeze: only the unfrozen objects are walked
    policy.tick(25.0, in_sync=True)
    assert fake.calls[2:] == ["collect", "freeze"] * 2
    policy.tick(35.0, in_sync=True)  # full pass: frozen objects are examined again
    assert fake.calls[6:] == ["unfreeze", "collect", "freeze"]
    before = REGISTRY.get_sample_value("pyfelix_gc_collected_objects_total",
                                       {"pass": "young"}) or 0.0
    policy.tick(45.0, in_sync=True)
    assert fake.calls[9:] == ["collect", "freeze"]
    assert policy.settles == 5
    assert REGISTRY.get_sample_value("pyfelix_gc_collected_objects_total",
                                     {"pass": "young"}) == before + 3


def test_losing_sync_later_does_not_stop_the_schedule():
    # once the state is frozen, refreezing stays useful even while a resync is running
    fake = RecordingGc()
    policy = GcPolicy(refreeze_interval=10, full_interval=100, gc_module=fake)
    policy.tick(0.0, in_sync=True)
    policy.tick(10.0, in_sync=False)
    assert fake.calls == ["collect", "freeze"] * 2


def test_bad_intervals_are_refused():
    with pytest.raises(ValueError, match="refreeze_interval"):
        GcPolicy(refreeze_interval=0)
    with pytest.raises(ValueError, match="full_interval"):
        GcPolicy(refreeze_interval=10, full_interval=5)


def test_real_settle_moves_live_objects_to_the_permanent_generation():
    keep = [{"n": [i]} for i in range(1000)]  # dicts holding lists: tracked by the collector
    assert gc.is_tracked(keep[0])
    assert any(d is keep[0] for d in gc.get_objects())  # scanned before the settle
    try:
        frozen_before = gc.get_freeze_count()
        GcPolicy().settle()
        assert gc.get_freeze_count() >= frozen_before + len(keep)
        assert not any(d is keep[0] for d in gc.get_objects())  # frozen: no longer scanned
    finally:
        gc.unfreeze()
    assert any(d is keep[0] for d in gc.get_objects())

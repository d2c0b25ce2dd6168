"""Driver loop: batching, apply order, InSync gating, retry with backoff, resync, fail-closed."""

from __future__ import annotations

import random
import threading
import time

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import InSync, IPSetRemove
from tests.fakes.clock import FakeClock


class RecordingManager(ManagerBase):
    """A manager whose 'kernel' is a list: apply() copies desired into it, or fails."""

    def __init__(self, name: str, journal: list[str], *, critical: bool = False) -> None:
        super().__init__()
        self.name = name
        self.policy_critical = critical
        self.journal = journal
        self.desired: list[object] = []
        self.kernel: list[object] = []
        self.fail_applies = 0
        self.fail_finish = 0
        self.resyncs = 0

    def on_update(self, msg: object) -> None:
        if isinstance(msg, IPSetRemove):
            self.desired.append(msg.id)

    def apply(self) -> None:
        self.journal.append(f"{self.name}.apply")
        if self._resync_requested:
            self.resyncs += 1
            self._resync_requested = False
        if self.fail_applies:
            self.fail_applies -= 1
            raise OSError(f"{self.name} injected failure")
        self.kernel = list(self.desired)

    def finish_apply(self) -> None:
        self.journal.append(f"{self.name}.finish")
        if self.fail_finish:
            self.fail_finish -= 1
            raise OSError(f"{self.name} finish failure")


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _loop(managers, clock, **kw) -> DataplaneLoop:
    return DataplaneLoop(managers, clock=clock, rng=random.Random(7), **kw)


def test_no_apply_before_insync_then_ordered_two_phase_round() -> None:
    journal: list[str] = []
    a, b = RecordingManager("a", journal), RecordingManager("b", journal)
    clock = FakeClock()
    loop = _loop([a, b], clock)
    loop.enqueue(IPSetRemove("s1"))
    assert loop.run_once() is False
    assert journal == [] and a.kernel == []
    loop.enqueue(InSync())
    assert loop.run_once() is True
    assert journal == ["a.apply", "b.apply", "a.finish", "b.finish"]
    assert a.kernel == ["s1"] and b.kernel == ["s1"]
    assert loop.in_sync.is_set()
    journal.clear()
    assert loop.run_once() is False  # nothing new: no round
    assert journal == []


def test_failed_round_retries_after_backoff_and_counts_failures() -> None:
    journal: list[str] = []
    a = RecordingManager("a", journal)
    clock = FakeClock()
    loop = _loop([a], clock, retry_initial=1.0, retry_max=8.0)
    before = _metric("felix_int_dataplane_failures_total")
    a.fail_applies = 3
    loop.enqueue(IPSetRemove("s1"))
    loop.enqueue(InSync())
    delays = []
    assert loop.run_once() is True
    for _ in range(3):
        assert loop.next_retry_at is not None
        delay = loop.next_retry_at - clock.monotonic()
        delays.append(delay)
        assert loop.run_once() is False  # too early
        clock.advance(delay)
        assert loop.run_once() is True
    assert a.kernel == ["s1"]
    assert not a.fail_applies and loop.consecutive_failures == 0
    assert _metric("felix_int_dataplane_failures_total") - before == 3
    assert loop.in_sync.is_set()
    # exponential with jitter in [0.75, 1.25]
    for i, d in enumerate(delays):
        assert 0.75 * 2**i <= d <= 1.25 * 2**i


def test_finish_phase_skipped_when_any_apply_failed() -> None:
    journal: list[str] = []
    a, b = RecordingManager("a", journal), RecordingManager("b", journal)
    clock = FakeClock()
    loop = _loop([a, b], clock)
    b.fail_applies = 1
    loop.enqueue(InSync())
    loop.run_once()
    assert journal == ["a.apply", "b.apply"]
    assert not loop.in_sync.is_set()


def test_periodic_resync_requests_kernel_reread() -> None:
    journal: list[str] = []
    a = RecordingManager("a", journal)
    clock = FakeClock()
    loop = _loop([a], clock, resync_interval=30.0)
    loop.enqueue(InSync())
    loop.run_once()
    assert a.resyncs == 1  # the first apply always reads the kernel
    clock.advance(29.0)
    assert loop.run_once() is False
    clock.advance(1.0)
    assert loop.run_once() is True
    assert a.resyncs == 2


def test_policy_critical_failure_beyond_bound_fails_closed() -> None:
    journal: list[str] = []
    routes = RecordingManager("routes", journal)
    policy = RecordingManager("policy", journal, critical=True)
    clock = FakeClock()
    reasons: list[str] = []
    loop = _loop([policy, routes], clock, fail_closed_after=10.0, retry_max=2.0,
                 on_fatal=reasons.append)
    policy.fail_applies = 10**6
    routes.fail_applies = 10**6
    loop.enqueue(InSync())
    while not loop.fatal.is_set():
        loop.run_once()
        assert clock.monotonic() < 1000.0 + 60, "fail-closed never triggered"
        if loop.next_retry_at is not None:
            clock.advance(max(0.0, loop.next_retry_at - clock.monotonic()))
    assert len(reasons) == 1 and "policy" in reasons[0] and "bound 10.0" in reasons[0]
    assert loop.fatal_reason == reasons[0]


def test_non_critical_failures_never_fail_closed() -> None:
    journal: list[str] = []
    routes = RecordingManager("routes", journal)
    clock = FakeClock()
    loop = _loop([routes], clock, fail_closed_after=5.0, retry_max=2.0)
    routes.fail_applies = 50
    loop.enqueue(InSync())
    for _ in range(50):
        loop.run_once()
        clock.advance(3.0)
    assert not loop.fatal.is_set()


def test_bad_message_does_not_stop_other_managers() -> None:
    journal: list[str] = []

    class Broken(RecordingManager):
        def on_update(self, msg: object) -> None:
            raise ValueError("bad input")

    broken, good = Broken("broken", journal), RecordingManager("good", journal)
    loop = _loop([broken, good], FakeClock())
    loop.enqueue(IPSetRemove("x"))
    loop.enqueue(InSync())
    loop.run_once()
    assert good.kernel == ["x"]


def test_thread_applies_promptly_and_stops() -> None:
    journal: list[str] = []
    a = RecordingManager("a", journal)
    loop = DataplaneLoop([a], resync_interval=3600)
    loop.start()
    try:
        loop.enqueue(IPSetRemove("s"))
        loop.enqueue(InSync())
        assert loop.in_sync.wait(5.0)
        assert a.kernel == ["s"]
    finally:
        loop.stop()
    assert not any(t.name == "dataplane-loop" and t.is_alive() for t in threading.enumerate())


def test_thread_retries_failures_on_real_clock() -> None:
    journal: list[str] = []
    a = RecordingManager("a", journal)
    loop = DataplaneLoop([a], resync_interval=3600, retry_initial=0.01, retry_max=0.05)
    a.fail_applies = 3
    loop.start()
    try:
        loop.enqueue(InSync())
        deadline = time.monotonic() + 5
        while not loop.in_sync.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.in_sync.is_set()
        assert journal.count("a.apply") == 4
    finally:
        loop.stop()


def test_invalid_configuration_is_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="retry_max"):
        DataplaneLoop([], retry_initial=5.0, retry_max=1.0)


class BlockingManager(RecordingManager):
    """apply() blocks on `release` while `armed` is set, as a manager stuck in a syscall."""

    def __init__(self) -> None:
        super().__init__("stuck", [])
        self.armed = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()

    def apply(self) -> None:
        if self.armed.is_set():
            self.blocked.set()
            self.release.wait(10)
        super().apply()


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_idle_loop_heartbeats_on_a_timer() -> None:
    beats: list[float] = []
    loop = DataplaneLoop([RecordingManager("a", [])], resync_interval=3600,
                         heartbeat=lambda: beats.append(time.monotonic()),
                         heartbeat_interval=0.05)
    loop.start()
    try:
        # nothing queued and the next resync an hour away: the wait is cut to the interval
        assert _wait_until(lambda: len(beats) >= 6, 2.0)
    finally:
        loop.stop()


def test_heartbeats_stop_while_apply_blocks_and_resume_after() -> None:
    stuck = BlockingManager()
    beats: list[float] = []
    loop = DataplaneLoop([stuck], resync_interval=3600,
                         heartbeat=lambda: beats.append(time.monotonic()),
                         heartbeat_interval=0.05)
    loop.start()
    try:
        loop.enqueue(InSync())
        assert loop.in_sync.wait(5.0)
        stuck.armed.set()
        loop.enqueue(IPSetRemove("s"))
        assert stuck.blocked.wait(5.0)
        count = len(beats)
        time.sleep(0.3)  # six intervals: a loop that still beat here would hide a hang
        assert len(beats) == count
        stuck.armed.clear()
        stuck.release.set()
        assert _wait_until(lambda: len(beats) >= count + 3, 2.0)
        assert stuck.kernel == ["s"]
    finally:
        stuck.release.set()
        loop.stop()


def test_a_failing_heartbeat_does_not_stop_the_loop() -> None:
    def broken() -> None:
        raise RuntimeError("health aggregator broken")

    a = RecordingManager("a", [])
    loop = DataplaneLoop([a], resync_interval=3600, heartbeat=broken, heartbeat_interval=0.05)
    loop.start()
    try:
        loop.enqueue(IPSetRemove("s"))
        loop.enqueue(InSync())
        assert loop.in_sync.wait(5.0) and a.kernel == ["s"]
    finally:
        loop.stop()


def test_datastore_not_ready_pauses_every_kernel_write_until_ready() -> None:
    """ClusterInformation datastoreReady false (DatastoreReady(False)): no apply round, not
    even a resync; the desired state still follows; ready again -> one round writes it."""
    from pyfelix.agent.proto import DatastoreReady

    journal: list[str] = []
    a = RecordingManager("a", journal)
    clock = FakeClock()
    loop = _loop([a], clock, resync_interval=10.0)
    loop.enqueue(IPSetRemove("s1"))
    loop.enqueue(InSync())
    assert loop.run_once() is True and a.kernel == ["s1"]
    loop.enqueue(DatastoreReady(ready=False))
    loop.enqueue(IPSetRemove("s2"))
    assert loop.run_once() is False
    clock.advance(30.0)  # past the resync interval
    assert loop.run_once() is False
    assert a.kernel == ["s1"] and a.desired == ["s1", "s2"] and loop.paused
    assert _metric("pyfelix_dataplane_paused") == 1.0
    loop.enqueue(DatastoreReady(ready=True))
    assert loop.run_once() is True
    assert a.kernel == ["s1", "s2"] and not loop.paused
    assert _metric("pyfelix_dataplane_paused") == 0.0


def test_paused_from_the_start_never_applies() -> None:
    from pyfelix.agent.proto import DatastoreReady

    journal: list[str] = []
    a = RecordingManager("a", journal)
    loop = _loop([a], FakeClock())
    for msg in (DatastoreReady(ready=False), IPSetRemove("s1"), InSync()):
        loop.enqueue(msg)
    assert loop.run_once() is False
    assert journal == [] and not loop.in_sync.is_set()


class _BlockingManager(ManagerBase):
    """apply() waits until released: a round that takes a while."""

    name = "blocking"

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def on_update(self, msg: object) -> None:
        pass

    def apply(self) -> None:
        self.entered.set()
        assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("injected")


def test_settled_only_once_every_enqueued_message_is_applied() -> None:
    """The queue is empty while a drained batch is being applied: `settled()` must not say
    so (the agent's status file reports idle from it, and the lab probes on idle)."""
    manager = _BlockingManager()
    clock = FakeClock()
    loop = DataplaneLoop([manager], clock=clock, rng=random.Random(1))
    assert loop.settled()
    loop.enqueue(InSync())
    assert not loop.settled()  # enqueued, not yet taken
    worker = threading.Thread(target=loop.run_once, args=(1.0,))
    worker.start()
    assert manager.entered.wait(5)
    assert loop.queue.empty() and not loop.settled()  # drained, round still running
    manager.release.set()
    worker.join(5)
    assert loop.settled()
    # a failed round leaves the work pending: not settled until a round succeeds
    manager.entered.clear()
    manager.fail = True
    loop.enqueue(IPSetRemove("s"))
    loop.run_once(1.0)
    assert not loop.settled()
    manager.fail = False
    assert loop.next_retry_at is not None
    clock.advance(loop.next_retry_at - clock.monotonic())
    loop.run_once(0.0)
    assert loop.settled()

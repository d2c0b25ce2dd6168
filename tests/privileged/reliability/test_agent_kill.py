"""`kill -9` of the agent under traffic, and what a restarted agent does to the dataplane.

1. Flows survive and the restart reconciles: the agent programs case A (x/a admits only x/b);
   long-lived TCP flows run between pods (an echo every 50 ms; a break = 2 s without echo or
   any socket error). The agent is killed with SIGKILL; while it is dead the flows keep going
   (the kernel holds the programmed dataplane) and the datastore moves to case B (x/a admits
   only x/c). A new agent starts: it must enforce B exactly (the whole expected matrix), no
   flow may break over the episode, and its iptables/ipset state must equal what applying A
   then B afresh produces.
2. A restarted agent must not touch what is already right: no pod route is deleted while it
   starts (Felix sweeps stale routes only once it knows both the datastore and the
   interfaces). UDP flows, which have no retransmission to hide a gap, must not lose an echo.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import pytest

from pyfelix.lab.conformance import CASES_BY_NAME
from tests.privileged.reliability.harness import (
    AgentUnderTest,
    Flow,
    FlowKeeper,
    conformance_lab,
    dataplane_snapshot,
    describe,
    snapshot_difference,
)

pytestmark = pytest.mark.privileged
CASES = CASES_BY_NAME
CASE_A = CASES["k8s-pod-selector"]        # x/a admits only x/b
CASE_B = CASES["k8s-policy-update"]       # x/a admits only x/c (same policy, updated)
DEAD_SECONDS = 2.0
ROUTE_PROTOCOL = "80"  # FELIX_ROUTETABLEPROTOCOL default


def _broken(keeper: FlowKeeper, killed_at: float) -> list[str]:
    return [f"{f}: {f.broken}; last echo {f.last_echo - killed_at:+.2f}s after the kill"
            for f in keeper.broken]


@pytest.mark.timeout(180)
def test_kill9_under_traffic_breaks_no_flow_and_restart_reconciles(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = AgentUnderTest()
    flows = [Flow("x/b", "x/a", 80, "TCP"), Flow("y/a", "z/b", 81, "TCP"),
             Flow("x/a", "y/b", 80, "TCP"), Flow("z/c", "x/c", 81, "TCP")]
    with conformance_lab(agent) as lab:
        lab.enter(CASE_A)
        assert not (bad := lab.mismatches(CASE_A)), describe(bad)
        with FlowKeeper(lab, flows) as keeper:
            killed_at = time.monotonic()
            agent.kill9()
            assert agent.exit_code() == -signal.SIGKILL
            lab.enter(CASE_B, wait=False)  # the datastore changes while nobody listens
            time.sleep(DEAD_SECONDS)
            restarted_at = time.monotonic()
            agent.spawn()
            lab.runner.wait_in_sync()
            synced_at = time.monotonic()
            time.sleep(0.5)
        dead_echoes = keeper.echoes_between(killed_at, restarted_at)
        assert not keeper.broken, _broken(keeper, killed_at)
        assert all(n > 0 for n in dead_echoes.values()), dead_echoes  # traffic flowed
        assert not (bad := lab.mismatches(CASE_B)), describe(bad)
        after_restart = dataplane_snapshot(agent.netns)
        lab.enter(CASE_A)
        lab.enter(CASE_B)
        clean = dataplane_snapshot(agent.netns)
        assert after_restart == clean, snapshot_difference(after_restart, clean)
        with capsys.disabled():
            print(f"\nkill -9 under traffic: 1 fault injected and survived; {len(flows)} TCP "
                  f"flows, {sum(f.round_trips for f in flows)} round trips, "
                  f"{len(keeper.broken)} broken; {sum(dead_echoes.values())} echoes while the "
                  f"agent was dead; restarted agent in sync after "
                  f"{synced_at - restarted_at:.1f}s")
    root_guard.check()


@pytest.mark.timeout(120)
def test_restarted_agent_deletes_no_pod_route(root_guard: Any) -> None:
    agent = AgentUnderTest()
    flows = [Flow("z/c", "y/c", 80, "UDP"), Flow("y/b", "x/c", 80, "UDP")]
    with conformance_lab(agent) as lab:
        lab.enter(CASE_A)
        with FlowKeeper(lab, flows) as keeper:
            monitor = subprocess.Popen(["ip", "-n", agent.netns, "monitor", "route"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
            try:
                time.sleep(0.3)  # the monitor is listening
                killed_at = time.monotonic()
                agent.kill9()
                agent.spawn()
                lab.runner.wait_in_sync()
                time.sleep(0.5)
            finally:
                monitor.terminate()
                events = monitor.communicate(timeout=5)[0].splitlines()
        deleted = [e for e in events if e.startswith("Deleted") and
                   f"proto {ROUTE_PROTOCOL}" in e]
        assert deleted == [], f"the restarted agent deleted {len(deleted)} pod route(s) " \
                              f"and re-added them: {deleted[:3]}"
        assert not keeper.broken, _broken(keeper, killed_at)
        assert not (bad := lab.mismatches(CASE_A)), describe(bad)
    root_guard.check()

"""Workload interfaces flapping (host side of the pod veth down/up): the kernel drops the
pod routes with the link; the agent must put them back and policy must hold exactly.

1. Rapid flaps: x/a's and y/b's host interfaces go down and up 5 times each, 50 ms apart,
   while the agent enforces a policy. Afterwards (bounded wait) both pod routes are back with
   the agent's protocol and the whole expected matrix holds.
2. A policy change while an interface is down: x/a's interface goes down and the datastore
   moves to another case; meanwhile x/a is unreachable (no route) and every cell not
   involving x/a matches the new case; once the interface is up again its route returns and
   the NEW case's whole matrix holds.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from pyfelix.lab.conformance import CASES_BY_NAME
from pyfelix.lab.conformance.matrix import expected_cells
from tests.privileged.reliability.harness import (
    AgentUnderTest,
    ConformanceLab,
    conformance_lab,
    describe,
    wait_for,
)

pytestmark = pytest.mark.privileged
CASES = CASES_BY_NAME
CASE_A = CASES["k8s-pod-selector"]          # x/a admits only x/b
CASE_B = CASES["k8s-policy-update"]         # x/a admits only x/c
ROUTE_PROTOCOL = 80
FLAPS = 5
RECOVERY_TIMEOUT_S = 15.0


def _set_link(lab: ConformanceLab, pod: str, state: str) -> None:
    subprocess.run(["ip", "-n", lab.agent.netns, "link", "set", lab.host_interface(pod), state],
                   check=True, timeout=10)


def _pod_route(lab: ConformanceLab, pod: str) -> dict[str, Any] | None:
    ip = str(lab.runner.topology.pods[pod].spec.ip)
    routes = json.loads(subprocess.run(
        ["ip", "-n", lab.agent.netns, "-j", "route", "show", f"{ip}/32"],
        check=True, capture_output=True, text=True, timeout=10).stdout or "[]")
    for route in routes:
        if route.get("dev") == lab.host_interface(pod):
            return dict(route)
    return None


def _routes_back(lab: ConformanceLab, pods: list[str]) -> bool:
    for pod in pods:
        route = _pod_route(lab, pod)
        if route is None or str(route.get("protocol")) != str(ROUTE_PROTOCOL):
            return False
    return True


@pytest.mark.timeout(180)
def test_flapping_workload_interfaces_get_routes_and_policy_back(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = AgentUnderTest()
    flapped = ["x/a", "y/b"]
    with conformance_lab(agent) as lab:
        lab.enter(CASE_A)
        assert _routes_back(lab, flapped)
        started = time.monotonic()
        for _ in range(FLAPS):
            for pod in flapped:
                _set_link(lab, pod, "down")
            assert all(_pod_route(lab, pod) is None for pod in flapped)  # the kernel's doing
            time.sleep(0.05)
            for pod in flapped:
                _set_link(lab, pod, "up")
            time.sleep(0.05)
        wait_for(lambda: _routes_back(lab, flapped), RECOVERY_TIMEOUT_S, "pod routes back")
        recovered = time.monotonic() - started
        lab.runner.wait_in_sync()
        assert not (bad := lab.mismatches(CASE_A)), describe(bad)

        # a policy change while x/a's interface is down
        _set_link(lab, "x/a", "down")
        lab.enter(CASE_B)
        down_results = lab.prober.run([c for c in expected_cells(CASE_B) if c.target == "x/a"])
        assert not any(r.got for r in down_results)  # no route, no traffic to x/a
        others = [c for c in expected_cells(CASE_B) if "x/a" not in (c.source, c.target)]
        assert not (bad := [r for r in lab.prober.run(others) if r.mismatch]), describe(bad)
        _set_link(lab, "x/a", "up")
        wait_for(lambda: _routes_back(lab, ["x/a"]), RECOVERY_TIMEOUT_S, "x/a's route back")
        lab.runner.wait_in_sync()
        assert not (bad := lab.mismatches(CASE_B)), describe(bad)
        with capsys.disabled():
            print(f"\ninterface flapping: {FLAPS * len(flapped) + 1} link flaps injected and "
                  f"survived; routes back {recovered:.1f}s after the first flap; expected "
                  f"matrices hold afterwards")
    root_guard.check()

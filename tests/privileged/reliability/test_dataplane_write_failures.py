"""iptables-restore and ipset failures injected into a REAL agent: retried, nothing
half-applied, the old policy holds meanwhile, and a dataplane that cannot be programmed for
too long makes the agent exit non-zero (fail closed) rather than run open.

Injection: the agent runs with a PATH whose first directory holds wrappers named
iptables-restore, iptables-nft-restore, iptables-legacy-restore and ipset. A wrapper logs
every call and, while the test's fault file for its binary exists, swallows its input and
exits 4 (what iptables-restore returns when the xtables lock or the kernel refuses);
otherwise it execs the real binary. The agent's own code path is untouched.

Per fault: the agent enforces case X; the fault is switched on; the datastore moves to
case Y; the agent must retry (several failed calls with backoff, `felix_int_dataplane_
failures_total` counts them, the status file says not idle) while X's expected matrix
still holds exactly; the fault is switched off; Y's expected matrix must then hold, and the
final iptables/ipset state must equal what a clean re-application of the same cases gives.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.conformance import CASES_BY_NAME
from tests.privileged.reliability.harness import (
    AgentUnderTest,
    conformance_lab,
    dataplane_snapshot,
    describe,
    snapshot_difference,
    wait_for,
)

pytestmark = pytest.mark.privileged
CASES = CASES_BY_NAME
CASE_A = CASES["k8s-pod-selector"]          # an IP set (pod=b) + a policy chain
CASE_B = CASES["k8s-default-deny-ingress"]  # only rules change; A's IP set goes after them
CASE_C = CASES["k8s-namespace-selector"]    # a new IP set (namespace y)
IPTABLES_RESTORES = ("iptables-restore", "iptables-nft-restore", "iptables-legacy-restore")
FAILED_CALLS_WANTED = 3
FAILURES_METRIC = "felix_int_dataplane_failures_total"
INJECTED_EXIT = 4

_WRAPPER = """#!/bin/sh
# pyfelix reliability test wrapper for {name}: fails while {faults}/fail-{name} exists.
if [ -e "{faults}/fail-{name}" ]; then
    cat > /dev/null
    echo "{name} FAIL $*" >> "{faults}/calls.log"
    echo "{name}: injected failure (pyfelix reliability test)" >&2
    exit {code}
fi
echo "{name} OK $*" >> "{faults}/calls.log"
exec {real} "$@"
"""


class FaultInjector:
    """Wrapper binaries first on the agent's PATH, switched by files in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.bin_dir = directory / "bin"
        self.bin_dir.mkdir(parents=True)
        for name in (*IPTABLES_RESTORES, "ipset"):
            real = shutil.which(name)
            assert real is not None, f"{name} is not installed"
            wrapper = self.bin_dir / name
            wrapper.write_text(_WRAPPER.format(name=name, faults=directory, real=real,
                                               code=INJECTED_EXIT))
            wrapper.chmod(0o755)

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}

    def fail(self, *names: str) -> None:
        for name in names:
            (self.directory / f"fail-{name}").touch()

    def heal(self) -> None:
        for fault in self.directory.glob("fail-*"):
            fault.unlink()

    def calls(self, verdict: str, names: tuple[str, ...]) -> int:
        log = self.directory / "calls.log"
        if not log.exists():
            return 0
        return sum(1 for line in log.read_text().splitlines()
                   if line.split(" ", 2)[:2] in ([n, verdict] for n in names))


def _fault_round(lab: Any, agent: AgentUnderTest, injector: FaultInjector,
                 names: tuple[str, ...], before: Any, after: Any) -> dict[str, float]:
    """One fault: `before` enforced, fault on, move to `after`, check, heal, check."""
    failed_before = injector.calls("FAIL", names)
    injector.fail(*names)
    lab.enter(after, wait=False)
    wait_for(lambda: injector.calls("FAIL", names) - failed_before >= FAILED_CALLS_WANTED,
             30, f"{FAILED_CALLS_WANTED} failed {names[0]} calls (retries)")
    status = agent.status()
    assert status.get("failures", 0) >= 1 and not status.get("idle"), status
    assert not (bad := lab.mismatches(before)), "old policy not intact:\n" + describe(bad)
    failed = injector.calls("FAIL", names) - failed_before
    healed_at = time.monotonic()
    injector.heal()
    lab.runner.wait_in_sync()
    recovered = time.monotonic() - healed_at
    assert not (bad := lab.mismatches(after)), describe(bad)
    return {"failed_calls": failed, "recovery_s": recovered}


@pytest.mark.timeout(240)
def test_restore_failures_are_retried_and_leave_nothing_half_applied(
        tmp_path: Path, root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    injector = FaultInjector(tmp_path)
    agent = AgentUnderTest(extra_env={**injector.env, "FELIX_DATAPLANEFAILCLOSEDAFTER": "120"})
    with conformance_lab(agent) as lab:
        lab.enter(CASE_A)
        assert not (bad := lab.mismatches(CASE_A)), describe(bad)
        assert injector.calls("OK", IPTABLES_RESTORES) > 0  # the wrappers are really in use
        failures_before = agent.metrics().get(FAILURES_METRIC, 0.0)
        iptables = _fault_round(lab, agent, injector, IPTABLES_RESTORES, CASE_A, CASE_B)
        ipset = _fault_round(lab, agent, injector, ("ipset",), CASE_B, CASE_C)
        failures = agent.metrics().get(FAILURES_METRIC, 0.0) - failures_before
        assert failures >= 2  # at least one failed round per fault, counted
        assert agent.exit_code() is None  # retried, never crashed
        healed = dataplane_snapshot(agent.netns)
        lab.enter(CASE_B)
        lab.enter(CASE_C)
        clean = dataplane_snapshot(agent.netns)
        assert healed == clean, snapshot_difference(healed, clean)
        with capsys.disabled():
            print(f"\ndataplane write failures: 2 faults injected and survived "
                  f"(iptables-restore: {iptables['failed_calls']} failed calls, recovered "
                  f"{iptables['recovery_s']:.1f}s after healing; ipset: "
                  f"{ipset['failed_calls']} failed calls, recovered {ipset['recovery_s']:.1f}s "
                  f"after healing); {failures:g} failed apply rounds counted")
    root_guard.check()


@pytest.mark.timeout(120)
def test_dataplane_that_cannot_be_programmed_fails_closed(
        tmp_path: Path, root_guard: Any) -> None:
    injector = FaultInjector(tmp_path)
    agent = AgentUnderTest(extra_env={**injector.env, "FELIX_DATAPLANEFAILCLOSEDAFTER": "2"})
    with conformance_lab(agent) as lab:
        lab.enter(CASE_A)
        injector.fail(*IPTABLES_RESTORES)
        lab.enter(CASE_B, wait=False)
        wait_for(lambda: agent.exit_code() is not None, 30, "the agent to exit (fail closed)")
        assert agent.exit_code() != 0
        assert "failing closed" in agent.log_text()
        # the agent is gone but the last programmed policy stays in the kernel: A, not open
        assert not (bad := lab.mismatches(CASE_A)), describe(bad)
        injector.heal()
        agent.spawn(extra_env={**injector.env})  # a new agent programs the pending change
        lab.runner.wait_in_sync()
        assert not (bad := lab.mismatches(CASE_B)), describe(bad)
    root_guard.check()

"""Restart without disruption: kill -9 of the agent under a held TCP connection, a policy
deleted while it is down, restart (bench.restart.RestartExperiment).

BPF: the connection is never reset and keeps passing data while no agent runs and after
the restart; the new agent ADOPTS the pinned state (every id it finds keeps its number, its
log says so) and removes only what went stale (the deleted policy's rule is gone from the
maps, its port is denied, the other policy still allows). iptables: the same, with the
chains left in place by the killed agent. The root namespace is as before afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyfelix.bench.restart import RestartExperiment
from tests.privileged.lab.conftest import RootGuard

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def root_guard() -> RootGuard:
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, BPF)")
    return RootGuard()


def dump_ids(pin_dir: Path) -> dict[tuple[str, int], str]:
    done = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "bpf", "ids", "dump",
                           "-o", "json",
                           "--pin-dir", str(pin_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return {(r["kind"], r["id"]): r["name"] for r in json.loads(done.stdout)}


def test_bpf_restart_keeps_flows_adopts_pins_and_removes_stale_policy(root_guard: RootGuard):
    seen: dict[str, dict[tuple[str, int], str]] = {}

    def inspect(lab: Any, agents: Any, phase: str) -> None:
        seen[phase] = dump_ids(lab.bpffs_dir / "node1")

    result = RestartExperiment("bpf").run(inspect)
    assert result.failures == [] and result.established_flow_resets == 0
    assert result.messages_while_down > 0  # the dataplane worked with no agent
    assert result.messages_after_restart > 0
    assert result.probes_before == ["allow", "allow"]
    assert result.probes_after == ["allow", "deny"]
    assert "adopted pinned state" in result.log_after_restart
    before, after = seen["before_kill"], seen["after_resync"]
    # everything still wanted kept its number (adopted, not renumbered) ...
    assert after and all(before.get(k) == v for k, v in after.items())
    # ... and only the deleted policy's one rule went (rule ids are content hashes)
    gone = set(before) - set(after)
    assert len(gone) == 1 and next(iter(gone))[0] == "rule"
    root_guard.check()


def test_iptables_restart_keeps_flows_and_removes_stale_policy(root_guard: RootGuard):
    result = RestartExperiment("iptables").run()
    assert result.failures == [] and result.established_flow_resets == 0
    assert result.messages_while_down > 0 and result.messages_after_restart > 0
    assert result.probes_before == ["allow", "allow"]
    assert result.probes_after == ["allow", "deny"]
    root_guard.check()


# make test keeps the same trigger in test_config_restart.py (a FelixConfiguration restart
# parameter, the established flow kept, in BPF mode); this full experiment runs in
# make test-matrix
@pytest.mark.extended
def test_bpf_restart_by_a_configuration_change_keeps_flows(root_guard: RootGuard):
    """The same experiment, the agent exiting by itself on a FelixConfiguration change of a
    restart parameter (RouteRefreshInterval), as Felix does; the harness restarts it."""
    result = RestartExperiment("bpf", trigger="config").run()
    assert result.failures == [] and result.established_flow_resets == 0
    assert result.messages_while_down > 0 and result.messages_after_restart > 0
    assert result.probes_before == ["allow", "allow"]
    assert result.probes_after == ["allow", "deny"]
    assert "configuration changed: RouteRefreshInterval; exiting" in result.log_after_restart
    print(f"config-triggered restart: resync {result.resync_seconds:.2f} s, "
          f"{result.messages_while_down} messages echoed while down, 0 resets")
    root_guard.check()

"""`pyfelix lab run --typha`: one Typha on the first node feeds every agent and confd.

The scenario changes policy in three steps across two nodes over BGP, so each expectation
after the first step can only be met if the change travelled datastore -> Typha -> agents
(their only datastore is `typha://`, which the JSON report states).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIO = REPO / "tests" / "lab" / "scenarios" / "two-node-typha-steps.yaml"


def test_two_nodes_through_typha_follow_policy_changes(root_guard: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(SCENARIO), "-o", "json",
         "--dataplane", "iptables", "--typha", "--probe-timeout", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["agents"]["datastore"].startswith("typha://198.18.")
    assert report["agents"]["typha"] and report["agents"]["bgp"]
    got = [(p["step"], p["from"], p["to"], p["result"]) for p in report["probes"]]
    assert got == [(0, "x/b", "x/a", "allow"), (0, "x/c", "x/a", "allow"),
                   (1, "x/b", "x/a", "allow"), (1, "x/c", "x/a", "deny"),
                   (1, "x/a", "x/c", "allow"), (2, "x/c", "x/a", "allow")]
    root_guard.check()


def test_typha_without_agents_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(SCENARIO), "--no-agent",
         "--typha"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--typha" in done.stderr

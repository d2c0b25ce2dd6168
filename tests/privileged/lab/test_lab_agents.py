"""`pyfelix lab run` with REAL agents in the node namespaces: policy is enforced end to end.

Each case is a scenario with `expect` on every probe; the lab exits 0 only when every probe
came out as expected. The shared example scenarios are run on every dataplane that exists.
The root namespace must be as before afterwards (root_guard).
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
SCENARIOS = REPO / "tests" / "lab" / "scenarios"
DATAPLANES = ["iptables", "bpf"]


def lab_run(scenario: Path, dataplane: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(scenario), "-o", "json",
         "--dataplane", dataplane, "--probe-timeout", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("dataplane", DATAPLANES)
@pytest.mark.parametrize("scenario", ["calico-gnp-order.yaml", "k8s-allow-from-namespace.yaml"])
def test_shared_scenarios_pass(scenario: str, dataplane: str, root_guard: Any) -> None:
    done = lab_run(SCENARIOS / scenario, dataplane)
    assert done.returncode == 0, done.stdout + done.stderr
    probes = json.loads(done.stdout)["probes"]
    assert probes and all(p["result"] == p["expect"] for p in probes)
    # the scenarios deny something: a lab that enforced nothing could not pass
    assert any(p["result"] == "deny" for p in probes)
    root_guard.check()

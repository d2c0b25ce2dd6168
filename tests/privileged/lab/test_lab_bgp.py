"""Issue #7's lab acceptance: a two-node scenario with a NetworkPolicy passes on each
dataplane, with pods on different nodes reachable ONLY through BGP-learned routes.

With real agents the lab programs no routes of its own (no static cross-node routes, no
/32s): the agent's route manager adds the local /32s, confd renders BIRD's config, and
BIRD exports them to the other node. `AgentProcesses` waits until every node has a
`proto bird` route covering every remote pod before the probes run, so an allowed
cross-node probe that connects proves the BGP path.
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
SCENARIO = REPO / "tests" / "lab" / "scenarios" / "two-node-policy.yaml"


# BPF's two nodes over BGP are also the conformance suite's cross-node sample in make test
# (tests/privileged/conformance), so the BPF case here is extended (make test-matrix)
@pytest.mark.parametrize("dataplane", [pytest.param("bpf", marks=pytest.mark.extended),
                                       "iptables"])
def test_two_nodes_over_bgp_with_policy(dataplane: str, root_guard: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(SCENARIO), "-o", "json",
         "--dataplane", dataplane, "--probe-timeout", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    probes = json.loads(done.stdout)["probes"]
    assert [p["result"] for p in probes] == ["allow", "deny", "deny", "allow", "allow"]
    root_guard.check()

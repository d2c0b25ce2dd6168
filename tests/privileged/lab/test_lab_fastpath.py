"""The BPF fast path (BPFRedirectToPeer) in a real lab: pod-to-pod traffic on one node is
redirected from the source's host interface straight to the destination's, past the node's
routing, iptables and kernel conntrack, and the destination's ingress policy still decides.

Scenario calico-gnp-order (tests/lab/scenarios): prod/api admits TCP 443 from anyone but the
scanner, and nothing else; prod/client admits everything. Both settings of
BPFRedirectToPeer run the same probes with the same verdicts; with Enabled the global counter
`fastpath_redirected` grows and the node's kernel conntrack table holds no entry for the
allowed pod-to-pod flows (they never reached netfilter), with Disabled the counter stays at 0
and the kernel conntrack sees them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.bpf.loader import resolve_pin_dir
from pyfelix.agent.bpf.maps import dump_pinned
from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import load_scenario

pytestmark = pytest.mark.privileged

SCENARIO = Path(__file__).resolve().parents[2] / "lab" / "scenarios" / "calico-gnp-order.yaml"


def _globals(lab: LabRunner, node: str) -> dict[str, int]:
    assert lab.bpffs_dir is not None
    pin_dir = resolve_pin_dir(lab.bpffs_dir / node, mount=False)
    return {row["counter"]: int(row["value"])
            for row in dump_pinned("global_counters", str(pin_dir))}


def _kernel_conntrack(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/nf_conntrack"],
                          capture_output=True, text=True, check=True, timeout=30).stdout


@pytest.mark.parametrize("redirect", ["Enabled", "Disabled"])
def test_pod_to_pod_skips_the_host_stack_and_keeps_policy(redirect: str,
                                                          root_guard: Any) -> None:
    scenario = load_scenario(SCENARIO)
    agents = AgentProcesses("bpf", extra_env={"FELIX_BPFREDIRECTTOPEER": redirect})
    with LabRunner(scenario, agents=agents, dataplane="bpf", program_routes=False,
                   probe_timeout=2.0) as lab:
        lab.build()
        lab.start_agents()
        node = next(iter(lab.topology.nodes))
        results = lab.run_steps()
        assert not (wrong := [r.to_json() for r in results if r.mismatch]), wrong
        assert any(r.result == "deny" for r in results)  # policy was in force
        after = _globals(lab, node)
        redirected = after["fastpath_redirected"]  # a fresh build's counters start at 0
        table = _kernel_conntrack(lab.topology.nodes[node].netns)
        allowed = [r for r in results if r.result == "allow"]
        seen = [r for r in allowed if f"dst={r.probe.target_ip} " in table]
        if redirect == "Enabled":
            # every allowed probe's packets, both directions, went past the host stack
            assert redirected >= 2 * len(allowed), after
            assert not seen, [r.to_json() for r in seen]
        else:
            assert redirected == 0, after
            assert len(seen) == len(allowed), table
    root_guard.check()

"""Issue 26's second acceptance line: a floating IP reaches its pod, and policy denies what
it denies for the pod IP - on both dataplanes, over two nodes.

The scenario gives pod x/a (node1) the floating IP 10.65.200.1 (Calico's floatingIPs
annotation) with FloatingIPs Enabled, and probes the floating IP and the pod IP with the
same clients and ports (from node2, and from node1): the verdicts must be equal pairwise,
with denials among them. The test also checks the mechanism: node1's nat table DNATs the
floating IP to the pod, and node2 reaches it through a BGP route (BIRD learned the agent's
route for the floating IP). With FloatingIPs Disabled the same annotation programs nothing
and the floating IP is unreachable (the allowed probe to it fails), so the first run's
success is the feature's doing. Dual stack (issue 18, `extended`): the same scenario under
`--ip-family dual` through the CLI, each IPv6 probe (to the floating IP's IPv6 twin, NATed
in ip6tables' nat table) with its IPv4 twin's verdict.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import Step, load_scenario

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIO = REPO / "tests" / "lab" / "scenarios" / "two-node-floating-ip.yaml"
FLOATING_IP = "10.65.200.1"


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_floating_ip_reaches_its_pod_with_the_pod_ips_policy(dataplane: str,
                                                             root_guard: Any) -> None:
    scenario = load_scenario(SCENARIO)
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=0.5) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert not (wrong := [r.to_json() for r in results if r.mismatch]), wrong
        verdicts = {(r.probe.source, str(r.probe.target_ip), r.probe.port): r.result
                    for r in results}
        pod_ip = str(lab.topology.pods["x/a"].spec.ip)
        pairs = [(key, (key[0], pod_ip, key[2])) for key in verdicts if key[1] == FLOATING_IP]
        for fip_key, pod_key in pairs:
            if pod_key in verdicts:
                assert verdicts[fip_key] == verdicts[pod_key], (fip_key, verdicts)
        assert {verdicts[k] for k, _ in pairs} == {"allow", "deny"}
        node1, node2 = (lab.topology.nodes[n].netns for n in ("node1", "node2"))
        nat = subprocess.run(["ip", "netns", "exec", node1, "iptables-save", "-t", "nat"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        assert re.search(rf"-d {re.escape(FLOATING_IP)}/32 .*-j DNAT --to-destination "
                         rf"{re.escape(pod_ip)}\b", nat), nat
        routes = json.loads(subprocess.run(
            ["ip", "-n", node2, "-j", "route", "show", f"{FLOATING_IP}/32", "proto", "bird"],
            capture_output=True, text=True, check=True, timeout=10).stdout or "[]")
        assert routes, f"node2 has no BGP route to {FLOATING_IP}"
    root_guard.check()


@pytest.mark.extended
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_dual_stack_floating_ip_twin_gets_the_ipv4_verdicts(dataplane: str,
                                                            root_guard: Any) -> None:
    """Issue 18's first acceptance line for this scenario, as a user runs it: `pyfelix lab
    run two-node-floating-ip.yaml --ip-family dual -o json`. Every probe passes, each IPv4
    probe is followed by its IPv6 twin (to the floating IP's twin, or the pod's IPv6
    address) with the same verdict, denials among them. `extended`: the IPv4 run above is
    `make test`'s; this one is `make test-extended`'s and the matrix's."""
    done = subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(SCENARIO), "-o", "json",
         "--dataplane", dataplane, "--ip-family", "dual", "--probe-timeout", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    probes = json.loads(done.stdout)["probes"]
    assert [p["family"] for p in probes] == [4, 6] * (len(probes) // 2)
    for v4, v6 in zip(probes[::2], probes[1::2], strict=True):
        assert v4["result"] == v4["expect"] and v6["result"] == v4["result"], (v4, v6)
    assert {p["result"] for p in probes} == {"allow", "deny"}
    # probes name their target as written; family 6 went to its twin (FLOATING_IP6)
    assert {(FLOATING_IP, 4), (FLOATING_IP, 6)} <= {(p["to"], p["family"]) for p in probes}
    root_guard.check()


def test_floating_ips_disabled_program_nothing(root_guard: Any) -> None:
    scenario = load_scenario(SCENARIO)
    first = scenario.steps[0]
    apply = tuple(d for d in first.apply if d["kind"] != "FelixConfiguration")
    probes = tuple(p for p in first.probes if str(p.target_ip) == FLOATING_IP
                   and p.expect == "allow")
    assert probes
    step = Step(apply=apply, delete=first.delete, probes=probes)
    scenario = dataclasses.replace(scenario, steps=(step,))
    with LabRunner(scenario, agents=AgentProcesses("iptables"), dataplane="iptables",
                   program_routes=False, probe_timeout=0.5) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert [r.result for r in results] == ["deny"] * len(probes)
        nat = subprocess.run(["ip", "netns", "exec", lab.topology.nodes["node1"].netns,
                              "iptables-save", "-t", "nat"], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        assert FLOATING_IP not in nat
    root_guard.check()

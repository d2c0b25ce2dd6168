"""Issue 18's IPv6 slice of `make test` (the full scenario x family x dataplane matrix and
the whole conformance suite per family are `make test-matrix`, tests/matrix).

1. A two-node IPv6-ONLY lab connects pods across nodes over routes BIRD learned over IPv6
   BGP, with policy by CIDR enforced across nodes, on both dataplanes.
2. A dual-stack conformance slice on both dataplanes: the cases whose rules name CIDRs,
   ICMP types and ipBlocks (what `lab.family` rewrites, and where the families could
   disagree), every cell probed over IPv4 and over IPv6, zero mismatches.

`two-node-ipv6-bgp` under `--ip-family ipv6`: the pods have only their IPv6 twin addresses
(lab.family), the nodes have IPv6 underlay addresses and Node `spec.bgp.ipv6Address`, so
confd renders IPv6 sessions. With real agents the lab programs no route itself; the test
checks after the probes that every node's route to every remote pod is a `proto bird` IPv6
route via the remote node's IPv6 underlay address (so it came over an IPv6 session), that no
pod has an IPv4 address, and that the verdicts are the scenario's: a GlobalNetworkSet (by
CIDR) and a Kubernetes ipBlock with an `except` decide cross-node flows both ways.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.conformance.__main__ import run_conformance
from pyfelix.lab.family import apply_ip_family
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import load_scenario

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIO = REPO / "tests" / "lab" / "scenarios" / "two-node-ipv6-bgp.yaml"


def _ip_json(netns: str, *args: str) -> Any:
    done = subprocess.run(["ip", "-n", netns, "-j", *args], capture_output=True, text=True,
                          check=True, timeout=10)
    return json.loads(done.stdout or "[]")


def _network(dst: str) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network(dst if "/" in dst else f"{dst}/128")


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_ipv6_only_two_nodes_over_ipv6_bgp_with_policy(dataplane: str,
                                                      root_guard: Any) -> None:
    scenario = apply_ip_family(load_scenario(SCENARIO), "ipv6")
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=0.5) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert not (wrong := [r.to_json() for r in results if r.mismatch]), wrong
        assert {r.to_json()["family"] for r in results} == {6}
        cross_node_denied = [r for r in results if r.result == "deny"
                             and scenario.pod(r.probe.source).node
                             != scenario.pod(r.probe.target).node]
        assert len(cross_node_denied) == 2  # c -> a (network set), d -> b (ipBlock except)
        for pod in lab.topology.pods.values():
            ipv4 = _ip_json(pod.netns, "-4", "addr", "show", "dev", "eth0")
            assert not any(link.get("addr_info") for link in ipv4), (pod.key, ipv4)
        for name, node in lab.topology.nodes.items():
            routes = _ip_json(node.netns, "-6", "route", "show", "proto", "bird")
            for pod in lab.topology.pods.values():
                if pod.node.name == name:
                    continue
                assert pod.spec.ipv6 is not None and pod.node.underlay_ip6 is not None
                covering = [r for r in routes if pod.spec.ipv6 in _network(r["dst"])]
                assert covering, f"{name}: no proto bird IPv6 route to {pod.key} in {routes}"
                assert all(r.get("gateway") == str(pod.node.underlay_ip6.ip)
                           for r in covering), covering
            static = _ip_json(node.netns, "-6", "route", "show", "proto", "static")
            assert static == [], f"{name}: the lab programmed IPv6 routes itself: {static}"
    root_guard.check()


DUAL_SLICE = ("k8s-ipblock-except-host", "calico-nets-and-not-nets", "calico-icmp-type")


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_dual_stack_conformance_slice(dataplane: str, root_guard: Any,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    report = run_conformance([dataplane], case_patterns=DUAL_SLICE, ip_family="dual")
    text = report.format_text()
    with capsys.disabled():
        print(f"\n[dual slice] {text}")
    outcome = report.outcomes[0]
    assert outcome.error is None, text
    assert [c.case.name for c in outcome.cases] == list(DUAL_SLICE)
    assert not outcome.mismatches, text
    cells = [r.cell for c in outcome.cases for r in c.results]
    assert {c.family for c in cells} == {4, 6}
    assert sum(c.family == 6 for c in cells) == sum(c.family == 4 for c in cells)
    assert {r.got for c in outcome.cases for r in c.results} == {True, False}
    root_guard.check()

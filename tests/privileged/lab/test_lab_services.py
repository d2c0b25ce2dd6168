"""Kubernetes Services through a ClusterIP in the lab, with real agents, on BOTH dataplanes
(BPF: the agent's NAT before policy; iptables: kube-proxy's rules rendered by the lab, policy
after DNAT), from one scenario (tests/lab/scenarios/services-clusterip.yaml):

- TCP and UDP from a pod to the ClusterIP reach every backend (balanced: each of the three
  backends serves some of 40 connections / datagrams);
- egress policy selecting the backend pods allows the ClusterIP; egress policy allowing only
  some other pod denies it;
- the backends' ingress policy (only the client pod) admits the traffic, and the backends
  see the client pod's own address;
- a Service without endpoints is refused at once (ICMP port unreachable), not timed out.
The root namespace must be as before afterwards (root_guard).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent.lab.agents import AgentProcesses
from agent.lab.runner import LabRunner
from agent.lab.scenario import ProbeSpec, load_scenario

pytestmark = pytest.mark.privileged

SCENARIO = Path(__file__).resolve().parents[2] / "lab" / "scenarios" / "services-clusterip.yaml"
VIP = ipaddress.IPv4Address("10.96.0.10")
PROBE_TIMEOUT = 2.0


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_clusterip_from_pods(dataplane: str, root_guard: Any) -> None:
    scenario = load_scenario(SCENARIO)
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        # a default route on each node, as real nodes have: without one the kernel answers
        # "network unreachable" for a VIP without endpoints before any REJECT could run
        for node in lab.topology.nodes.values():
            subprocess.run(["ip", "-n", node.netns, "route", "add", "default", "dev", "eth0"],
                           check=True, timeout=30)
        lab.start_agents()
        results = lab.run_steps()
        wrong = [r.to_json() for r in results if r.mismatch]
        assert not wrong, wrong
        # refused at once, not timed out
        empty = next(r for r in results if str(r.probe.target_ip) == "10.96.0.11")
        assert empty.detail == "refused" and empty.seconds < PROBE_TIMEOUT / 2, empty

        # balanced over every backend, TCP and UDP
        lab.servers.served.clear()
        lab.servers.peers.clear()
        extra = [ProbeSpec("shop/client", str(VIP), VIP, port, protocol, "allow")
                 for port, protocol in ((80, "TCP"), (53, "UDP")) for _ in range(40)]
        more = lab.run_probes(extra, step=99)
        assert all(r.result == "allow" for r in more), [r.to_json() for r in more
                                                        if r.result != "allow"]
        backends = {key: pod for key, pod in lab.topology.pods.items()
                    if key.startswith("shop/web-")}
        served: Counter[tuple[str, str]] = Counter()
        for key, pod in backends.items():
            served[(key, "TCP")] = lab.servers.served[(pod.netns, 8080, "TCP")]
            served[(key, "UDP")] = lab.servers.served[(pod.netns, 5353, "UDP")]
            # the backend saw the client pod's own address (no source NAT)
            client_ip = str(lab.topology.pods["shop/client"].spec.ip)
            assert lab.servers.peers[(pod.netns, 8080, "TCP")] <= {client_ip}
        assert sum(v for (_, p), v in served.items() if p == "TCP") == 40, served
        assert all(v > 0 for v in served.values()), served
    root_guard.check()

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

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import ProbeSpec, load_scenario

pytestmark = pytest.mark.privileged

SCENARIOS = Path(__file__).resolve().parents[2] / "lab" / "scenarios"
VIP = ipaddress.IPv4Address("10.96.0.10")
PROBE_TIMEOUT = 2.0


@pytest.mark.parametrize(("scenario_file", "dataplane"), [
    ("services-clusterip.yaml", "bpf"),
    ("services-clusterip.yaml", "iptables"),
    ("services-clusterip-two-nodes.yaml", "bpf"),
    # kube-proxy's own rules (the lab renders them) across two nodes: make test-matrix
    pytest.param("services-clusterip-two-nodes.yaml", "iptables", marks=pytest.mark.extended),
])
def test_clusterip_from_pods(scenario_file: str, dataplane: str, root_guard: Any) -> None:
    scenario = load_scenario(SCENARIOS / scenario_file)
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
        # a backend's ICMP port unreachable reaches the client, translated back to the VIP
        deaf = [r for r in results if str(r.probe.target_ip) == "10.96.0.13"]
        assert all(r.detail == "refused" for r in deaf), deaf

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


def _slice(addresses: list[str]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "spread-manual", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "spread"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}, "nodeName": "node1"}
                          for a in addresses],
            "ports": [{"name": "", "protocol": "TCP", "port": 8080}]}


AFFINITY_SCENARIO = {
    "name": "services-affinity-and-churn",
    "namespaces": [{"name": "shop"}],
    "pods": [{"namespace": "shop", "name": "client", "labels": {"app": "client"}},
             *({"namespace": "shop", "name": f"web-{i}", "labels": {"app": "web"},
                "ip": f"10.65.1.{i}", "ports": [{"port": 8080, "protocol": "TCP"}]}
               for i in (1, 2, 3))],
    "resources": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sticky",
                                                             "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.20", "selector": {"app": "web"},
                  "sessionAffinity": "ClientIP",
                  "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}},
                  "ports": [{"port": 80, "targetPort": 8080}]}},
        # no selector: its backends are exactly the slice's (changed mid-run below)
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "spread",
                                                             "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.21", "ports": [{"port": 80, "targetPort": 8080}]}},
        _slice(["10.65.1.1", "10.65.1.2", "10.65.1.3"]),
    ],
}


def _served(lab: LabRunner) -> dict[str, int]:
    return {f"10.65.1.{i}": lab.servers.served[(lab.topology.pods[f"shop/web-{i}"].netns,
                                                8080, "TCP")] for i in (1, 2, 3)}


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_affinity_and_backend_removed_mid_run(dataplane: str, root_guard: Any) -> None:
    import socket

    from pyfelix.lab.netns import in_netns
    from pyfelix.lab.scenario import Step, parse_scenario

    scenario = parse_scenario(AFFINITY_SCENARIO)
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        lab.run_steps()

        def probes(vip: str, n: int) -> list[ProbeSpec]:
            address = ipaddress.IPv4Address(vip)
            return [ProbeSpec("shop/client", vip, address, 80, "TCP", "allow")
                    for _ in range(n)]

        # ClientIP affinity: 20 connections, one backend. The first connection creates the
        # affinity; it goes alone, since kube-proxy's `recent` match (like any first-packet
        # affinity) lets concurrent first connections pick different backends.
        before = _served(lab)
        assert all(r.result == "allow" for r in lab.run_probes(probes("10.96.0.20", 1)))
        assert all(r.result == "allow" for r in lab.run_probes(probes("10.96.0.20", 19)))
        after = _served(lab)
        used = {a for a in after if after[a] > before[a]}
        assert len(used) == 1 and sum(after.values()) - sum(before.values()) == 20, after

        # hold connections to "spread" until one reaches each backend
        held: dict[str, socket.socket] = {}
        for _ in range(60):
            if len(held) == 3:
                break
            prior = _served(lab)
            with in_netns(lab.topology.pods["shop/client"].netns):
                sock = socket.create_connection(("10.96.0.21", 80), timeout=PROBE_TIMEOUT)
            sock.sendall(b"hello")
            assert sock.recv(16) == b"hello"
            now = _served(lab)
            backend = next(a for a in now if now[a] > prior[a])
            if backend in held:
                sock.close()
            else:
                held[backend] = sock
        assert len(held) == 3, sorted(held)
        try:
            # 10.65.1.3 leaves the Service
            lab.enter_step(Step(apply=(_slice(["10.65.1.1", "10.65.1.2"]),)))
            for backend in ("10.65.1.1", "10.65.1.2"):  # established flows continue
                held[backend].sendall(b"again")
                assert held[backend].recv(16) == b"again", backend
            before = _served(lab)
            results = lab.run_probes(probes("10.96.0.21", 30))
            assert all(r.result == "allow" for r in results)
            after = _served(lab)
            assert after["10.65.1.3"] == before["10.65.1.3"], after  # new ones avoid it
            assert after["10.65.1.1"] > before["10.65.1.1"] and (
                after["10.65.1.2"] > before["10.65.1.2"]), after
        finally:
            for sock in held.values():
                sock.close()
    root_guard.check()


def test_bpf_restart_keeps_service_flows_and_service_ids(root_guard: Any) -> None:
    """kill -9 of the agent under a connection held through a ClusterIP, then a restart:
    the connection keeps echoing while no agent runs and after the new agent adopted the
    pinned NAT maps (the frontend keeps its service id), and new connections still work."""
    import time

    from pyfelix.agent.bpf.maps import nat_pinned
    from pyfelix.bench.restart import HeldFlow, PinKeepingAgents
    from pyfelix.lab.scenario import parse_scenario

    scenario = parse_scenario({
        "name": "services-restart", "namespaces": [{"name": "shop"}],
        "pods": [{"namespace": "shop", "name": "client"},
                 *({"namespace": "shop", "name": f"web-{i}", "labels": {"app": "web"},
                    "ports": [{"port": 8080, "protocol": "TCP"}]} for i in (1, 2))],
        "resources": [{"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "web", "namespace": "shop"},
                       "spec": {"clusterIP": "10.96.0.30", "selector": {"app": "web"},
                                "ports": [{"port": 80, "targetPort": 8080}]}}]})
    agents = PinKeepingAgents("bpf")
    with LabRunner(scenario, agents=agents, dataplane="bpf", program_routes=False,
                   probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        lab.run_steps()
        pins = str(lab.bpffs_dir / "node1")
        ids_before = {f["frontend"]: f["service_id"] for f in nat_pinned(pins)["frontends"]}
        flow = HeldFlow(lab.topology.pods["shop/client"].netns, ("10.96.0.30", 80)).start()
        try:
            time.sleep(0.5)
            agents.kill("node1")
            killed = time.monotonic()
            time.sleep(1.0)
            agents.restart("node1")
            restarted = time.monotonic()
            lab.wait_in_sync(timeout=120)
            time.sleep(0.5)
            assert flow.echoed_between(killed, restarted) > 0  # no agent, still served
            assert flow.echoed_between(restarted, time.monotonic()) > 0
        finally:
            flow.stop()
        assert flow.failures == []
        ids_after = {f["frontend"]: f["service_id"] for f in nat_pinned(pins)["frontends"]}
        assert ids_after == ids_before and ids_before
        vip = ipaddress.IPv4Address("10.96.0.30")
        again = lab.run_probes([ProbeSpec("shop/client", str(vip), vip, 80, "TCP", "allow")])
        assert again[0].result == "allow", again[0].to_json()
    root_guard.check()

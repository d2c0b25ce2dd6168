"""Real namespaces: a 2-node, 6-pod lab, its wiring, its probes, and a clean root afterwards."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab import naming
from pyfelix.lab.netns import create_netns, list_netns, read_sysctl, remove_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import ProbeSpec, Scenario, parse_scenario
from pyfelix.lab.topology import LabTopology

pytestmark = pytest.mark.privileged

PROBE_TIMEOUT = 0.5


def two_nodes_six_pods() -> Scenario:
    pods = [
        {"namespace": "x", "name": f"{node[-1]}{i}", "node": node, "labels": {"i": str(i)},
         "ports": [{"port": 80, "name": "http"}, {"port": 53, "protocol": "UDP", "name": "dns"}]}
        for node in ("node1", "node2") for i in range(3)
    ]
    return parse_scenario({"nodes": ["node1", "node2"], "namespaces": [{"name": "x"}],
                           "pods": pods})


def probe(scenario: Scenario, source: str, target: str, port: int, protocol: str) -> ProbeSpec:
    return ProbeSpec(source=source, target=target, target_ip=scenario.pod(target).ip,
                     port=port, protocol=protocol)


def ip_json(netns: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(["ip", "-n", netns, "-j", *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out) if out.strip() else []


def run_namespaces(run_id: str) -> list[str]:
    return [n for n in list_netns() if n.startswith(f"{run_id}-")]


def check_wiring(topology: LabTopology) -> None:
    """What the lab promises inside each namespace (see pyfelix/lab/topology.py)."""
    assert sorted(run_namespaces(topology.run_id)) == sorted(topology.netns_names)
    assert len(topology.netns_names) == 1 + 2 + 6
    for node in topology.nodes.values():
        addrs = ip_json(node.netns, "-4", "addr", "show", "dev", "eth0")
        assert [(a["local"], a["prefixlen"]) for a in addrs[0]["addr_info"]] == [
            (str(node.ip), 15)]
        assert read_sysctl(node.netns, "net.ipv4.ip_forward") == "1"
        links = {link["ifname"]: link for link in ip_json(node.netns, "link", "show")}
        routes = {r["dst"]: r for r in ip_json(node.netns, "route", "show")}
        for pod in topology.pods.values():
            if pod.node.name == node.name:
                assert links[pod.host_ifname]["address"] == "ee:ee:ee:ee:ee:ee"
                assert links[pod.host_ifname]["operstate"] in ("UP", "LOWERLAYERDOWN", "UNKNOWN")
                assert routes[str(pod.spec.ip)]["dev"] == pod.host_ifname
                assert read_sysctl(node.netns, f"net.ipv4.conf.{pod.host_ifname}.proxy_arp") == "1"
            else:
                assert pod.host_ifname not in links
                assert routes[str(pod.spec.ip)]["gateway"] == str(pod.node.ip)
    for pod in topology.pods.values():
        assert len(pod.host_ifname) <= 15 and pod.host_ifname.startswith("cali")
        addrs = ip_json(pod.netns, "-4", "addr", "show", "dev", "eth0")
        assert [(a["local"], a["prefixlen"]) for a in addrs[0]["addr_info"]] == [
            (str(pod.spec.ip), 32)]
        default = [r for r in ip_json(pod.netns, "route", "show") if r["dst"] == "default"]
        assert default[0]["gateway"] == "169.254.1.1" and default[0]["dev"] == "eth0"
    bridge_ports = ip_json(topology.underlay_netns, "link", "show", "master", "br0")
    assert sorted(p["ifname"] for p in bridge_ports) == ["n0", "n1"]


def test_two_node_six_pod_lab_connects_and_leaves_the_root_namespace_as_it_was(
    root_guard: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = two_nodes_six_pods()
    same_node = [("x/10", "x/11"), ("x/12", "x/10"), ("x/20", "x/22")]
    cross_node = [("x/10", "x/20"), ("x/21", "x/12"), ("x/22", "x/11")]
    probes = [probe(scenario, s, t, 80, "TCP") for s, t in same_node + cross_node]
    probes += [probe(scenario, s, t, 53, "UDP") for s, t in same_node + cross_node]
    no_server = [probe(scenario, "x/10", "x/11", 81, "TCP"),
                 probe(scenario, "x/10", "x/21", 81, "TCP"),
                 probe(scenario, "x/20", "x/11", 54, "UDP")]

    started = time.monotonic()
    with LabRunner(scenario, static_cross_node_routes=True, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        built = time.monotonic()
        check_wiring(lab.topology)
        results = lab.run_probes(probes + no_server)
        probed = time.monotonic()
        run_id, state_dir = lab.run_id, lab.state.path
        assert state_dir.is_dir()
    finished = time.monotonic()

    verdicts = {(r.probe.source, r.probe.target, r.probe.port, r.probe.protocol): r.result
                for r in results}
    assert [verdicts[(p.source, p.target, p.port, p.protocol)] for p in probes] == (
        ["allow"] * len(probes)), results
    assert [verdicts[(p.source, p.target, p.port, p.protocol)] for p in no_server] == (
        ["deny"] * len(no_server)), results
    assert {r.detail for r in results if r.result == "deny"} == {"refused"}

    assert run_namespaces(run_id) == []
    assert not state_dir.exists()
    root_guard.check()
    with capsys.disabled():
        print(f"\n[lab 2 nodes/6 pods] build {built - started:.3f}s, "
              f"{len(results)} probes {probed - built:.3f}s, "
              f"teardown {finished - probed:.3f}s (runner: {lab.timings})")


def test_without_the_lab_programming_routes_pods_do_not_reach_each_other(
    root_guard: Any,
) -> None:
    scenario = two_nodes_six_pods()
    probes = [probe(scenario, "x/10", "x/11", 80, "TCP"), probe(scenario, "x/10", "x/20", 80,
                                                                  "TCP")]
    with LabRunner(scenario, program_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        node1 = lab.topology.nodes["node1"].netns
        assert read_sysctl(node1, "net.ipv4.ip_forward") == "0"
        assert [r["dst"] for r in ip_json(node1, "route", "show")] == ["198.18.0.0/15"]
        results = lab.run_probes(probes)
    assert [r.result for r in results] == ["deny", "deny"]
    root_guard.check()


def test_cross_node_traffic_needs_the_static_routes_switch(root_guard: Any) -> None:
    scenario = two_nodes_six_pods()
    probes = [probe(scenario, "x/10", "x/11", 80, "TCP"), probe(scenario, "x/10", "x/20", 80,
                                                                  "TCP")]
    with LabRunner(scenario, static_cross_node_routes=False, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        results = lab.run_probes(probes)
    assert [r.result for r in results] == ["allow", "deny"]
    root_guard.check()


class RecordingAgents:
    """A stateful stand-in for the real per-node agents: records what the hook hands it."""

    enforces_policy = False

    def __init__(self) -> None:
        self.started_with: tuple[LabTopology, Path, Path] | None = None
        self.seen_at_sync: list[list[str]] = []
        self.stopped = 0

    def start(self, topology: LabTopology, datastore_dir: Path, bpffs_dir: Path) -> None:
        self.started_with = (topology, datastore_dir, bpffs_dir)

    def is_in_sync(self) -> bool:
        assert self.started_with is not None
        self.seen_at_sync.append(sorted(p.name for p in self.started_with[1].iterdir()))
        return True

    def stop(self) -> None:
        self.stopped += 1

    def describe(self) -> dict[str, Any] | None:
        return {"recording": True}


def test_steps_reach_the_agents_through_the_datastore(root_guard: Any) -> None:
    gnp = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
           "metadata": {"name": "p"}, "spec": {"selector": "all()"}}
    scenario = parse_scenario({
        "namespaces": [{"name": "x"}],
        "pods": [{"namespace": "x", "name": "a", "ports": [{"port": 80}]},
                 {"namespace": "x", "name": "b", "ports": [{"port": 80}]}],
        "steps": [
            {"apply": [gnp], "probes": [{"from": "x/a", "to": "x/b", "port": 80}]},
            {"delete": [{"kind": "GlobalNetworkPolicy", "name": "p"}],
             "probes": [{"from": "x/b", "to": "x/a", "port": 80, "expect": "allow"}]},
        ],
    })
    agents = RecordingAgents()
    with LabRunner(scenario, agents=agents, probe_timeout=PROBE_TIMEOUT) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert agents.started_with == (lab.topology, lab.datastore_dir, lab.bpffs_dir)
    topology_files = ["namespace._.x.yaml", "node._.node1.yaml", "pod.x.a.yaml", "pod.x.b.yaml"]
    assert agents.seen_at_sync == [
        sorted([*topology_files, "globalnetworkpolicy._.p.yaml"]), topology_files]
    assert agents.stopped == 1
    assert [(r.step, r.result, r.mismatch) for r in results] == [(0, "allow", False),
                                                                   (1, "allow", False)]
    root_guard.check()


def test_a_build_that_fails_half_way_is_torn_down(root_guard: Any) -> None:
    scenario = two_nodes_six_pods()
    run_id = naming.new_run_id()
    blocker = naming.pod_netns(run_id, 4, "x", "21")  # a pod namespace name already taken
    create_netns(blocker)
    try:
        with pytest.raises(FileExistsError), LabRunner(scenario, run_id=run_id) as lab:
            lab.build()
        assert run_namespaces(run_id) == []
        assert not lab.state.path.exists()
    finally:
        remove_netns(blocker)
    root_guard.check()

"""The lab's multi-node readiness follows each pod's pool: which pool decides, and which
routing mode a pool document means (BGP, VXLAN, IPIP), read from the datastore directory."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.datastore import LabDatastore


def _pool(name: str, cidr: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
            "metadata": {"name": name}, "spec": {"cidr": cidr, **spec}}


def test_modes_from_the_datastore_and_the_most_specific_pool_decides(tmp_path: Path) -> None:
    store = tmp_path / "ds"
    store.mkdir()
    LabDatastore(store, tmp_path).apply([
        _pool("wide", "10.65.0.0/16", vxlanMode="Always"),
        _pool("narrow", "10.65.1.0/24", ipipMode="CrossSubnet"),
        _pool("off", "10.66.0.0/16", ipipMode="Always", disabled=True),
        _pool("v6", "fd00::/64", vxlanMode="Always")])
    agents = AgentProcesses("iptables")
    agents.datastore_dir = store
    pools = agents._pools()
    assert sorted((str(c), n, m) for c, n, m in pools) == [
        ("10.65.0.0/16", "wide", "vxlan"), ("10.65.1.0/24", "narrow", "ipip"),
        ("fd00::/64", "v6", "vxlan")]
    mode = agents._routing_mode
    assert mode(ipaddress.IPv4Address("10.65.1.7"), pools) == "ipip"
    assert mode(ipaddress.IPv4Address("10.65.2.7"), pools) == "vxlan"
    assert mode(ipaddress.IPv4Address("10.66.0.1"), pools) == "bgp"  # disabled: not a pool
    assert mode(ipaddress.IPv6Address("fd00::7"), pools) == "vxlan"  # IPv6 pools count too
    assert mode(ipaddress.IPv6Address("fd01::7"), pools) == "bgp"


def test_default_pool_only_without_a_scenario_pool(tmp_path: Path) -> None:
    AgentProcesses._write_ip_pool(tmp_path)
    written = json.loads((tmp_path / "lab-ippool.yaml").read_text())
    assert written["spec"] == {"cidr": "10.65.0.0/16", "natOutgoing": False}
    other = tmp_path / "other"
    other.mkdir()
    LabDatastore(other, tmp_path).apply([_pool("vx", "10.65.0.0/16", vxlanMode="Always")])
    AgentProcesses._write_ip_pool(other)
    assert not (other / "lab-ippool.yaml").exists()


def test_floating_ips_are_waited_for_only_when_enabled(tmp_path: Path) -> None:
    store = tmp_path / "ds"
    store.mkdir()
    agents = AgentProcesses("iptables")
    agents.datastore_dir = store
    assert not agents._floating_ips_enabled()
    felix = {"apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
             "metadata": {"name": "default"}, "spec": {"floatingIPs": "Enabled"}}
    LabDatastore(store, tmp_path).apply([felix])
    assert agents._floating_ips_enabled()
    LabDatastore(store, tmp_path).apply([{**felix, "spec": {"floatingIPs": "Disabled"}}])
    assert not agents._floating_ips_enabled()


def test_dual_stack_overlay_twins_are_waited_for_by_their_own_modes(tmp_path: Path) -> None:
    """Under --ip-family dual an IPIP pool's IPv6 twin is BGP-routed (no IPv6 IPIP), a
    VXLAN pool's twin VXLAN-routed: the readiness waits for BIRD's / the agent's routes."""
    from pyfelix.lab.family import apply_ip_family
    from pyfelix.lab.scenario import load_scenario

    scenarios = Path(__file__).parent / "scenarios"
    for scenario_file, v4_mode, v6_mode in (("two-node-ipip.yaml", "ipip", "bgp"),
                                            ("two-node-vxlan.yaml", "vxlan", "vxlan")):
        prepared = apply_ip_family(load_scenario(scenarios / scenario_file), "dual")
        store = tmp_path / scenario_file
        store.mkdir()
        LabDatastore(store, tmp_path).apply(
            [d for d in prepared.resources if d.get("kind") == "IPPool"])
        agents = AgentProcesses("iptables")
        agents.datastore_dir = store
        pools = agents._pools()
        pod = prepared.pods[0]
        assert agents._routing_mode(pod.ip, pools) == v4_mode
        assert pod.ipv6 is not None
        assert agents._routing_mode(pod.ipv6, pools) == v6_mode, scenario_file

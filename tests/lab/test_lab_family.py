"""`lab.family`: one IPv4 -> IPv6 mapping for the lab, and scenarios prepared per family."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from pyfelix.lab.datastore import topology_documents
from pyfelix.lab.family import (
    apply_ip_family,
    ipv6_for,
    ipv6_network_for,
    rewrite_documents,
    twin_text,
)
from pyfelix.lab.scenario import ScenarioError, load_scenario, parse_scenario
from pyfelix.lab.topology import plan_topology

SCENARIOS = Path(__file__).parent / "scenarios"
V4 = ipaddress.IPv4Address
V4N = ipaddress.IPv4Network


def test_mapping_is_injective_and_keeps_containment() -> None:
    assert str(ipv6_for(V4("10.65.1.10"))) == "fd65:6c61:6200::a41:10a"
    assert str(ipv6_network_for(V4N("10.65.0.0/16"))) == "fd65:6c61:6200::a41:0/112"
    net = V4N("10.65.1.0/24")
    for text, inside in (("10.65.1.200", True), ("10.65.2.1", False), ("10.64.1.1", False)):
        address = V4(text)
        assert (address in net) is inside
        assert (ipv6_for(address) in ipv6_network_for(net)) is inside
    assert len({ipv6_for(V4(f"10.65.0.{i}")) for i in range(256)}) == 256


def test_twin_text_keeps_the_written_form_and_leaves_non_ipv4_alone() -> None:
    assert twin_text("10.65.1.0/24") == "fd65:6c61:6200::a41:100/120"
    assert twin_text("10.65.1.7") == "fd65:6c61:6200::a41:107"
    assert twin_text("fd00::/64") is None
    assert twin_text("not-a-cidr") is None


RESOURCES = (
    {"kind": "GlobalNetworkSet", "metadata": {"name": "s"},
     "spec": {"nets": ["10.65.0.0/24", "fd00::/64"]}},
    {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x"},
     "spec": {"ingress": [{"action": "Deny", "ipVersion": 4,
                           "source": {"notNets": ["10.65.0.3/32"]}}]}},
    {"kind": "NetworkPolicy", "apiVersion": "networking.k8s.io/v1",
     "metadata": {"name": "k", "namespace": "x"},
     "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.65.0.0/16",
                                                 "except": ["10.65.0.3/32"]}},
                                    {"podSelector": {}}]}]}},
    {"kind": "IPPool", "metadata": {"name": "pool"},
     "spec": {"cidr": "10.65.0.0/16", "blockSize": 26}},
)


def test_ipv6_replaces_every_cidr_and_the_pool() -> None:
    netset, calico, k8s, pool = rewrite_documents(RESOURCES, "ipv6")
    assert netset["spec"]["nets"] == ["fd65:6c61:6200::a41:0/120", "fd00::/64"]
    rule = calico["spec"]["ingress"][0]
    assert rule["ipVersion"] == 6
    assert rule["source"]["notNets"] == ["fd65:6c61:6200::a41:3/128"]
    peers = k8s["spec"]["ingress"][0]["from"]
    assert peers[0] == {"ipBlock": {"cidr": "fd65:6c61:6200::a41:0/112",
                                    "except": ["fd65:6c61:6200::a41:3/128"]}}
    assert pool["metadata"]["name"] == "pool-v6"
    assert pool["spec"] == {"cidr": "fd65:6c61:6200::a41:0/112", "blockSize": 122}
    assert RESOURCES[0]["spec"]["nets"][0] == "10.65.0.0/24"  # the input is not changed


def test_dual_adds_each_twin_beside_the_original() -> None:
    netset, calico, k8s, pool, pool6 = rewrite_documents(RESOURCES, "dual")
    assert netset["spec"]["nets"] == ["10.65.0.0/24", "fd65:6c61:6200::a41:0/120",
                                      "fd00::/64"]
    assert calico["spec"]["ingress"] == RESOURCES[1]["spec"]["ingress"]  # pinned to 4: kept
    [unpinned] = rewrite_documents(({"kind": "NetworkPolicy", "metadata": {"name": "p"},
                                     "spec": {"egress": [{"action": "Deny", "destination": {
                                         "nets": ["10.65.3.0/24"]}}]}},), "dual")
    assert unpinned["spec"]["egress"] == [  # a rule may not mix families: twinned
        {"action": "Deny", "destination": {"nets": ["10.65.3.0/24"]}, "ipVersion": 4},
        {"action": "Deny", "destination": {"nets": ["fd65:6c61:6200::a41:300/120"]},
         "ipVersion": 6}]
    peers = k8s["spec"]["ingress"][0]["from"]
    assert [p.get("ipBlock", {}).get("cidr") for p in peers] == [
        "10.65.0.0/16", "fd65:6c61:6200::a41:0/112", None]
    assert (pool["spec"]["cidr"], pool6["spec"]["cidr"]) == (
        "10.65.0.0/16", "fd65:6c61:6200::a41:0/112")


def test_scenario_pods_probes_and_nodes_per_family() -> None:
    base = load_scenario(SCENARIOS / "two-node-policy.yaml")
    assert apply_ip_family(base, "ipv4") is base
    dual = apply_ip_family(base, "dual")
    a = dual.pod("x/a")
    assert a.addresses == (a.ip, ipv6_for(a.ip))
    assert [p.family for p in dual.probes] == [4, 6] * len(base.probes)
    assert [p.expect for p in dual.probes[::2]] == [p.expect for p in dual.probes[1::2]]
    only6 = apply_ip_family(base, "ipv6")
    assert only6.pod("x/a").addresses == (ipv6_for(a.ip),)
    assert {p.family for p in only6.probes} == {6}
    topology = plan_topology("pf000001", only6)
    docs = topology_documents(only6, topology)
    node = next(d for d in docs if d["kind"] == "Node")
    assert node["spec"]["bgp"] == {"ipv4Address": "198.18.0.1/15",
                                   "ipv6Address": "fd65:6c61:6200::c612:1/111"}
    pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "a")
    assert pod["status"]["podIPs"] == [{"ip": "fd65:6c61:6200::a41:1"}]
    assert pod["metadata"]["annotations"]["cni.projectcalico.org/podIPs"] == \
        "fd65:6c61:6200::a41:1/128"


def test_nodeports_run_over_ipv6() -> None:
    """NodePort Services are no longer refused: their probes to `node/NAME` go to the
    node's IPv6 underlay twin (from the `external` client's twin), each after its IPv4
    self under dual; the Service keeps its nodePorts and gets its IPv6 cluster IP."""
    base = load_scenario(SCENARIOS / "services-nodeport.yaml")
    dual = apply_ip_family(base, "dual")
    assert len(dual.probes) == 2 * len(base.probes)
    for v4, v6 in zip(dual.probes[::2], dual.probes[1::2], strict=True):
        assert (v4.family, v6.family) == (4, 6)
        assert (v4.source, v4.target, v4.port, v4.expect) == \
            (v6.source, v6.target, v6.port, v6.expect)
        assert v6.target_ip == ipv6_for(v4.target_ip)  # type: ignore[arg-type]
    topology = plan_topology("pf000001", dual)
    node1 = next(p for p in dual.probes if p.target == "node/node1" and p.family == 6)
    assert node1.target_ip == topology.nodes["node1"].underlay_ip6.ip  # type: ignore[union-attr]
    web = next(d for d in dual.resources if d.get("kind") == "Service"
               and d["metadata"]["name"] == "web")
    assert web["spec"]["type"] == "NodePort"
    assert web["spec"]["clusterIPs"] == ["10.96.0.40", str(ipv6_for(V4("10.96.0.40")))]
    assert {p.family for p in apply_ip_family(base, "ipv6").probes} == {6}


def test_floating_ips_get_their_twins_and_probes_to_them_follow() -> None:
    """No longer refused: under `dual` a pod's floating IPs are its IPv4 ones, each
    followed by its twin (the Pod's annotation lists both), and a probe to a floating IP
    is followed by one to the twin; under `ipv6` only the twins remain."""
    from pyfelix.lab.datastore import FLOATING_IPS_ANNOTATION

    scenario = load_scenario(SCENARIOS / "two-node-floating-ip.yaml")
    fip, twin = V4("10.65.200.1"), ipaddress.IPv6Address("fd65:6c61:6200::a41:c801")
    assert ipv6_for(fip) == twin
    for family, wanted in (("dual", (fip, twin)), ("ipv6", (twin,))):
        prepared = apply_ip_family(scenario, family)
        a = prepared.pod("x/a")
        assert a.floating_ips == wanted
        assert prepared.pod("x/b").floating_ips == ()
        targets = [p.target_ip for p in prepared.probes if p.source == "x/c"]
        assert targets == ([fip, twin, a.ip, a.ipv6] if family == "dual"
                           else [twin, a.ipv6])
        topology = plan_topology("pf000001", prepared)
        docs = topology_documents(prepared, topology)
        pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "a")
        assert json.loads(pod["metadata"]["annotations"][FLOATING_IPS_ANNOTATION]) == \
            [str(address) for address in wanted]


def test_icmp_rules_map_to_icmpv6_and_are_pinned_per_family_in_dual() -> None:
    policy = ({"kind": "GlobalNetworkPolicy", "metadata": {"name": "p"},
               "spec": {"ingress": [{"action": "Allow", "protocol": "ICMP",
                                     "icmp": {"type": 8}},
                                    {"action": "Deny", "notProtocol": "ICMP"},
                                    {"action": "Allow", "protocol": "TCP"}]}},)
    [only6] = rewrite_documents(policy, "ipv6")
    assert only6["spec"]["ingress"] == [
        {"action": "Allow", "protocol": "ICMPv6", "icmp": {"type": 128}},
        {"action": "Deny", "notProtocol": "ICMPv6"}, {"action": "Allow", "protocol": "TCP"}]
    [dual] = rewrite_documents(policy, "dual")
    assert dual["spec"]["ingress"] == [
        {"action": "Allow", "protocol": "ICMP", "icmp": {"type": 8}, "ipVersion": 4},
        {"action": "Allow", "protocol": "ICMPv6", "icmp": {"type": 128}, "ipVersion": 6},
        {"action": "Deny", "notProtocol": "ICMP", "ipVersion": 4},
        {"action": "Deny", "notProtocol": "ICMPv6", "ipVersion": 6},
        {"action": "Allow", "protocol": "TCP"}]


def test_an_ipv6_pod_ip_is_that_pods_address_under_ipv6_and_dual_only() -> None:
    data = {"namespaces": [{"name": "x"}],
            "pods": [{"namespace": "x", "name": "a", "ip": "fd00:1::7",
                      "ports": [{"port": 80}]},
                     {"namespace": "x", "name": "b"}],
            "probes": [{"from": "x/b", "to": "x/a", "port": 80}]}
    scenario = parse_scenario(data)
    assert scenario.pod("x/a").ipv6_given == ipaddress.IPv6Address("fd00:1::7")
    dual = apply_ip_family(scenario, "dual")
    a = dual.pod("x/a")
    assert a.addresses == (a.ip, ipaddress.IPv6Address("fd00:1::7"))  # IPv4 allocated
    assert [str(p.target_ip) for p in dual.probes] == [str(a.ip), "fd00:1::7"]
    with pytest.raises(ScenarioError, match="x/a: ip: fd00:1::7 is IPv6"):
        apply_ip_family(scenario, "ipv4")
    clash = parse_scenario({**data, "pods": [
        {"namespace": "x", "name": "a", "ip": "10.65.0.9"},
        {"namespace": "x", "name": "b", "ip": str(ipv6_for(V4("10.65.0.9")))}],
        "probes": []})
    with pytest.raises(ScenarioError, match=r"x/b: ip: .* is also x/a's IPv6 address"):
        apply_ip_family(clash, "ipv6")


def test_conformance_plan_per_family_maps_pods_cases_and_cells() -> None:
    from pyfelix.lab.conformance import ALL_CASES
    from pyfelix.lab.conformance.case import select_cases
    from pyfelix.lab.conformance.plan import build_plan

    cases = select_cases(ALL_CASES, ["calico-not-nets"])
    plan4 = build_plan(cases)
    dual = build_plan(cases, ip_family="dual")
    assert dual.probe_count == 2 * plan4.probe_count
    cell6 = next(c for c in dual.steps[0].cells if c.family == 6)
    assert cell6.target_ip.version == 6
    assert dual.scenario.ip_family == "dual"
    pods = [d for d in dual.base_documents.values() if d["kind"] == "Pod"]
    assert all(len(p["status"]["podIPs"]) == 2 for p in pods)
    applied = [d for step in dual.scenario.steps for d in step.apply
               if d["kind"] == "GlobalNetworkPolicy"]
    rules = applied[0]["spec"]["ingress"]
    assert [r.get("ipVersion") for r in rules] == [4, 6]
    assert dual.scenario_data == plan4.scenario_data | {"steps": dual.scenario_data["steps"]}


def test_icmpv6_reply_and_unreachable_are_told_apart() -> None:
    import struct

    from pyfelix.lab.conformance.probes import classify6, echo_request6

    target = "fd65:6c61:6200::a41:10a"
    request = echo_request6(7, 9, b"tok")
    reply = bytes([129, 0, 0, 0]) + struct.pack("!HH", 7, 9) + b"tok"
    assert classify6(reply, target, target, 7, 9, b"tok") == "echoed"
    assert classify6(reply, "fd65:6c61:6200::a41:10b", target, 7, 9, b"tok") is None
    assert classify6(reply, target, target, 8, 9, b"tok") is None
    inner = bytes(24) + ipaddress.IPv6Address(target).packed + request
    unreachable = bytes([1, 1, 0, 0, 0, 0, 0, 0]) + inner
    assert classify6(unreachable, "fd65:6c61:6200::c612:1", target, 7, 9, b"tok") \
        == "unreachable"


def test_a_scenarios_ipv6_pool_is_kept_and_must_hold_the_pods() -> None:
    pool6 = {"kind": "IPPool", "metadata": {"name": "v6"}, "spec": {"cidr": "fd00:10::/64"}}
    pool4 = {"kind": "IPPool", "metadata": {"name": "v4"}, "spec": {"cidr": "10.65.0.0/16"}}
    base = {"namespaces": [{"name": "x"}],
            "pods": [{"namespace": "x", "name": "a", "ip": "fd00:10::5"},
                     {"namespace": "x", "name": "b"}]}
    with pytest.raises(ScenarioError, match=r"x/b: ip: fd65:6c61:6200::a41:\w+ is in no "):
        apply_ip_family(parse_scenario({**base, "resources": [pool6]}), "dual")
    dual = apply_ip_family(parse_scenario({**base, "resources": [pool6, pool4]}), "dual")
    assert [(d["metadata"]["name"], d["spec"]["cidr"]) for d in dual.resources] == [
        ("v6", "fd00:10::/64"), ("v4", "10.65.0.0/16"), ("v4-v6", "fd65:6c61:6200::a41:0/112")]


def _pools_of(scenario_file: str, ip_family: str) -> dict[str, dict]:
    prepared = apply_ip_family(load_scenario(SCENARIOS / scenario_file), ip_family)
    return {d["metadata"]["name"]: d["spec"] for d in prepared.resources
            if d.get("kind") == "IPPool"}


def test_overlay_pools_twinned_as_dual_stack_calico_has_them() -> None:
    # VXLAN: the IPv6 twin keeps vxlanMode (vxlan-v6.calico carries it)
    pools = _pools_of("two-node-vxlan.yaml", "dual")
    assert pools["vxlan-pool"]["vxlanMode"] == "Always"
    assert pools["vxlan-pool-v6"] == {**pools["vxlan-pool"], "cidr": "fd65:6c61:6200::a41:0/112"}
    assert _pools_of("two-node-vxlan.yaml", "ipv6")["vxlan-pool-v6"]["vxlanMode"] == "Always"
    # IPIP: no IPv6 IPIP in Calico; the twin is unencapsulated, routed by BGP
    pools = _pools_of("two-node-ipip.yaml", "dual")
    assert pools["ipip-pool"]["ipipMode"] == "Always"
    assert pools["ipip-pool-v6"]["ipipMode"] == "Never"
    assert pools["ipip-pool-v6"]["vxlanMode"] == "Never"
    assert pools["ipip-pool-v6"]["cidr"] == "fd65:6c61:6200::a41:0/112"
    assert _pools_of("two-node-ipip.yaml", "ipv6") == {"ipip-pool-v6": pools["ipip-pool-v6"]}


def test_a_scenario_ipv6_pool_with_ipip_is_refused_by_name() -> None:
    with pytest.raises(ScenarioError, match=r"IPPool v6ipip: spec.ipipMode: Calico has no IPv6"):
        apply_ip_family(parse_scenario({
            "namespaces": [{"name": "x"}],
            "pods": [{"namespace": "x", "name": "a"}],
            "resources": [{"kind": "IPPool", "metadata": {"name": "v6ipip"},
                           "spec": {"cidr": "fd65:6c61:6200::a41:0/112",
                                    "ipipMode": "Always"}}]}), "dual")


def test_services_and_slices_get_their_ipv6_twins() -> None:
    """A ClusterIP Service under dual: clusterIPs [v4, twin], dual-stack families, external
    IPs twinned; every probe to the VIP runs over both families to the VIP's twin."""
    dual = apply_ip_family(load_scenario(SCENARIOS / "services-clusterip.yaml"), "dual")
    web = next(d for d in dual.resources
               if d["kind"] == "Service" and d["metadata"]["name"] == "web")
    vip6 = str(ipv6_for(ipaddress.IPv4Address("10.96.0.10")))
    assert web["spec"]["clusterIP"] == "10.96.0.10"
    assert web["spec"]["clusterIPs"] == ["10.96.0.10", vip6]
    assert web["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
    assert web["spec"]["externalIPs"] == [
        "192.0.2.80", str(ipv6_for(ipaddress.IPv4Address("192.0.2.80")))]
    twins = [p for p in dual.probes if p.family == 6
             and p.target_ip == ipaddress.IPv6Address(vip6)]
    assert twins and len(dual.probes) == 2 * len([p for p in dual.probes if p.family == 4])
    only6 = apply_ip_family(load_scenario(SCENARIOS / "services-clusterip.yaml"), "ipv6")
    web6 = next(d for d in only6.resources
                if d["kind"] == "Service" and d["metadata"]["name"] == "web")
    assert web6["spec"]["clusterIPs"] == [vip6] and web6["spec"]["ipFamilies"] == ["IPv6"]
    # a given IPv4 slice: its twin joins it (dual) or replaces it (ipv6)
    given = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "s", "namespace": "x",
                          "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4", "endpoints": [{"addresses": ["10.65.0.5"]}],
             "ports": [{"port": 80}]}
    both = rewrite_documents((given,), "dual")
    assert [d["addressType"] for d in both] == ["IPv4", "IPv6"]
    assert both[1]["metadata"]["name"] == "s-v6"
    assert both[1]["endpoints"][0]["addresses"] == [
        str(ipv6_for(ipaddress.IPv4Address("10.65.0.5")))]
    assert [d["addressType"] for d in rewrite_documents((given,), "ipv6")] == ["IPv6"]

"""VXLANResolver: VTEP addresses and MACs that every node derives identically, and the
sequencer's order (a VTEP before the routes through it, removed after them)."""

from __future__ import annotations

import ipaddress
import random

from calc_testlib import ip_pool, node, wep

from pyfelix.agent import proto
from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.calc.vxlan_resolver import derived_vtep_mac
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of


def _pipeline(docs: list[dict], order_seed: int | None = None
              ) -> tuple[CalcPipeline, ExpectedDataplane]:
    dataplane = ExpectedDataplane()
    pipeline = CalcPipeline("node1", dataplane)
    docs = list(docs)
    if order_seed is not None:
        random.Random(order_seed).shuffle(docs)
    pipeline.feed([RawUpdate(key_of(d), d, "test") for d in docs], SyncStatus.IN_SYNC)
    return pipeline, dataplane


def _resolve(docs: list[dict], order_seed: int | None = None
             ) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
    return _pipeline(docs, order_seed)[1].vteps


NODES = [node(f"node{i}", f"198.18.0.{i}") for i in range(1, 41)]
POOL = ip_pool("vx", "10.65.0.0/16", vxlanMode="Always")


def test_derived_addresses_are_distinct_in_the_pool_top_and_order_independent() -> None:
    first = _resolve([POOL, *NODES])
    again = _resolve([POOL, *NODES], order_seed=7)
    assert first == again
    addrs = [ipaddress.ip_address(v.ipv4_addr) for v in first.values()]
    assert len(set(addrs)) == len(NODES)
    pool = ipaddress.ip_network("10.65.0.0/16")
    top_quarter = pool.network_address + pool.num_addresses * 3 // 4
    assert all(top_quarter <= a < pool.broadcast_address for a in addrs)
    assert {v.parent_device_ip for v in first.values()} == {f"198.18.0.{i}" for i in range(1, 41)}


def test_explicit_addresses_win_and_derived_ones_avoid_them() -> None:
    derived = _resolve([POOL, *NODES])
    taken = derived["node7"].ipv4_addr
    docs = [POOL, *NODES[:-1], node("node40", "198.18.0.40", vxlan_addr=taken)]
    result = _resolve(docs)
    assert result["node40"].ipv4_addr == taken
    assert result["node7"].ipv4_addr != taken
    assert len({v.ipv4_addr for v in result.values()}) == len(NODES)


def test_macs_are_stable_unicast_and_locally_administered() -> None:
    vteps = _resolve([POOL, *NODES[:5]])
    for name, vtep in vteps.items():
        assert vtep.mac == derived_vtep_mac(name)
        first_octet = int(vtep.mac.split(":")[0], 16)
        assert first_octet & 0x01 == 0 and first_octet & 0x02 == 0x02
    assert len({v.mac for v in vteps.values()}) == 5


def test_no_vteps_without_vxlan_pool_or_host_ip() -> None:
    assert _resolve([ip_pool("p", "10.65.0.0/16"), *NODES[:3]]) == {}
    bare = {"apiVersion": "projectcalico.org/v3", "kind": "Node", "metadata": {"name": "x"},
            "spec": {}}
    assert set(_resolve([POOL, bare, NODES[0]])) == {"node1"}


def test_sequencer_sends_vtep_before_routes_and_removes_it_after() -> None:
    docs = [POOL, node("node1", "198.18.0.1"), node("node2", "198.18.0.2"),
            wep("prod", "far", "node2", "10.65.1.20")]
    pipeline, dataplane = _pipeline(docs)
    types = [type(m).__name__ for m in dataplane.messages]
    assert types.index("VXLANTunnelEndpointUpdate") < types.index("RouteUpdate")
    route = dataplane.routes["10.65.1.20/32"]
    assert route.ip_pool_type == "vxlan" and route.dst_node == "node2"
    assert "node2" in dataplane.vteps
    dataplane.messages.clear()
    pipeline.feed([RawUpdate(key_of(POOL), None, "test")])
    types = [type(m).__name__ for m in dataplane.messages]
    assert "VXLANTunnelEndpointRemove" in types
    # the route lost its pool type (an update) before the VTEPs went
    assert types.index("RouteUpdate") < types.index("VXLANTunnelEndpointRemove")
    assert dataplane.vteps == {}


# --- IPv6 VTEPs (vxlan-v6.calico) -----------------------------------------------------------

POOL6 = ip_pool("vx6", "fd00:65::/112", vxlanMode="Always")


def _node6(name: str, ip: str, ip6: str, **spec: str) -> dict:
    doc = node(name, ip)
    doc["spec"]["bgp"]["ipv6Address"] = f"{ip6}/64"
    doc["spec"].update(spec)
    return doc


def test_ipv6_vteps_beside_ipv4_ones_in_one_message_per_node() -> None:
    docs = [POOL, POOL6, _node6("node1", "198.18.0.1", "fd00:18::1"),
            _node6("node2", "198.18.0.2", "fd00:18::2", ipv6VXLANTunnelAddr="fd00:65::7")]
    vteps = _resolve(docs)
    assert set(vteps) == {"node1", "node2"}
    assert vteps["node2"].ipv6_addr == "fd00:65::7"  # explicit wins
    derived = ipaddress.ip_address(vteps["node1"].ipv6_addr)
    assert derived in ipaddress.ip_network("fd00:65::/112") and str(derived) != "fd00:65::7"
    assert vteps["node1"].parent_device_ipv6 == "fd00:18::1"
    assert vteps["node1"].mac_v6 == derived_vtep_mac("node1", 6) != vteps["node1"].mac
    # the IPv4 fields are what an IPv4-only cluster gets
    ipv4_only = _resolve([POOL, node("node1", "198.18.0.1"), node("node2", "198.18.0.2")])
    assert ipv4_only["node1"] == proto.VXLANTunnelEndpointUpdate(
        node="node1", mac=vteps["node1"].mac, ipv4_addr=vteps["node1"].ipv4_addr,
        parent_device_ip="198.18.0.1")


def test_ipv6_only_vxlan_pool_and_nodes_without_ipv6() -> None:
    # only an IPv6 VXLAN pool: the IPv4 fields stay empty; a node without a host IPv6
    # address has no VTEP at all
    vteps = _resolve([POOL6, _node6("node1", "198.18.0.1", "fd00:18::1"),
                      node("node2", "198.18.0.2")])
    assert set(vteps) == {"node1"}
    assert vteps["node1"].ipv4_addr == vteps["node1"].mac == vteps["node1"].parent_device_ip == ""
    assert vteps["node1"].ipv6_addr and vteps["node1"].parent_device_ipv6 == "fd00:18::1"
    # an IPv6 pool without vxlanMode gives no IPv6 VTEP
    plain6 = ip_pool("p6", "fd00:65::/112")
    assert _resolve([POOL, plain6, _node6("node1", "198.18.0.1", "fd00:18::1")])[
        "node1"].ipv6_addr == ""


def test_ipv6_vtep_withdrawn_when_the_ipv6_pool_goes() -> None:
    docs = [POOL, POOL6, _node6("node1", "198.18.0.1", "fd00:18::1")]
    pipeline, dataplane = _pipeline(docs)
    assert dataplane.vteps["node1"].ipv6_addr
    pipeline.feed([RawUpdate(key_of(POOL6), None, "test")], SyncStatus.IN_SYNC)
    assert dataplane.vteps["node1"].ipv6_addr == "" and dataplane.vteps["node1"].ipv4_addr


def test_node_vtep_macs_are_used_and_bad_ones_refused_by_field() -> None:
    docs = [POOL, POOL6, _node6("node1", "198.18.0.1", "fd00:18::1",
                                vxlanTunnelMACAddr="02:AA:00:00:00:01",
                                vxlanTunnelMACAddrV6="02:aa:00:00:06:01")]
    vtep = _resolve(docs)["node1"]
    assert (vtep.mac, vtep.mac_v6) == ("02:aa:00:00:00:01", "02:aa:00:00:06:01")
    import pytest

    from pyfelix.agent.model import ValidationError
    from pyfelix.agent.model.resources import parse_resource

    bad = _node6("node2", "198.18.0.2", "fd00:18::2", vxlanTunnelMACAddrV6="01:00:5e:00:00:01")
    with pytest.raises(ValidationError) as caught:
        parse_resource(bad)
    assert caught.value.field.endswith("vxlanTunnelMACAddrV6")
    assert "unicast" in caught.value.message

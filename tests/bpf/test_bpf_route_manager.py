"""The routes trie: `agent.bpf.route_table` (pure) and `BpfRouteManager` on a FakeMap."""

from __future__ import annotations

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.maps import routes as routes_map
from pyfelix.agent.bpf.route_table import RouteInputs, compile_routes
from pyfelix.agent.dataplane.events import (
    IFACE_ABSENT,
    IFACE_UP,
    InterfaceAddrsUpdate,
    InterfaceUpdate,
)
from pyfelix.agent.dataplane.managers.bpf_routes import BpfRouteManager
from tests.bpf.fakes import fake_maps


def rows(entries: dict[bytes, bytes]) -> dict[str, dict]:
    return {routes_map.decode_key(k): routes_map.decode_value(v) for k, v in entries.items()}


def test_routes_pools_and_host_ips() -> None:
    inputs = RouteInputs(hostname="node1")
    for msg in (p.HostMetadataUpdate("node1", "198.18.0.1"),
                p.HostMetadataUpdate("node2", "198.18.0.2"),
                p.IPAMPoolUpdate("10.65.0.0/16", "10.65.0.0/16", masquerade=True),
                p.RouteUpdate("10.65.1.0/26", "remote_workload", dst_node="node2",
                              dst_node_ip="198.18.0.2"),
                p.RouteUpdate("10.65.0.5/32", "local_workload", local_workload_iface="cali1"),
                p.IPAMPoolUpdate("fd00::/48", "fd00::/48"),
                p.RouteUpdate("fd00::/64", "remote_workload", dst_node="node2",
                              dst_node_ip="fd01::2")):
        assert inputs.apply(msg)
    assert not inputs.apply(p.InSync())
    problems: list[str] = []
    out = rows(compile_routes(inputs, {"cali1": 9}, problems))
    assert out["198.18.0.1/32"]["flags"] == ["local_host"]
    assert out["198.18.0.2/32"] == {"flags": ["remote_host"], "ifindex": 0,
                                    "next_hop": "198.18.0.2"}
    assert out["10.65.1.0/26"]["flags"] == ["in_pool", "nat_outgoing", "remote_workload"]
    assert out["10.65.1.0/26"]["next_hop"] == "198.18.0.2"
    assert out["10.65.0.5/32"]["ifindex"] == 9
    # IPv6 entries beside the IPv4 ones, in the same trie (keyed by family)
    assert out["fd00::/64"] == {"flags": ["in_pool", "remote_workload"], "ifindex": 0,
                                "next_hop": "fd01::2"}
    assert out["fd00::/48"]["flags"] == ["in_pool"]
    assert len(out) == 7 and not problems  # 2 hosts, 2 pools, 3 routes
    inputs.apply(p.RouteUpdate("bogus", "remote_workload"))
    compile_routes(inputs, {}, problems)
    assert problems and "route bogus: field dst" in problems[0]


def test_manager_host_addresses_become_local_host_and_only_differences_are_written() -> None:
    routes = fake_maps()["routes"]
    lister = ({"eth0": 2, "cali1": 11}, {"eth0": frozenset({"198.18.0.1/15"}),
                                         "cali1": frozenset({"169.254.1.1/32"})})
    m = BpfRouteManager(routes, list_interfaces=lambda: lister)
    m.on_update(p.RouteUpdate("10.65.0.5/32", "local_workload", local_workload_iface="cali1"))
    m.apply()

    def flags() -> dict[str, list[str]]:
        return {k: v["flags"] for k, v in rows(dict(routes.data)).items()}

    assert flags()["198.18.0.1/32"] == ["local_host"]
    assert "169.254.1.1/32" not in flags()  # workload interfaces are not the host
    assert rows(dict(routes.data))["10.65.0.5/32"]["ifindex"] == 11
    writes = routes.writes
    m.on_update(InterfaceUpdate("eth0", 2, IFACE_UP))  # nothing new
    m.apply()
    assert routes.writes == writes
    m.on_update(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15", "192.0.2.7/24"})))
    m.apply()
    assert flags()["192.0.2.7/32"] == ["local_host"]
    # a route withdrawn: kept until in sync, then deleted
    m.on_update(p.RouteRemove("10.65.0.5/32"))
    m.apply()
    assert "10.65.0.5/32" in flags()
    m.on_update(p.InSync())
    m.apply()
    assert "10.65.0.5/32" not in flags()
    m.on_update(InterfaceUpdate("eth0", 2, IFACE_ABSENT))
    m.apply()
    assert "198.18.0.1/32" not in flags()

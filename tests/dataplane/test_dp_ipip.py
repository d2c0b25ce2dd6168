"""IPIP manager on a fake netlink: tunl0 (address, MTU, up), routes onlink via remote host
IPs, CrossSubnet, IpInIpEnabled/IpInIpMtu/IpInIpTunnelAddr, and a kernel without IPIP."""

from __future__ import annotations

import errno

import pytest

from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.managers.ipip import IPIP_ROUTE_PROTOCOL, IPIPError, IPIPManager
from pyfelix.agent.proto import (
    InSync,
    IPAMPoolUpdate,
    IPIPTunnelRemove,
    IPIPTunnelUpdate,
    RouteRemove,
    RouteUpdate,
)
from tests.fakes.link_netlink import FakeLinkNetlink


def tunnel(node: str, addr: str, parent: str) -> IPIPTunnelUpdate:
    return IPIPTunnelUpdate(node=node, ipv4_addr=addr, parent_device_ip=parent)


def route(dst: str, node: str, node_ip: str, pool_type: str = "ipip") -> RouteUpdate:
    return RouteUpdate(dst=dst, type="remote_workload", dst_node=node, dst_node_ip=node_ip,
                       ip_pool_type=pool_type)


def pool(mode: str = "Always") -> IPAMPoolUpdate:
    return IPAMPoolUpdate(id="10.65.0.0/16", cidr="10.65.0.0/16", ipip_mode=mode)


class Node:
    def __init__(self, **kw: object) -> None:
        self.nl = FakeLinkNetlink()
        self.eth0 = self.nl.add_link("eth0", mtu=1500)
        self.nl.addrs[self.eth0.index].add("198.18.0.1/24")
        self.mgr = IPIPManager(netlink=self.nl, **kw)  # type: ignore[arg-type]

    def sync(self, *msgs: object) -> None:
        for msg in (InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/24"})), *msgs, InSync()):
            self.mgr.on_update(msg)
        self.mgr.apply()

    @property
    def device(self):  # type: ignore[no-untyped-def]
        return self.nl.by_name("tunl0")


BASE = (pool(), tunnel("node1", "10.65.255.1", "198.18.0.1"),
        tunnel("node2", "10.65.255.2", "198.18.0.2"),
        route("10.65.1.0/26", "node2", "198.18.0.2"))


def test_device_and_onlink_routes() -> None:
    n = Node()
    n.sync(*BASE)
    dev = n.device
    assert dev is not None and dev.kind == "ipip" and dev.admin_up and dev.mtu == 1480
    assert n.nl.addrs[dev.index] == {"10.65.255.1/32"}
    assert n.nl.routes_via(dev.index) == {"10.65.1.0/26": "198.18.0.2"}
    assert all(r.onlink and r.protocol == IPIP_ROUTE_PROTOCOL for r in n.nl.routes.values())
    requests = n.nl.requests
    n.mgr.apply()
    assert n.nl.requests == requests  # same state: nothing written


def test_non_ipip_routes_and_local_routes_are_not_programmed() -> None:
    n = Node()
    n.sync(*BASE, route("10.66.0.0/26", "node2", "198.18.0.2", pool_type="vxlan"),
           route("10.65.2.0/26", "node1", "198.18.0.1"))
    assert set(n.nl.routes_via(n.device.index)) == {"10.65.1.0/26"}


def test_cross_subnet_same_subnet_goes_direct_other_subnet_tunnels() -> None:
    n = Node()
    n.sync(pool("CrossSubnet"), *BASE[1:], tunnel("node3", "10.65.255.3", "198.19.0.3"),
           route("10.65.3.0/26", "node3", "198.19.0.3"))
    assert n.nl.routes_via(n.eth0.index) == {"10.65.1.0/26": "198.18.0.2"}
    assert n.nl.routes_via(n.device.index) == {"10.65.3.0/26": "198.19.0.3"}
    direct = next(r for r in n.nl.routes.values() if r.dst == "10.65.1.0/26")
    assert not direct.onlink


def test_settings_override_address_and_mtu() -> None:
    n = Node(mtu=1400, tunnel_addr="10.65.9.9")
    n.sync(*BASE)
    assert n.device.mtu == 1400 and n.nl.addrs[n.device.index] == {"10.65.9.9/32"}


def test_ipip_disabled_means_no_device_and_no_routes() -> None:
    n = Node(enabled=False)
    n.sync(*BASE)
    assert n.device is None and not n.nl.routes


def test_removal_takes_routes_and_address_but_leaves_tunl0() -> None:
    n = Node()
    n.sync(*BASE)
    index = n.device.index
    for msg in (RouteRemove("10.65.1.0/26"), IPIPTunnelRemove("node2"),
                IPIPTunnelRemove("node1")):
        n.mgr.on_update(msg)
    n.mgr.apply()
    assert not n.nl.routes and n.nl.addrs[index] == set() and n.device is not None


def test_kernel_without_ipip_raises_a_named_error_and_programs_nothing() -> None:
    n = Node()
    n.nl.fail_next(1, errno.EOPNOTSUPP, op="add ipip")
    with pytest.raises(IPIPError, match=r"tunl0.*CONFIG_NET_IPIP"):
        n.sync(*BASE)
    assert not n.nl.routes
    n.mgr.apply()  # the failure stays pending and is retried
    assert n.device is not None and n.nl.routes


def test_iptables_admits_ipip_only_from_known_nodes_in_both_modes() -> None:
    from pyfelix.agent.dataplane.iptables.render import RuleRenderer

    for workload_policy in (True, False):
        chains = {c.name: c.rules for c in RuleRenderer().static_chains(
            ipip=True, workload_policy=workload_policy)}
        assert chains["cali-INPUT"][:2] == (
            "-p 4 -m set --match-set cali40all-hosts-net src -j ACCEPT", "-p 4 -j DROP")
        assert chains["cali-OUTPUT"][0] == ("-p 4 -m set --match-set cali40all-hosts-net dst "
                                            "-j ACCEPT")
        plain = {c.name: c.rules for c in RuleRenderer().static_chains(
            workload_policy=workload_policy)}
        assert not any("-p 4" in r for r in plain["cali-INPUT"] + plain["cali-OUTPUT"])


@pytest.mark.parametrize(("allow_vxlan", "allow_ipip"), [(False, False), (True, True)])
def test_iptables_workload_chains_drop_tunnel_packets_while_in_use(allow_vxlan: bool,
                                                                  allow_ipip: bool) -> None:
    import re

    from pyfelix.agent.proto import IPIPTunnelRemove, VXLANTunnelEndpointRemove
    from pyfelix.agent.proto import VXLANTunnelEndpointUpdate as Vtep
    from tests.dataplane.dp_harness import Harness, endpoint

    h = Harness(allow_vxlan_from_workloads=allow_vxlan, allow_ipip_from_workloads=allow_ipip)

    def from_chain() -> list[str]:
        rules = h.cmds.iptables.tables["filter"]["cali-fw-cali0"]
        return [re.sub(r"\s*-m comment --comment \S+", "", str(r)).strip() for r in rules]

    drops = {"-p udp --dport 4789 -j DROP", "-p 4 -j DROP"}
    h.sync([endpoint("cali0", "10.65.0.1")])
    assert not drops & set(from_chain())  # no tunnels in use
    h.feed([tunnel("node2", "10.65.255.2", "198.18.0.2"),
            Vtep("node2", "02:00:00:00:00:02", "10.65.254.2", "198.18.0.2")])
    h.apply()
    expected = set() if allow_vxlan else drops
    assert drops & set(from_chain()) == expected
    assert not drops & set(h.cmds.iptables.tables["filter"]["cali-tw-cali0"])  # ingress: policy's
    h.feed([IPIPTunnelRemove("node2"), VXLANTunnelEndpointRemove("node2")])
    h.apply()
    assert not drops & set(from_chain())


@pytest.mark.parametrize("allow_vxlan", [False, True])
def test_ip6tables_workload_chains_drop_vxlan_while_ipv6_vteps_exist(allow_vxlan: bool) -> None:
    """VXLAN over IPv6 (vxlan-v6.calico) in use: pods may not send IPv6 VXLAN either (unless
    AllowVXLANPacketsFromWorkloads); the IPv4 chains follow the IPv4 VTEPs only."""
    import re

    from pyfelix.agent.proto import VXLANTunnelEndpointRemove
    from pyfelix.agent.proto import VXLANTunnelEndpointUpdate as Vtep
    from tests.dataplane.dp_harness import Harness, endpoint

    h = Harness(allow_vxlan_from_workloads=allow_vxlan)

    def from_chain(tables) -> set[str]:  # type: ignore[no-untyped-def]
        rules = tables["filter"]["cali-fw-cali0"]
        return {re.sub(r"\s*-m comment --comment \S+", "", str(r)).strip() for r in rules}

    drop = "-p udp --dport 4789 -j DROP"
    h.sync([endpoint("cali0", "10.65.0.1")])
    assert drop not in from_chain(h.cmds.iptables6.tables)
    h.feed([Vtep("node2", "", "", "", ipv6_addr="fd00:65::ff:2", mac_v6="02:00:00:00:06:02",
                 parent_device_ipv6="fd00:18::2")])
    h.apply()
    assert (drop in from_chain(h.cmds.iptables6.tables)) is not allow_vxlan
    assert drop not in from_chain(h.cmds.iptables.tables)  # no IPv4 VTEP
    h.feed([VXLANTunnelEndpointRemove("node2")])
    h.apply()
    assert drop not in from_chain(h.cmds.iptables6.tables)

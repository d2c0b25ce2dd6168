"""VXLAN manager on a fake netlink: device, FDB/ARP entries, routes, and their lifecycle."""

from __future__ import annotations

import errno

import pytest

from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.managers.vxlan import VXLAN_ROUTE_PROTOCOL, VXLANError, VXLANManager
from pyfelix.agent.proto import (
    InSync,
    IPAMPoolUpdate,
    RouteRemove,
    RouteUpdate,
    VXLANTunnelEndpointRemove,
    VXLANTunnelEndpointUpdate,
)
from pyfelix.agent.shims.link_netlink import AF_INET, Neighbour, VXLANInfo
from tests.fakes.link_netlink import FakeLinkNetlink

MAC1, MAC2, MAC3 = "02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"


def vtep(node: str, addr: str, parent: str, mac: str) -> VXLANTunnelEndpointUpdate:
    return VXLANTunnelEndpointUpdate(node=node, mac=mac, ipv4_addr=addr, parent_device_ip=parent)


def route(dst: str, node: str, pool_type: str = "vxlan") -> RouteUpdate:
    return RouteUpdate(dst=dst, type="remote_workload", dst_node=node, ip_pool_type=pool_type)


def pool(mode: str = "Always") -> IPAMPoolUpdate:
    return IPAMPoolUpdate(id="10.65.0.0/16", cidr="10.65.0.0/16", vxlan_mode=mode)


class Node:
    def __init__(self, **kw: object) -> None:
        self.nl = FakeLinkNetlink()
        self.eth0 = self.nl.add_link("eth0", mtu=1500)
        self.nl.addrs[self.eth0.index].add("198.18.0.1/15")
        self.mgr = VXLANManager(netlink=self.nl, **kw)  # type: ignore[arg-type]

    def feed(self, *msgs: object) -> None:
        for msg in msgs:
            self.mgr.on_update(msg)

    def sync(self, *msgs: object) -> None:
        self.feed(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})), *msgs, InSync())
        self.mgr.apply()

    @property
    def device(self):  # type: ignore[no-untyped-def]
        return self.nl.by_name("vxlan.calico")


BASE = (pool(), vtep("node1", "10.65.255.1", "198.18.0.1", MAC1),
        vtep("node2", "10.65.255.2", "198.18.0.2", MAC2), route("10.65.1.0/26", "node2"))


def test_device_entries_and_routes_for_remote_vteps() -> None:
    n = Node()
    n.sync(*BASE)
    dev = n.device
    assert dev is not None and dev.kind == "vxlan" and dev.admin_up
    assert dev.vxlan == VXLANInfo(vni=4096, local="198.18.0.1", parent_index=n.eth0.index,
                                  port=4789, learning=False)
    assert dev.mac == MAC1 and dev.mtu == 1450  # parent MTU - 50
    assert n.nl.addrs[dev.index] == {"10.65.255.1/32"}
    assert n.nl.arp(dev.index) == {"10.65.255.2": MAC2}  # the remote VTEP only
    assert n.nl.fdb(dev.index) == {MAC2: "198.18.0.2"}
    assert n.nl.routes_via(dev.index) == {"10.65.1.0/26": "10.65.255.2"}
    assert all(r.onlink and r.protocol == VXLAN_ROUTE_PROTOCOL for r in n.nl.routes.values())
    requests = n.nl.requests
    n.mgr.apply()
    assert n.nl.requests == requests  # same state: nothing written


def test_vtep_and_route_changes_follow() -> None:
    n = Node()
    n.sync(*BASE)
    dev = n.device
    n.feed(vtep("node3", "10.65.255.3", "198.18.0.3", MAC3), route("10.65.2.0/26", "node3"),
           vtep("node2", "10.65.255.22", "198.18.0.2", MAC2))
    n.mgr.apply()
    assert n.nl.arp(dev.index) == {"10.65.255.22": MAC2, "10.65.255.3": MAC3}
    assert n.nl.routes_via(dev.index) == {"10.65.1.0/26": "10.65.255.22",
                                          "10.65.2.0/26": "10.65.255.3"}
    n.feed(VXLANTunnelEndpointRemove("node3"), RouteRemove("10.65.2.0/26"),
           route("10.65.1.0/26", "node2", pool_type=""))  # the pool stopped being VXLAN
    n.mgr.apply()
    assert n.nl.arp(dev.index) == {"10.65.255.22": MAC2}
    assert n.nl.fdb(dev.index) == {MAC2: "198.18.0.2"}
    assert n.nl.routes_via(dev.index) == {}


def test_route_waits_for_its_nodes_vtep() -> None:
    n = Node()
    n.sync(pool(), vtep("node1", "10.65.255.1", "198.18.0.1", MAC1), route("10.65.1.0/26", "node2"))
    assert n.nl.routes_via(n.device.index) == {}
    n.feed(vtep("node2", "10.65.255.2", "198.18.0.2", MAC2))
    n.mgr.apply()
    assert n.nl.routes_via(n.device.index) == {"10.65.1.0/26": "10.65.255.2"}


def test_cross_subnet_goes_direct_inside_our_subnet_and_encapsulates_outside() -> None:
    n = Node()
    n.sync(pool("CrossSubnet"), *BASE[1:], vtep("far", "10.65.255.9", "203.0.113.9", MAC3),
           route("10.65.9.0/26", "far"))
    direct = n.nl.routes[("10.65.1.0/26", 254)]
    assert (direct.gateway, direct.ifindex, direct.onlink) == ("198.18.0.2", n.eth0.index, False)
    tunnelled = n.nl.routes[("10.65.9.0/26", 254)]
    assert (tunnelled.gateway, tunnelled.ifindex) == ("10.65.255.9", n.device.index)
    n.feed(pool("Always"))
    n.mgr.apply()
    assert n.nl.routes_via(n.device.index) == {"10.65.1.0/26": "10.65.255.2",
                                               "10.65.9.0/26": "10.65.255.9"}


def test_device_goes_with_the_last_local_vtep_but_only_after_in_sync() -> None:
    nl = FakeLinkNetlink()
    eth0 = nl.add_link("eth0")
    nl.addrs[eth0.index].add("198.18.0.1/15")
    first = VXLANManager(netlink=nl)
    for msg in (InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})), *BASE, InSync()):
        first.on_update(msg)
    first.apply()
    # a restarted agent that has not heard of the VTEPs yet leaves the device alone
    restarted = VXLANManager(netlink=nl)
    restarted.on_update(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})))
    restarted.apply()
    assert nl.by_name("vxlan.calico") is not None
    assert nl.routes_via(nl.by_name("vxlan.calico").index)  # type: ignore[union-attr]
    restarted.on_update(InSync())
    restarted.apply()
    assert nl.by_name("vxlan.calico") is None
    assert nl.routes == {}


def test_drift_is_repaired_on_resync() -> None:
    n = Node()
    n.sync(*BASE)
    dev = n.device
    n.nl.neighbours.clear()
    n.nl.set_link(dev.index, mtu=9000)
    n.nl.routes.clear()
    n.nl.replace_neighbour(Neighbour(AF_INET, dev.index, "10.65.255.77", "02:00:00:00:00:77"))
    n.mgr.request_resync()
    n.mgr.apply()
    assert n.nl.arp(dev.index) == {"10.65.255.2": MAC2}  # stray entry on our device removed
    assert n.nl.fdb(dev.index) == {MAC2: "198.18.0.2"}
    assert n.device.mtu == 1450
    assert n.nl.routes_via(dev.index) == {"10.65.1.0/26": "10.65.255.2"}


def test_device_with_other_settings_is_recreated() -> None:
    n = Node()
    n.nl.add_vxlan("vxlan.calico", VXLANInfo(1, "198.18.0.1", n.eth0.index, 8472, True),
                   mac=MAC3, mtu=1400)
    n.sync(*BASE)
    assert n.device.vxlan.vni == 4096 and n.device.vxlan.port == 4789  # type: ignore[union-attr]
    assert n.device.mac == MAC1


def test_configured_mtu_vni_and_port() -> None:
    n = Node(mtu=1400, vni=77, port=8472)
    n.sync(*BASE)
    assert n.device.mtu == 1400
    assert (n.device.vxlan.vni, n.device.vxlan.port) == (77, 8472)  # type: ignore[union-attr]
    for kw, name in (({"vni": 0}, "VXLANVNI"), ({"port": 70000}, "VXLANPort"),
                     ({"mtu": 20}, "VXLANMTU")):
        with pytest.raises(ValueError, match=name):
            VXLANManager(netlink=FakeLinkNetlink(), **kw)  # type: ignore[arg-type]


def test_failed_write_is_retried() -> None:
    n = Node()
    n.nl.fail_next(1, errno.EBUSY, op="replace route")
    with pytest.raises(VXLANError, match="injected"):
        n.sync(*BASE)
    assert n.nl.routes == {}
    assert n.nl.arp(n.device.index) == {"10.65.255.2": MAC2}  # the rest went in
    n.mgr.apply()
    assert n.nl.routes_via(n.device.index) == {"10.65.1.0/26": "10.65.255.2"}


def test_no_device_until_the_parent_interface_has_the_vtep_parent_ip() -> None:
    n = Node()
    n.nl.addrs[n.eth0.index].clear()  # the underlay address is not configured yet
    n.feed(*BASE, InSync())
    n.mgr.apply()
    assert n.device is None
    n.nl.addrs[n.eth0.index].add("198.18.0.1/15")
    n.feed(InterfaceAddrsUpdate("eth0", frozenset({"198.18.0.1/15"})))
    n.mgr.apply()
    assert n.device is not None


def test_restart_with_in_sync_before_the_interface_dump_keeps_the_device() -> None:
    n = Node()
    n.sync(*BASE)
    index = n.device.index
    restarted = VXLANManager(netlink=n.nl)
    for msg in (*BASE, InSync()):  # no InterfaceAddrsUpdate yet
        restarted.on_update(msg)
    writes = n.nl.requests
    restarted.apply()
    assert n.nl.requests == writes  # the parent was found in the kernel: nothing rewritten
    assert n.device is not None and n.device.index == index


# --- IPv6: vxlan-v6.calico ------------------------------------------------------------------

MAC6_1, MAC6_2 = "02:00:00:00:06:01", "02:00:00:00:06:02"


def vtep_dual(node: str, n: int, mac4: str, mac6: str) -> VXLANTunnelEndpointUpdate:
    return VXLANTunnelEndpointUpdate(
        node=node, mac=mac4, ipv4_addr=f"10.65.255.{n}", parent_device_ip=f"198.18.0.{n}",
        ipv6_addr=f"fd00:65::ff:{n}", mac_v6=mac6, parent_device_ipv6=f"fd00:18::{n}")


class DualNode:
    """One namespace with both managers, as linux_managers() builds them."""

    def __init__(self) -> None:
        self.nl = FakeLinkNetlink()
        self.eth0 = self.nl.add_link("eth0", mtu=1500)
        self.addrs = frozenset({"198.18.0.1/15", "fd00:18::1/64", "fe80::1/64"})
        self.nl.addrs[self.eth0.index].update(self.addrs)
        self.v4 = VXLANManager(netlink=self.nl)
        self.v6 = VXLANManager(netlink=self.nl, ip_version=6)

    def sync(self, *msgs: object) -> None:
        for mgr in (self.v4, self.v6):
            for msg in (InterfaceAddrsUpdate("eth0", self.addrs), *msgs, InSync()):
                mgr.on_update(msg)
            mgr.apply()


DUAL = (pool(), IPAMPoolUpdate(id="fd00:65::/112", cidr="fd00:65::/112", vxlan_mode="Always"),
        vtep_dual("node1", 1, MAC1, MAC6_1), vtep_dual("node2", 2, MAC2, MAC6_2),
        route("10.65.1.0/26", "node2"), route("fd00:65::100/122", "node2"))


def test_ipv6_device_entries_and_routes_beside_the_ipv4_ones() -> None:
    n = DualNode()
    n.sync(*DUAL)
    dev4, dev6 = n.nl.by_name("vxlan.calico"), n.nl.by_name("vxlan-v6.calico")
    assert dev4 is not None and dev6 is not None
    assert dev6.vxlan == VXLANInfo(vni=4096, local="fd00:18::1", parent_index=n.eth0.index,
                                   port=4789, learning=False)
    assert dev6.mac == MAC6_1 and dev6.mtu == 1430  # parent MTU - 70
    assert n.nl.addrs[dev6.index] == {"fd00:65::ff:1/128"}
    assert n.nl.ndp(dev6.index) == {"fd00:65::ff:2": MAC6_2}
    assert n.nl.fdb(dev6.index) == {MAC6_2: "fd00:18::2"}
    assert n.nl.routes_via(dev6.index) == {"fd00:65::100/122": "fd00:65::ff:2"}
    # the IPv4 side is exactly what it is without IPv6
    assert n.nl.routes_via(dev4.index) == {"10.65.1.0/26": "10.65.255.2"}
    assert n.nl.arp(dev4.index) == {"10.65.255.2": MAC2} and dev4.mtu == 1450
    requests = n.nl.requests
    n.v4.apply()
    n.v6.apply()
    assert n.nl.requests == requests  # same state: nothing written


def test_the_two_managers_never_delete_each_others_routes_on_resync() -> None:
    n = DualNode()
    n.sync(*DUAL)
    before = dict(n.nl.routes)
    # both re-read the kernel (same protocol 81) and find nothing to delete
    for mgr in (n.v4, n.v6):
        mgr._resync_requested = True
        mgr.apply()
    assert n.nl.routes == before and len(before) == 2
    # an IPv6 route going is removed by the IPv6 manager only
    for mgr in (n.v4, n.v6):
        mgr.on_update(RouteRemove(dst="fd00:65::100/122"))
        mgr.apply()
    assert [dst for dst, _ in n.nl.routes] == ["10.65.1.0/26"]


def test_ipv6_vtep_gone_removes_the_ipv6_device_only() -> None:
    n = DualNode()
    n.sync(*DUAL)
    ipv4_only = VXLANTunnelEndpointUpdate(node="node1", mac=MAC1, ipv4_addr="10.65.255.1",
                                          parent_device_ip="198.18.0.1")
    n.sync(ipv4_only)
    assert n.nl.by_name("vxlan-v6.calico") is None
    assert n.nl.by_name("vxlan.calico") is not None
    assert n.nl.routes_via(n.nl.by_name("vxlan.calico").index) == {
        "10.65.1.0/26": "10.65.255.2"}


def test_kernel_link_local_on_the_device_is_left_alone() -> None:
    n = DualNode()
    n.sync(*DUAL)
    dev6 = n.nl.by_name("vxlan-v6.calico")
    n.nl.addrs[dev6.index].add("fe80::ff:fe00:601/64")  # what the kernel adds itself
    n.v6._resync_requested = True
    n.v6.apply()
    assert "fe80::ff:fe00:601/64" in n.nl.addrs[dev6.index]


def test_ipv6_manager_refuses_a_bad_version() -> None:
    with pytest.raises(ValueError, match="ip_version"):
        VXLANManager(netlink=FakeLinkNetlink(), ip_version=5)


def test_ipv6_cross_subnet_same_subnet_goes_over_the_underlay() -> None:
    n = DualNode()
    cross = IPAMPoolUpdate(id="fd00:65::/112", cidr="fd00:65::/112", vxlan_mode="CrossSubnet")
    far = VXLANTunnelEndpointUpdate(node="node3", mac="", ipv4_addr="", parent_device_ip="",
                                    ipv6_addr="fd00:65::ff:3", mac_v6="02:00:00:00:06:03",
                                    parent_device_ipv6="fd00:19::3")  # another subnet
    n.sync(pool(), cross, vtep_dual("node1", 1, MAC1, MAC6_1), vtep_dual("node2", 2, MAC2, MAC6_2),
           far, route("fd00:65::100/122", "node2"), route("fd00:65::200/122", "node3"))
    dev6 = n.nl.by_name("vxlan-v6.calico")
    assert n.nl.routes_via(n.eth0.index) == {"fd00:65::100/122": "fd00:18::2"}  # same /64
    assert n.nl.routes_via(dev6.index) == {"fd00:65::200/122": "fd00:65::ff:3"}
    assert not n.nl.routes[("fd00:65::100/122", 254)].onlink
    # node3 has no IPv4 VTEP: nothing of it on vxlan.calico
    dev4 = n.nl.by_name("vxlan.calico")
    assert n.nl.arp(dev4.index) == {"10.65.255.2": MAC2}


def test_ipv6_parent_found_whatever_the_spelling() -> None:
    n = DualNode()
    spelled = VXLANTunnelEndpointUpdate(
        node="node1", mac=MAC1, ipv4_addr="10.65.255.1", parent_device_ip="198.18.0.1",
        ipv6_addr="fd00:65::ff:1", mac_v6=MAC6_1, parent_device_ipv6="FD00:18:0:0::1")
    n.sync(*DUAL[:2], spelled, *DUAL[3:])
    dev6 = n.nl.by_name("vxlan-v6.calico")
    assert dev6 is not None and n.nl.routes_via(dev6.index) == {
        "fd00:65::100/122": "fd00:65::ff:2"}
    assert dev6.vxlan is not None and dev6.vxlan.local == "fd00:18::1"  # the kernel's form
    n.v6._resync_requested = True
    requests = n.nl.requests
    n.v6.apply()
    assert n.nl.requests == requests  # what it reads back is what it wants: no rewrite

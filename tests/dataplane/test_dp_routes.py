"""RouteManager on FakeNetlink: routes follow endpoints and interface state; foreign routes
are never touched; stale routes of ours go only after InSync; failures stay pending."""

from __future__ import annotations

import errno

import pytest

from pyfelix.agent.dataplane.events import InterfaceUpdate
from pyfelix.agent.dataplane.managers.routes import ROUTE_PROTOCOL, RouteError, RouteManager
from pyfelix.agent.proto import (
    InSync,
    RouteRemove,
    RouteUpdate,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.link_netlink import AF_INET, Neighbour
from pyfelix.agent.shims.netlink import RT_SCOPE_LINK, Route
from tests.fakes.link_netlink import FakeLinkNetlink
from tests.fakes.netlink import FakeNetlink

EP1 = WorkloadEndpointID("k8s", "ns/pod1", "eth0")
EP2 = WorkloadEndpointID("k8s", "ns/pod2", "eth0")


def _ep(iface: str, *nets: str) -> WorkloadEndpoint:
    return WorkloadEndpoint(state="active", name=iface, ipv4_nets=nets)


def _iface(nl: FakeNetlink, name: str) -> InterfaceUpdate:
    link = nl.link_by_name(name)
    return InterfaceUpdate(name, link.index, "up" if link.up else "down")


def _ours(nl: FakeNetlink) -> dict[str, tuple[str, int]]:
    return {r.dst: (r.type, r.ifindex) for r in nl.routes if r.protocol == ROUTE_PROTOCOL}


@pytest.fixture
def nl() -> FakeNetlink:
    return FakeNetlink()


def test_route_appears_only_when_interface_is_up(nl: FakeNetlink) -> None:
    m = RouteManager(netlink=nl)
    m.on_update(InSync())
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.apply()
    assert _ours(nl) == {}
    nl.add_link("cali1", up=False)
    m.on_update(_iface(nl, "cali1"))
    m.apply()
    assert _ours(nl) == {}
    nl.set_link_up("cali1", True)
    m.on_update(_iface(nl, "cali1"))
    m.apply()
    idx = nl.link_by_name("cali1").index
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", idx)}
    (route,) = nl.routes_to("10.65.0.1/32")
    assert route.scope == RT_SCOPE_LINK


def test_route_follows_endpoint_changes_and_removal(nl: FakeNetlink) -> None:
    m = RouteManager(netlink=nl)
    for name in ("cali1", "cali2"):
        nl.add_link(name)
        m.on_update(_iface(nl, name))
    m.on_update(InSync())
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32", "10.65.0.9")))
    m.apply()
    assert set(_ours(nl)) == {"10.65.0.1/32", "10.65.0.9/32"}
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali2", "10.65.0.1/32")))
    m.apply()
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", nl.link_by_name("cali2").index)}
    m.on_update(WorkloadEndpointRemove(EP1))
    m.apply()
    assert _ours(nl) == {}


def test_interface_removal_then_return_with_new_index(nl: FakeNetlink) -> None:
    m = RouteManager(netlink=nl)
    nl.add_link("cali1")
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.on_update(InSync())
    m.apply()
    old = nl.link_by_name("cali1")
    nl.remove_link("cali1")
    m.on_update(InterfaceUpdate("cali1", old.index, "absent"))
    m.apply()
    assert _ours(nl) == {}
    nl.add_link("cali1")
    m.on_update(_iface(nl, "cali1"))
    m.apply()
    new = nl.link_by_name("cali1")
    assert new.index != old.index
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", new.index)}


def test_foreign_routes_are_never_touched(nl: FakeNetlink) -> None:
    nl.add_link("eth0")
    nl.add_link("cali1")
    foreign = Route(dst="10.65.0.1/32", ifindex=nl.link_by_name("eth0").index, protocol=4)
    other = Route(dst="10.99.0.0/24", ifindex=nl.link_by_name("eth0").index, protocol=12)
    nl.routes |= {foreign, other}
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.on_update(InSync())
    m.apply()  # conflict: logged, not an error, foreign route kept
    assert foreign in nl.routes and other in nl.routes
    assert "10.65.0.1/32" in m.conflicts
    m.on_update(WorkloadEndpointRemove(EP1))
    m.apply()
    m.request_resync()
    m.apply()
    assert foreign in nl.routes and other in nl.routes


def test_stale_routes_of_ours_removed_only_after_insync(nl: FakeNetlink) -> None:
    nl.add_link("cali1")
    idx = nl.link_by_name("cali1").index
    stale = Route(dst="10.65.0.7/32", ifindex=idx, protocol=ROUTE_PROTOCOL, scope=RT_SCOPE_LINK)
    nl.routes.add(stale)
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.apply()
    assert stale in nl.routes and "10.65.0.1/32" in _ours(nl)
    m.on_update(InSync())
    m.apply()
    assert stale not in nl.routes and set(_ours(nl)) == {"10.65.0.1/32"}


def test_existing_correct_route_is_adopted_without_writes(nl: FakeNetlink) -> None:
    nl.add_link("cali1")
    idx = nl.link_by_name("cali1").index
    nl.routes.add(Route(dst="10.65.0.1/32", ifindex=idx, protocol=ROUTE_PROTOCOL,
                        scope=RT_SCOPE_LINK))
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.on_update(InSync())
    m.apply()
    m.apply()
    assert nl.requests == 0


def test_drift_repaired_on_resync(nl: FakeNetlink) -> None:
    nl.add_link("cali1")
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.on_update(InSync())
    m.apply()
    nl.routes.clear()  # someone flushed the table
    m.apply()
    assert _ours(nl) == {}  # no resync yet: the manager trusts its cache
    m.request_resync()
    m.apply()
    assert "10.65.0.1/32" in _ours(nl)


def test_failure_keeps_work_pending_and_retry_completes(nl: FakeNetlink) -> None:
    for name in ("cali1", "cali2"):
        nl.add_link(name)
    m = RouteManager(netlink=nl)
    for name in ("cali1", "cali2"):
        m.on_update(_iface(nl, name))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    m.on_update(WorkloadEndpointUpdate(EP2, _ep("cali2", "10.65.0.2/32")))
    m.on_update(InSync())
    nl.fail_next(1, errno.ENOBUFS, op="dump")
    with pytest.raises(Exception, match="ENOBUFS"):
        m.apply()
    assert _ours(nl) == {}
    nl.fail_next(1, errno.EBUSY, op="add route")
    with pytest.raises(RouteError, match="1 route write"):
        m.apply()
    assert len(_ours(nl)) == 1
    m.apply()
    assert set(_ours(nl)) == {"10.65.0.1/32", "10.65.0.2/32"}


def test_blackhole_routes_for_local_blocks(nl: FakeNetlink) -> None:
    m = RouteManager(netlink=nl)
    m.on_update(RouteUpdate(dst="10.65.1.0/26", type="local_workload"))
    m.on_update(RouteUpdate(dst="10.65.9.0/26", type="remote_workload", dst_node="n2",
                            dst_node_ip="198.18.0.2"))
    m.on_update(InSync())
    m.apply()
    assert _ours(nl) == {"10.65.1.0/26": ("blackhole", 0)}
    m.on_update(RouteRemove("10.65.1.0/26"))
    m.apply()
    assert _ours(nl) == {}


def test_bad_address_is_skipped_with_the_rest_programmed(nl: FakeNetlink) -> None:
    nl.add_link("cali1")
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "not-an-ip", "10.65.0.1/32")))
    m.on_update(InSync())
    m.apply()
    assert set(_ours(nl)) == {"10.65.0.1/32"}


def test_ipv6_workload_addresses_get_host_routes(nl: FakeNetlink) -> None:
    from pyfelix.agent.shims.netlink import AF_INET6

    nl.add_link("cali1")
    m = RouteManager(netlink=nl)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(WorkloadEndpointUpdate(EP1, WorkloadEndpoint(
        state="active", name="cali1", ipv4_nets=("10.65.0.1/32",),
        ipv6_nets=("fd00:65::1/128",))))
    m.on_update(InSync())
    m.apply()
    (route,) = nl.routes_to("fd00:65::1/128")
    assert route.family == AF_INET6 and route.protocol == ROUTE_PROTOCOL


# --- static ARP --------------------------------------------------------------------------

def _arp_setup() -> tuple[FakeNetlink, FakeLinkNetlink, RouteManager]:
    nl, neigh = FakeNetlink(), FakeLinkNetlink()
    for name in ("cali1", "cali2"):
        link = nl.add_link(name)
        neigh.add_link(name, index=link.index)
    manager = RouteManager(netlink=nl, neighbours=neigh)
    for name in ("cali1", "cali2"):
        manager.on_update(_iface(nl, name))
    return nl, neigh, manager


def _with_mac(iface: str, mac: str, *nets: str) -> WorkloadEndpoint:
    return WorkloadEndpoint(state="active", name=iface, mac=mac, ipv4_nets=nets,
                            ipv6_nets=("fd00::1/128",))


def test_static_arp_beside_the_route_when_the_mac_is_known() -> None:
    nl, neigh, m = _arp_setup()
    cali1 = nl.link_by_name("cali1").index
    m.on_update(InSync())
    m.on_update(WorkloadEndpointUpdate(EP1, _with_mac("cali1", "EE:00:00:00:00:01",
                                                      "10.65.0.1/32")))
    m.on_update(WorkloadEndpointUpdate(EP2, _ep("cali2", "10.65.0.2/32")))  # no MAC: no entry
    m.apply()
    assert neigh.arp(cali1) == {"10.65.0.1": "ee:00:00:00:00:01"}
    assert neigh.arp(nl.link_by_name("cali2").index) == {}
    assert "10.65.0.1/32" in _ours(nl)
    writes = neigh.requests
    m.apply()
    assert neigh.requests == writes
    # the MAC changes, then the endpoint goes: the entry follows, then goes
    m.on_update(WorkloadEndpointUpdate(EP1, _with_mac("cali1", "ee:00:00:00:00:99",
                                                      "10.65.0.1/32")))
    m.apply()
    assert neigh.arp(cali1) == {"10.65.0.1": "ee:00:00:00:00:99"}
    m.on_update(WorkloadEndpointRemove(EP1))
    m.apply()
    assert neigh.arp(cali1) == {}


def test_stale_static_arp_goes_only_after_in_sync_and_foreign_entries_stay() -> None:
    nl, neigh, m = _arp_setup()
    cali1 = nl.link_by_name("cali1").index
    eth0 = neigh.add_link("eth0")
    neigh.replace_neighbour(Neighbour(AF_INET, cali1, "10.65.0.9", "ee:00:00:00:00:09"))
    neigh.replace_neighbour(Neighbour(AF_INET, eth0.index, "198.18.0.9", "aa:00:00:00:00:09"))
    m.apply()  # before InSync: nothing deleted
    assert neigh.arp(cali1) == {"10.65.0.9": "ee:00:00:00:00:09"}
    m.on_update(InSync())
    m.apply()
    assert neigh.arp(cali1) == {}
    assert neigh.arp(eth0.index) == {"198.18.0.9": "aa:00:00:00:00:09"}  # not a workload iface


def test_static_arp_failure_is_retried() -> None:
    nl, neigh, m = _arp_setup()
    m.on_update(InSync())
    m.on_update(WorkloadEndpointUpdate(EP1, _with_mac("cali1", "ee:00:00:00:00:01",
                                                      "10.65.0.1/32")))
    neigh.fail_next(1, errno.EBUSY, op="replace neighbour")
    with pytest.raises(RouteError, match="injected"):
        m.apply()
    assert "10.65.0.1/32" in _ours(nl)  # the route went in regardless
    m.apply()
    assert neigh.arp(nl.link_by_name("cali1").index) == {"10.65.0.1": "ee:00:00:00:00:01"}


def test_restart_with_in_sync_before_the_interface_dump_deletes_no_route() -> None:
    nl = FakeNetlink()
    link = nl.add_link("cali1")
    first = RouteManager(netlink=nl)
    for msg in (InSync(), _iface(nl, "cali1"),
                WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32"))):
        first.on_update(msg)
    first.apply()
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", link.index)}
    # a restarted agent: the datastore is in sync before the monitor reported any interface
    restarted = RouteManager(netlink=nl)
    restarted.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))
    restarted.on_update(InSync())
    writes = nl.requests
    restarted.apply()
    assert nl.requests == writes  # nothing deleted, nothing re-added
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", link.index)}
    # the monitor's dump then confirms what was seeded: still nothing to write
    restarted.on_update(_iface(nl, "cali1"))
    restarted.apply()
    assert nl.requests == writes


@pytest.mark.parametrize("enabled", [True, False])
def test_floating_ips_are_routed_to_their_workload_when_enabled(nl: FakeNetlink,
                                                                enabled: bool) -> None:
    from dataclasses import replace

    from pyfelix.agent.proto import NatInfo

    m = RouteManager(netlink=nl, floating_ips=enabled)
    nl.add_link("cali1", up=True)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(InSync())
    endpoint = replace(_ep("cali1", "10.65.0.1/32"),
                       ipv4_nat=(NatInfo(ext_ip="192.0.2.5", int_ip="10.65.0.1"),))
    m.on_update(WorkloadEndpointUpdate(EP1, endpoint))
    m.apply()
    idx = nl.link_by_name("cali1").index
    expected = {"10.65.0.1/32": ("unicast", idx)}
    if enabled:
        expected["192.0.2.5/32"] = ("unicast", idx)
    assert _ours(nl) == expected
    m.on_update(WorkloadEndpointUpdate(EP1, _ep("cali1", "10.65.0.1/32")))  # the NAT goes
    m.apply()
    assert _ours(nl) == {"10.65.0.1/32": ("unicast", idx)}


@pytest.mark.parametrize("ipv6", [True, False])
def test_ipv6_floating_ips_are_routed_only_with_ipv6_support(nl: FakeNetlink,
                                                             ipv6: bool) -> None:
    from dataclasses import replace

    from pyfelix.agent.proto import NatInfo

    m = RouteManager(netlink=nl, floating_ips=True, ipv6=ipv6)
    nl.add_link("cali1", up=True)
    m.on_update(_iface(nl, "cali1"))
    m.on_update(InSync())
    endpoint = replace(_ep("cali1", "10.65.0.1/32"), ipv6_nets=("fd65::1/128",),
                       ipv4_nat=(NatInfo(ext_ip="192.0.2.5", int_ip="10.65.0.1"),),
                       ipv6_nat=(NatInfo(ext_ip="2001:db8::5", int_ip="fd65::1"),))
    m.on_update(WorkloadEndpointUpdate(EP1, endpoint))
    m.apply()
    idx = nl.link_by_name("cali1").index
    expected = {"10.65.0.1/32": ("unicast", idx), "192.0.2.5/32": ("unicast", idx)}
    if ipv6:
        expected |= {"fd65::1/128": ("unicast", idx), "2001:db8::5/128": ("unicast", idx)}
    assert _ours(nl) == expected

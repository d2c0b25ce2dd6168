"""Real kernel: routes and sysctls follow workload interfaces in a namespace the test made.

Topology: namespace HOST (where the managers and the interface monitor run) and namespace WL
(the workload); a veth pair `cali<n>` (HOST) <-> `eth0` (WL). Figures (time from the veth
appearing to route + sysctls being in place) are recorded with `record_property`.
"""

from __future__ import annotations

import time

import pytest
from pyroute2 import IPRoute

from pyfelix.agent.dataplane.ifacemonitor import InterfaceMonitor
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.managers.routes import ROUTE_PROTOCOL, RouteManager
from pyfelix.agent.dataplane.managers.sysctls import SysctlManager
from pyfelix.agent.proto import InSync, WorkloadEndpoint, WorkloadEndpointID, WorkloadEndpointUpdate
from tests.privileged.dataplane.dp_netns import in_ns

pytestmark = pytest.mark.privileged

EP = WorkloadEndpointID("k8s", "ns/pod1", "eth0")


def _routes(ns: str) -> dict[str, tuple[int, str]]:
    """dst -> (protocol, text) for every IPv4 main-table route in ns."""
    out = {}
    with IPRoute(netns=f"/run/netns/{ns}", flags=0) as ipr:
        for r in ipr.get_routes(family=2, table=254):
            dst = f"{r.get_attr('RTA_DST') or '0.0.0.0'}/{r['dst_len']}"
            out[dst] = (r["proto"], r.get_attr("RTA_OIF"))
    return out


def _sysctl(ns: str, path: str) -> str | None:
    out = in_ns(ns, "cat", f"/proc/sys/{path}", check=False).strip()
    return out or None


def _wait(pred, timeout: float = 10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout} s")


def _start_agent(host: str) -> tuple[DataplaneLoop, InterfaceMonitor]:
    loop = DataplaneLoop(
        [RouteManager(netns=host), SysctlManager(netns=host)], resync_interval=3600
    )
    mon = InterfaceMonitor(loop.enqueue, netns=host, resync_interval=3600, poll_interval=0.2)
    loop.start()
    mon.start()
    return loop, mon


def _stop(loop: DataplaneLoop, mon: InterfaceMonitor) -> None:
    mon.stop()
    loop.stop()
    for m in loop.managers:
        m.close()  # type: ignore[attr-defined]


def _add_veth(host: str, wl: str, iface: str) -> None:
    in_ns(host, "ip", "link", "add", iface, "type", "veth", "peer", "name", "eth0",
          "netns", f"/run/netns/{wl}")
    in_ns(wl, "ip", "addr", "add", "10.65.0.1/32", "dev", "eth0")
    in_ns(wl, "ip", "link", "set", "eth0", "up")
    in_ns(host, "ip", "link", "set", iface, "up")


def test_veth_appearing_gets_route_and_sysctls_and_loses_them_with_it(
    make_netns, record_property
) -> None:
    host, wl = make_netns(), make_netns()
    loop, mon = _start_agent(host)
    try:
        loop.enqueue(WorkloadEndpointUpdate(EP, WorkloadEndpoint(
            state="active", name="cali1a", ipv4_nets=("10.65.0.1/32",))))
        loop.enqueue(InSync())
        assert loop.in_sync.wait(10)
        assert _sysctl(host, "net/ipv4/ip_forward") == "1"
        t0 = time.monotonic()
        _add_veth(host, wl, "cali1a")

        def ready() -> bool:
            r = _routes(host).get("10.65.0.1/32")
            return (
                r is not None and r[0] == ROUTE_PROTOCOL
                and _sysctl(host, "net/ipv4/conf/cali1a/proxy_arp") == "1"
                and _sysctl(host, "net/ipv4/conf/cali1a/rp_filter") == "1"
            )

        _wait(ready)
        latency = time.monotonic() - t0
        record_property("route_and_sysctls_after_veth_s", round(latency, 3))
        print(f"route+sysctls in place {latency * 1000:.0f} ms after the veth appeared")
        for path, value in {
            "net/ipv4/conf/cali1a/forwarding": "1",
            "net/ipv4/conf/cali1a/route_localnet": "1",
            "net/ipv4/neigh/cali1a/proxy_delay": "0",
            "net/ipv6/conf/cali1a/accept_ra": "0",
            "net/ipv6/conf/cali1a/forwarding": "1",
            "net/ipv4/conf/default/rp_filter": "1",
        }.items():
            assert _sysctl(host, path) == value, path
        # the route really carries traffic: the workload answers ARP via proxy_arp setup
        in_ns(host, "ip", "link", "del", "cali1a")
        _wait(lambda: "10.65.0.1/32" not in _routes(host))
        # and comes back with a new veth of the same name (new ifindex)
        _add_veth(host, wl, "cali1a")
        _wait(lambda: "10.65.0.1/32" in _routes(host))
    finally:
        _stop(loop, mon)


def test_foreign_routes_survive_and_stale_routes_of_ours_go_after_restart(make_netns) -> None:
    host, wl = make_netns(), make_netns()
    _add_veth(host, wl, "cali2a")
    # a route someone else made (proto static), and a stale one of ours from a "previous run"
    in_ns(host, "ip", "route", "add", "10.66.0.0/24", "dev", "cali2a", "proto", "static")
    in_ns(host, "ip", "route", "add", "10.65.0.99/32", "dev", "cali2a", "scope", "link",
          "proto", str(ROUTE_PROTOCOL))
    loop, mon = _start_agent(host)
    try:
        loop.enqueue(WorkloadEndpointUpdate(EP, WorkloadEndpoint(
            state="active", name="cali2a", ipv4_nets=("10.65.0.1/32",))))
        # before InSync nothing is written at all; the stale route stays
        time.sleep(0.3)
        assert "10.65.0.99/32" in _routes(host)
        loop.enqueue(InSync())
        _wait(lambda: "10.65.0.1/32" in _routes(host) and "10.65.0.99/32" not in _routes(host))
        assert _routes(host)["10.66.0.0/24"][0] == 4  # RTPROT_STATIC, untouched
    finally:
        _stop(loop, mon)
    # "restart": a new agent whose datastore no longer has the endpoint
    loop, mon = _start_agent(host)
    try:
        loop.enqueue(InSync())
        _wait(lambda: "10.65.0.1/32" not in _routes(host))
        assert "10.66.0.0/24" in _routes(host)
    finally:
        _stop(loop, mon)


def test_route_table_protocol_marks_the_routes_and_scopes_what_is_ours(make_netns) -> None:
    """RouteTableProtocol (here 99) through the agent's own assembly
    (LinuxDataplaneConfig.from_config -> linux_managers): workload routes carry it, a stale
    route with it is removed after InSync, and one with the default protocol 80 is someone
    else's."""
    from pyfelix.agent.config import load_config
    from pyfelix.agent.dataplane.linux import LinuxDataplaneConfig, linux_managers
    from pyfelix.agent.dataplane.managers.routes import RouteManager as Routes

    host, wl = make_netns(), make_netns()
    _add_veth(host, wl, "cali3a")
    in_ns(host, "ip", "route", "add", "10.65.0.98/32", "dev", "cali3a", "scope", "link",
          "proto", "99")
    in_ns(host, "ip", "route", "add", "10.65.0.97/32", "dev", "cali3a", "scope", "link",
          "proto", str(ROUTE_PROTOCOL))
    config = load_config(environ={"FELIX_ROUTETABLEPROTOCOL": "99"})
    cfg = LinuxDataplaneConfig.from_config(config, bpf_mode=False)
    assert cfg.route_protocol == 99
    routes = [m for m in linux_managers(cfg, netns=host) if isinstance(m, Routes)]
    assert len(routes) == 1
    loop = DataplaneLoop([routes[0]], resync_interval=3600)
    mon = InterfaceMonitor(loop.enqueue, netns=host, resync_interval=3600, poll_interval=0.2)
    loop.start()
    mon.start()
    try:
        loop.enqueue(WorkloadEndpointUpdate(EP, WorkloadEndpoint(
            state="active", name="cali3a", ipv4_nets=("10.65.0.1/32",))))
        loop.enqueue(InSync())
        _wait(lambda: _routes(host).get("10.65.0.1/32", (0,))[0] == 99)
        _wait(lambda: "10.65.0.98/32" not in _routes(host))  # a stale one of ours
        assert _routes(host)["10.65.0.97/32"][0] == ROUTE_PROTOCOL  # not ours now
    finally:
        _stop(loop, mon)

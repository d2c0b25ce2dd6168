"""IPIPResolver: tunnels per node while an IPIP pool exists (explicit or derived tunl0
addresses, order-independent), withdrawn with the last IPIP pool; routes in IPIP pools are
typed "ipip"; the sequencer sends a tunnel before the routes through it."""

from __future__ import annotations

import ipaddress

from calc_testlib import ip_pool, node, wep

from pyfelix.agent import proto
from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of

NODES = [node(f"node{i}", f"198.18.0.{i}") for i in range(1, 11)]
POOL = ip_pool("ip", "10.65.0.0/16", ipipMode="Always")


def _run(docs: list[dict], deletes: list[dict] = ()  # type: ignore[assignment]
         ) -> tuple[ExpectedDataplane, list[object]]:
    dataplane = ExpectedDataplane()
    pipeline = CalcPipeline("node1", dataplane)
    pipeline.feed([RawUpdate(key_of(d), d, "test") for d in docs], SyncStatus.IN_SYNC)
    if deletes:
        pipeline.feed([RawUpdate(key_of(d), None, "test") for d in deletes])
    return dataplane, dataplane.messages


def test_tunnels_for_every_node_with_distinct_derived_addresses() -> None:
    dataplane, _ = _run([POOL, *NODES])
    again, _ = _run([*reversed(NODES), POOL])
    assert dataplane.ipip_tunnels == again.ipip_tunnels
    tunnels = dataplane.ipip_tunnels
    assert {t.parent_device_ip for t in tunnels.values()} == {f"198.18.0.{i}"
                                                            for i in range(1, 11)}
    addrs = {ipaddress.ip_address(t.ipv4_addr) for t in tunnels.values()}
    assert len(addrs) == len(NODES)
    assert all(a in ipaddress.ip_network("10.65.0.0/16") for a in addrs)


def test_explicit_node_address_wins() -> None:
    explicit = node("node3", "198.18.0.3")
    explicit["spec"]["bgp"]["ipv4IPIPTunnelAddr"] = "10.65.7.7"
    dataplane, _ = _run([POOL, *NODES[:2], explicit])
    assert dataplane.ipip_tunnels["node3"].ipv4_addr == "10.65.7.7"


def test_no_ipip_pool_no_tunnels_and_removal_follows_the_pool() -> None:
    assert not _run([ip_pool("plain", "10.65.0.0/16"), *NODES])[0].ipip_tunnels
    assert not _run([ip_pool("vx", "10.65.0.0/16", vxlanMode="Always"), *NODES])[0].ipip_tunnels
    dataplane, _ = _run([POOL, *NODES[:3]], deletes=[POOL])
    assert not dataplane.ipip_tunnels


def test_routes_are_ipip_typed_and_follow_their_tunnel() -> None:
    pod = wep("ns", "p", "node2", "10.65.1.5")
    dataplane, messages = _run([POOL, *NODES[:2], pod])
    route = dataplane.routes["10.65.1.5/32"]
    assert route.ip_pool_type == "ipip" and route.dst_node_ip == "198.18.0.2"
    kinds = [type(m).__name__ for m in messages]
    assert kinds.index("IPIPTunnelUpdate") < kinds.index("RouteUpdate")
    assert isinstance(dataplane.ipip_tunnels["node2"], proto.IPIPTunnelUpdate)

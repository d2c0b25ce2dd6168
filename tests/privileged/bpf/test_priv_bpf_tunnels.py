"""A workload may not send VXLAN or IPIP while that encapsulation is in use, unless
AllowVXLANPacketsFromWorkloads / AllowIPIPPacketsFromWorkloads (Felix's): calico_from_wep
drops such packets before policy (counter `tunnel_from_wep_dropped`), even with an
allow-all egress. Without tunnels in use, or when allowed, they are policed like any packet.
Real programs, BPF_PROG_TEST_RUN on crafted frames."""

from __future__ import annotations

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from tests.privileged.bpf.bpf_harness import Harness

pytestmark = pytest.mark.privileged

A, NODE2 = "10.65.0.1", "198.18.0.2"
ALLOW_ALL = p.ActiveProfileUpdate("allow-all", p.Profile(
    inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))
VTEP = p.VXLANTunnelEndpointUpdate("node2", "02:00:00:00:00:02", "10.65.254.2", NODE2)
TUNNEL = p.IPIPTunnelUpdate("node2", "10.65.255.2", NODE2)


def _from_a(h: Harness, frame: bytes) -> str:
    h.dp.maps["conntrack"].clear()
    return h.verdict("from", frame, "d1")


def _ipip(src: str, dst: str) -> bytes:
    inner = pk.ipv4_header("10.65.0.1", "10.65.1.1", 6, 0)
    return pk.ipv4(src, dst, 4, inner)


def test_tunnel_packets_from_a_workload_drop_while_in_use(harness: Harness) -> None:
    h = harness
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",)))
    vxlan, ipip = pk.udp(A, NODE2, 40000, 4789), _ipip(A, NODE2)
    other_udp = pk.udp(A, NODE2, 40000, 4790)
    # no tunnels in use: policed like anything else (allow-all)
    assert (_from_a(h, vxlan), _from_a(h, ipip)) == ("allow", "allow")
    h.apply(VTEP, TUNNEL)
    before = h.globals()["tunnel_from_wep_dropped"]
    assert (_from_a(h, vxlan), _from_a(h, ipip)) == ("deny", "deny")
    assert _from_a(h, other_udp) == "allow"  # another port is not VXLAN
    assert h.globals()["tunnel_from_wep_dropped"] == before + 2
    # VXLANPort moves the check with it
    h.apply(p.ConfigUpdate((("VXLANPort", "4790"),)))
    assert (_from_a(h, vxlan), _from_a(h, other_udp)) == ("allow", "deny")
    # allowed from workloads: policy decides again
    h.apply(p.ConfigUpdate((("AllowVXLANPacketsFromWorkloads", "true"),
                            ("AllowIPIPPacketsFromWorkloads", "true"))))
    assert (_from_a(h, vxlan), _from_a(h, ipip)) == ("allow", "allow")
    # tunnels gone: nothing dropped either
    h.apply(p.ConfigUpdate(()), p.VXLANTunnelEndpointRemove("node2"),
            p.IPIPTunnelRemove("node2"))
    assert (_from_a(h, vxlan), _from_a(h, ipip)) == ("allow", "allow")
    # the pod's ingress side is not concerned: tunnel packets TO a pod are policy's
    h.apply(VTEP, TUNNEL)
    h.dp.maps["conntrack"].clear()
    assert h.verdict("to", pk.udp(NODE2, A, 40000, 4789), "d1") == "allow"

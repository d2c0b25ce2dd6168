"""IPv6 Services in the real tc programs (BPF_PROG_TEST_RUN on crafted IPv6 frames), with
the `*6` NAT maps written by the IPv6 BpfNatManager: DNAT before policy at calico_from_wep,
replies translated back at calico_to_wep, the backend's ingress policy seeing the client,
ICMPv6 port unreachable for a Service without backends, balancing and affinity, and the
IPv4 manager and maps untouched by IPv6 frontends (and the reverse), and hairpin.

Pod A is fd00:65::1 behind d1, pod B fd00:65::2 behind d2; the Service VIP is fd00:96::10.
"""

from __future__ import annotations

import ipaddress
import struct
from collections import Counter

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import nat_counters, nat_ct6, nat_pinned
from pyfelix.agent.bpf.testrun import TC_ACT_OK, run_tc
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager
from tests.privileged.bpf.bpf_harness import HOOK_PROGRAMS, Harness

pytestmark = pytest.mark.privileged

A6, B6, C6, VIP6 = "fd00:65::1", "fd00:65::2", "fd00:65::3", "fd00:96::10"
VIP4 = "10.96.0.10"
TC_ACT_REDIRECT = 7
ALLOW_ALL = p.ActiveProfileUpdate("allow-all", p.Profile(
    inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))


def _pseudo(src: bytes, dst: bytes, proto: int, length: int) -> bytes:
    return src + dst + struct.pack("!IxxxB", length, proto)


def l4_ok6(src: str, dst: str, proto: int, seg: bytes, csum_at: int) -> bytes:
    """An IPv6 frame whose L4 checksum is correct (the programs must keep it correct)."""
    s, d = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed
    csum = pk.checksum(_pseudo(s, d, proto, len(seg)) + seg)
    return pk.ipv6(src, dst, proto, seg[:csum_at] + struct.pack("!H", csum) + seg[csum_at + 2:])


def tcp6_ok(src: str, dst: str, sport: int, dport: int, flags: str = "S") -> bytes:
    return l4_ok6(src, dst, 6, pk.tcp_segment(sport, dport, flags), 16)


def udp6_ok(src: str, dst: str, sport: int, dport: int, payload: bytes = b"x") -> bytes:
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return l4_ok6(src, dst, 17, seg, 6)


def parse6(frame: bytes) -> dict:
    ip = frame[14:]
    plen = struct.unpack("!H", ip[4:6])[0]
    nxt = ip[6]
    l4 = ip[40:40 + plen]
    out = {"src": str(ipaddress.IPv6Address(ip[8:24])),
           "dst": str(ipaddress.IPv6Address(ip[24:40])), "proto": nxt}
    l4_ok = pk.checksum(_pseudo(ip[8:24], ip[24:40], nxt, len(l4)) + l4) == 0
    if nxt in (6, 17):
        out["sport"], out["dport"] = struct.unpack("!HH", l4[:4])
        out["l4_csum_ok"] = l4_ok
    if nxt == 58:
        out["icmp"] = (l4[0], l4[1])
        out["icmp_csum_ok"] = l4_ok
        out["quoted_dst"] = str(ipaddress.IPv6Address(l4[8 + 24:8 + 40]))
    return out


def run(h: Harness, hook: str, frame: bytes, iface: str) -> tuple[int, bytes]:
    fd = h.dp.prog_fd(HOOK_PROGRAMS[hook])
    out = h.ns.call(run_tc, fd, frame, ifindex=h.ifindexes[iface])
    return out.retval, out.data_out


def program(h: Harness, *, egress: tuple[p.Rule, ...] | None = None,
            b_ingress: tuple[p.Rule, ...] | None = None,
            frontends: tuple[p.ServiceFrontendUpdate, ...] = ()
            ) -> tuple[BpfNatManager, BpfNatManager]:
    """Pods A (d1) and B (d2), dual-stack, allowing everything unless A's egress policy
    `egress` or B's ingress policy `b_ingress` is given; the frontends fed to both the IPv4
    and the IPv6 BpfNatManager (each takes its own family's)."""
    msgs: list = [ALLOW_ALL]
    a_tiers: tuple[p.TierInfo, ...] = ()
    b_tiers: tuple[p.TierInfo, ...] = ()
    if egress is not None:
        msgs.append(p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"),
                                         p.Policy(outbound_rules=egress)))
        a_tiers = (p.TierInfo("default", egress_policies=("a-egress",)),)
    if b_ingress is not None:
        msgs.append(p.ActivePolicyUpdate(p.PolicyID("default", "b-ingress"),
                                         p.Policy(inbound_rules=b_ingress)))
        b_tiers = (p.TierInfo("default", ingress_policies=("b-ingress",)),)
    msgs += [h.endpoint("a", "d1", profiles=("allow-all",), tiers=a_tiers,
                        ipv6=(f"{A6}/128",)),
             h.endpoint("b", "d2", profiles=("allow-all",), tiers=b_tiers,
                        ipv6=(f"{B6}/128",))]
    h.apply(*msgs)
    maps = h.dp.maps
    nat4 = BpfNatManager(maps["nat_frontend"], maps["nat_backend"], maps["nat_affinity"],
                         maps["nat_vip_filter"])
    nat6 = BpfNatManager(maps["nat_frontend6"], maps["nat_backend6"], maps["nat_affinity6"],
                         None, family=6)
    for nat in (nat4, nat6):
        for msg in (*frontends, p.InSync()):
            nat.on_update(msg)
        nat.apply()
    return nat4, nat6


def web(*backends: str, vip: str = VIP6, port: int = 8080, affinity: int = 0,
        protocol: int = 6) -> p.ServiceFrontendUpdate:
    return p.ServiceFrontendUpdate(
        id=f"{vip}:80/{protocol}", service="default/web", port_name="", vip=vip, port=80,
        protocol=protocol, backends=tuple(p.ServiceBackend(b, port) for b in backends),
        affinity_timeout=affinity)


def fresh(h: Harness) -> None:
    h.dp.maps["conntrack"].clear()
    h.dp.maps["nat_ct6"].clear()


def test_ipv6_clusterip_dnat_before_policy_and_replies_translated_back(harness) -> None:
    h = harness
    program(h, frontends=(web(B6),))
    rv, out = run(h, "from", tcp6_ok(A6, VIP6, 40000, 80), "d1")
    seen = parse6(out)
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["dst"], seen["sport"], seen["dport"]) == (A6, B6, 40000, 8080)
    assert seen["l4_csum_ok"]
    # the backend's reply at A's to_wep: allowed by conntrack, source back to the VIP
    rv, out = run(h, "to", tcp6_ok(B6, A6, 8080, 40000, "SA"), "d1")
    seen = parse6(out)
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["dst"], seen["sport"], seen["dport"]) == (VIP6, A6, 80, 40000)
    assert seen["l4_csum_ok"]
    # later packets reuse the translation (nat_ct6)
    rv, out = run(h, "from", tcp6_ok(A6, VIP6, 40000, 80, "A"), "d1")
    assert rv == TC_ACT_OK and parse6(out)["dst"] == B6
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert (counts["new_flows"], counts["ct_hit"], counts["replies"]) == (1, 1, 1)
    kinds = Counter(row["kind"] for row in nat_ct6.dump(h.dp.maps["nat_ct6"]))
    assert kinds == {"fwd": 1, "rev": 1}
    # UDP, checksum kept, reply translated
    fresh(h)
    program(h, frontends=(web(B6, port=5353, protocol=17),))
    rv, out = run(h, "from", udp6_ok(A6, VIP6, 40001, 80), "d1")
    seen = parse6(out)
    assert rv == TC_ACT_OK and (seen["dst"], seen["dport"]) == (B6, 5353) and seen["l4_csum_ok"]
    rv, out = run(h, "to", udp6_ok(B6, A6, 5353, 40001), "d1")
    seen = parse6(out)
    assert rv == TC_ACT_OK and (seen["src"], seen["sport"]) == (VIP6, 80) and seen["l4_csum_ok"]


def test_ipv6_egress_policy_sees_the_backend(harness) -> None:
    h = harness
    program(h, egress=(p.Rule("allow", dst_nets=(f"{B6}/128",)),), frontends=(web(B6),))
    assert run(h, "from", tcp6_ok(A6, VIP6, 40000, 80), "d1")[0] == TC_ACT_OK
    fresh(h)
    program(h, egress=(p.Rule("allow", dst_nets=(f"{C6}/128",)),), frontends=(web(B6),))
    assert run(h, "from", tcp6_ok(A6, VIP6, 40002, 80), "d1")[0] != TC_ACT_OK
    # the policy never sees the VIP: allowing the VIP alone does not allow the service
    fresh(h)
    program(h, egress=(p.Rule("allow", dst_nets=(f"{VIP6}/128",)),), frontends=(web(B6),))
    assert run(h, "from", tcp6_ok(A6, VIP6, 40003, 80), "d1")[0] != TC_ACT_OK


def test_ipv6_backend_ingress_policy_sees_the_client(harness) -> None:
    h = harness
    program(h, b_ingress=(p.Rule("allow", src_nets=(f"{A6}/128",)),), frontends=(web(B6),))
    rv, out = run(h, "from", tcp6_ok(A6, VIP6, 40000, 80), "d1")
    assert rv == TC_ACT_OK
    assert run(h, "to", out, "d2")[0] == TC_ACT_OK  # B's ingress: from A, to B itself
    fresh(h)
    program(h, b_ingress=(p.Rule("allow", src_nets=(f"{C6}/128",)),), frontends=(web(B6),))
    rv, out = run(h, "from", tcp6_ok(A6, VIP6, 40001, 80), "d1")
    assert rv == TC_ACT_OK
    assert run(h, "to", out, "d2")[0] != TC_ACT_OK  # only C may reach B: A is denied


def test_ipv6_service_without_backends_is_rejected_with_port_unreachable(harness) -> None:
    h = harness
    program(h, frontends=(web(),))
    syn = tcp6_ok(A6, VIP6, 40000, 80)
    rv, out = run(h, "from", syn, "d1")
    assert rv == TC_ACT_REDIRECT  # back out of d1, towards pod A
    seen = parse6(out)
    assert (seen["src"], seen["dst"], seen["proto"], seen["icmp"]) == (VIP6, A6, 58, (1, 4))
    assert seen["icmp_csum_ok"] and seen["quoted_dst"] == VIP6
    assert out[0:6] == syn[6:12] and out[6:12] == syn[0:6]  # MACs swapped
    # the error passes A's ingress hook as related to the rejected tuple
    assert run(h, "to", out, "d1")[0] == TC_ACT_OK
    assert nat_counters.read(h.dp.maps["nat_counters"])["rejected"] == 1
    # UDP too (the shortest datagram still carries the 48-byte quote)
    fresh(h)
    program(h, frontends=(web(protocol=17),))
    rv, out = run(h, "from", udp6_ok(A6, VIP6, 40001, 80, payload=b""), "d1")
    seen = parse6(out)
    assert rv == TC_ACT_REDIRECT and seen["icmp"] == (1, 4) and seen["icmp_csum_ok"]


def test_ipv6_balancing_and_client_ip_affinity(harness) -> None:
    h = harness
    program(h, frontends=(web(B6, C6),))
    chosen = Counter(parse6(run(h, "from", tcp6_ok(A6, VIP6, 41000 + i, 80), "d1")[1])["dst"]
                     for i in range(60))
    assert set(chosen) == {B6, C6} and min(chosen.values()) >= 10, chosen
    fresh(h)
    program(h, frontends=(web(B6, C6, affinity=30),))
    chosen = Counter(parse6(run(h, "from", tcp6_ok(A6, VIP6, 42000 + i, 80), "d1")[1])["dst"]
                     for i in range(30))
    assert len(chosen) == 1, chosen
    assert nat_counters.read(h.dp.maps["nat_counters"])["affinity_hit"] >= 29


def test_families_kept_apart_and_dumped(harness) -> None:
    """A dual-stack Service: the IPv4 manager writes only the IPv4 VIP, the IPv6 one only
    the IPv6 VIP; both translate; `pyfelix bpf nat dump` lists both families."""
    h = harness
    nat4, nat6 = program(h, frontends=(web("10.65.0.2", vip=VIP4), web(B6)))
    assert len(h.dp.maps["nat_frontend"].items()) == 1
    assert len(h.dp.maps["nat_frontend6"].items()) == 1
    assert list(nat4.desired) == [f"{VIP4}:80/6"] and list(nat6.desired) == [f"{VIP6}:80/6"]
    rv, out = run(h, "from", pk.tcp("10.65.0.1", VIP4, 40000, 80), "d1")
    assert rv == TC_ACT_OK and out[14 + 16:14 + 20] == ipaddress.IPv4Address("10.65.0.2").packed
    rv, out = run(h, "from", tcp6_ok(A6, VIP6, 40000, 80), "d1")
    assert rv == TC_ACT_OK and parse6(out)["dst"] == B6
    view = {f["frontend"]: f for f in nat_pinned(h.dp.config.pin_dir)["frontends"]}
    assert view[f"[{VIP6}]:80/tcp"]["backends"] == [f"[{B6}]:8080"]
    assert view[f"[{VIP6}]:80/tcp"]["family"] == 6
    assert view[f"{VIP4}:80/tcp"]["backends"] == ["10.65.0.2:8080"]
    # removing the IPv6 frontend leaves the IPv4 one alone
    nat6.on_update(p.ServiceFrontendRemove(f"{VIP6}:80/6"))
    nat6.apply()
    assert not h.dp.maps["nat_frontend6"].items() and not h.dp.maps["nat_backend6"].items()
    assert len(h.dp.maps["nat_frontend"].items()) == 1


def test_ipv6_hairpin_a_pod_reaches_itself_through_its_service(harness) -> None:
    """Pod A is the Service's only backend: the four passes through A's interface."""
    h = harness
    program(h, frontends=(web(A6),))
    mark = 0x5A1E0C11  # PF_MARK_HAIRPIN

    def at(hook: str, frame: bytes, skb_mark: int = 0) -> tuple[int, dict]:
        fd = h.dp.prog_fd(HOOK_PROGRAMS[hook])
        out = h.ns.call(run_tc, fd, frame, ifindex=h.ifindexes["d1"], mark=skb_mark)
        return out.retval, parse6(out.data_out)

    # 1. A -> VIP:80 at from_wep: DNAT to A:8080 and SNAT to the VIP, sent back to A
    rv, seen = at("from", tcp6_ok(A6, VIP6, 47000, 80))
    assert rv == TC_ACT_REDIRECT
    assert (seen["src"], seen["sport"], seen["dst"], seen["dport"]) == (VIP6, 47000, A6, 8080)
    assert seen["l4_csum_ok"]
    # 2. the same packet at to_wep (carrying the hairpin mark): A's ingress policy, delivered
    assert at("to", tcp6_ok(VIP6, A6, 47000, 8080), mark)[0] == TC_ACT_OK
    # 3. A replies A:8080 -> VIP:47000 at from_wep: a reply, sent back to A untranslated
    rv, seen = at("from", tcp6_ok(A6, VIP6, 8080, 47000, "SA"))
    assert rv == TC_ACT_REDIRECT and (seen["src"], seen["dst"]) == (A6, VIP6)
    # 4. at to_wep the reply becomes VIP:80 -> A:47000, what A's socket connected to
    rv, seen = at("to", tcp6_ok(A6, VIP6, 8080, 47000, "SA"))
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["sport"], seen["dst"], seen["dport"]) == (VIP6, 80, A6, 47000)
    assert seen["l4_csum_ok"]
    # policed: A's egress allowing only C denies A reaching itself through the Service
    fresh(h)
    program(h, egress=(p.Rule("allow", dst_nets=(f"{C6}/128",)),), frontends=(web(A6),))
    assert run(h, "from", tcp6_ok(A6, VIP6, 48000, 80), "d1")[0] not in (TC_ACT_OK,
                                                                         TC_ACT_REDIRECT)


def test_ipv6_icmp_errors_about_a_service_flow_are_translated_back(harness) -> None:
    h = harness
    program(h, frontends=(web(B6, port=5353, protocol=17),))
    rv, out = run(h, "from", udp6_ok(A6, VIP6, 40100, 80), "d1")
    assert rv == TC_ACT_OK and parse6(out)["dst"] == B6
    # the backend has no socket on 5353: its port unreachable quotes A -> B:5353 (built
    # with a correct ICMPv6 checksum, which the program must keep correct)
    quoted_in = out[14:14 + 48]
    body = struct.pack("!BBHI", 1, 4, 0, 0) + quoted_in
    s, d = ipaddress.IPv6Address(B6).packed, ipaddress.IPv6Address(A6).packed
    csum = pk.checksum(_pseudo(s, d, 58, len(body)) + body)
    error = pk.ipv6(B6, A6, 58, body[:2] + struct.pack("!H", csum) + body[4:])
    rv, out = run(h, "to", error, "d1")
    assert rv == TC_ACT_OK
    seen = parse6(out)
    assert (seen["src"], seen["icmp"], seen["quoted_dst"]) == (VIP6, (1, 4), VIP6)
    assert seen["icmp_csum_ok"]
    quoted = out[14 + 40 + 8:]
    assert struct.unpack("!HH", quoted[40:44]) == (40100, 80)  # what A's socket sent to

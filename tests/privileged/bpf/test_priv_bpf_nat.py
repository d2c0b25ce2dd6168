"""Service NAT in the real tc programs (BPF_PROG_TEST_RUN on crafted packets), with the
maps written by BpfNatManager: DNAT before policy at calico_from_wep, replies translated
back at calico_to_wep, rejects for Services without backends, balancing and affinity.

Pod A is 10.65.0.1 behind d1, pod B 10.65.0.2 behind d2; the Service VIP is 10.96.0.10.
"""

from __future__ import annotations

import ipaddress
import struct
from collections import Counter

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import nat_backend, nat_counters, nat_frontend
from pyfelix.agent.bpf.testrun import TC_ACT_OK, run_tc
from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager
from tests.privileged.bpf.bpf_harness import HOOK_PROGRAMS, Harness

pytestmark = pytest.mark.privileged

A, B, C, VIP = "10.65.0.1", "10.65.0.2", "10.65.0.3", "10.96.0.10"
TC_ACT_REDIRECT = 7


def tcp_ok(src: str, dst: str, sport: int, dport: int, flags: str = "S") -> bytes:
    """A TCP frame with a correct checksum (the programs must keep it correct)."""
    seg = pk.tcp_segment(sport, dport, flags)
    pseudo = (ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed
              + struct.pack("!BBH", 0, 6, len(seg)))
    csum = pk.checksum(pseudo + seg)
    return pk.ipv4(src, dst, 6, seg[:16] + struct.pack("!H", csum) + seg[18:])


def parse(frame: bytes) -> dict:
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    total = struct.unpack("!H", ip[2:4])[0]
    l4 = ip[ihl:total]
    out = {"src": str(ipaddress.IPv4Address(ip[12:16])),
           "dst": str(ipaddress.IPv4Address(ip[16:20])), "proto": ip[9],
           "ip_csum_ok": pk.checksum(ip[:ihl]) == 0}
    if ip[9] in (6, 17):
        out["sport"], out["dport"] = struct.unpack("!HH", l4[:4])
        pseudo = ip[12:20] + struct.pack("!BBH", 0, ip[9], len(l4))
        out["l4_csum_ok"] = pk.checksum(pseudo + l4) == 0
    if ip[9] == 1:
        out["icmp"] = (l4[0], l4[1])
        out["icmp_csum_ok"] = pk.checksum(l4) == 0
        out["quoted_dst"] = str(ipaddress.IPv4Address(l4[8 + 16:8 + 20]))
    return out


def run(h: Harness, hook: str, frame: bytes, iface: str) -> tuple[int, bytes]:
    fd = h.dp.prog_fd(HOOK_PROGRAMS[hook])
    out = h.ns.call(run_tc, fd, frame, ifindex=h.ifindexes[iface])
    return out.retval, out.data_out


def program(h: Harness, egress: tuple[p.Rule, ...] | None = None, *,
            frontends: tuple[p.ServiceFrontendUpdate, ...] = ()) -> BpfNatManager:
    """Pods A (d1) and B (d2) allowing everything, A's egress policy `egress` if given, and
    the service frontends written by a BpfNatManager."""
    allow = p.ActiveProfileUpdate("allow-all", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))
    msgs: list = [allow]
    tiers: tuple[p.TierInfo, ...] = ()
    if egress is not None:
        msgs.append(p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"),
                                         p.Policy(outbound_rules=egress)))
        tiers = (p.TierInfo("default", egress_policies=("a-egress",)),)
    msgs += [h.endpoint("a", "d1", profiles=("allow-all",), tiers=tiers),
             h.endpoint("b", "d2", profiles=("allow-all",))]
    h.apply(*msgs)
    nat = BpfNatManager(h.dp.maps["nat_frontend"], h.dp.maps["nat_backend"],
                        h.dp.maps["nat_affinity"], h.dp.maps["nat_vip_filter"])
    for msg in (*frontends, p.InSync()):
        nat.on_update(msg)
    nat.apply()
    return nat


def web(*backends: str, port: int = 8080, affinity: int = 0,
        protocol: int = 6) -> p.ServiceFrontendUpdate:
    return p.ServiceFrontendUpdate(
        id=f"{VIP}:80/{protocol}", service="default/web", port_name="", vip=VIP, port=80,
        protocol=protocol, backends=tuple(p.ServiceBackend(b, port) for b in backends),
        affinity_timeout=affinity)


def test_dnat_before_policy_and_replies_translated_back(harness: Harness) -> None:
    h = harness
    program(h, frontends=(web(B),))
    rv, out = run(h, "from", tcp_ok(A, VIP, 40000, 80), "d1")
    seen = parse(out)
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["dst"], seen["sport"], seen["dport"]) == (A, B, 40000, 8080)
    assert seen["ip_csum_ok"] and seen["l4_csum_ok"]
    # the backend's reply, at A's to_wep: allowed by conntrack, source back to the VIP
    rv, out = run(h, "to", tcp_ok(B, A, 8080, 40000, "SA"), "d1")
    seen = parse(out)
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["dst"], seen["sport"], seen["dport"]) == (VIP, A, 80, 40000)
    assert seen["ip_csum_ok"] and seen["l4_csum_ok"]
    # later packets of the flow reuse the translation
    rv, out = run(h, "from", tcp_ok(A, VIP, 40000, 80, "A"), "d1")
    assert rv == TC_ACT_OK and parse(out)["dst"] == B
    counts = nat_counters.read(h.dp.maps["nat_counters"])
    assert (counts["new_flows"], counts["ct_hit"], counts["replies"]) == (1, 1, 1)
    # UDP too, with its checksum kept
    program(h, frontends=(web(B, port=5353, protocol=17),))
    rv, out = run(h, "from", pk.udp(A, VIP, 40001, 80), "d1")
    seen = parse(out)
    assert rv == TC_ACT_OK and (seen["dst"], seen["dport"]) == (B, 5353)


def test_egress_policy_sees_the_backend(harness: Harness) -> None:
    h = harness
    program(h, (p.Rule("allow", dst_nets=(B + "/32",)),), frontends=(web(B),))
    rv, _ = run(h, "from", tcp_ok(A, VIP, 40000, 80), "d1")
    assert rv == TC_ACT_OK  # allowed: the backend is B
    h.dp.maps["conntrack"].clear()
    h.dp.maps["nat_ct"].clear()
    program(h, (p.Rule("allow", dst_nets=(C + "/32",)),), frontends=(web(B),))
    rv, _ = run(h, "from", tcp_ok(A, VIP, 40002, 80), "d1")
    assert rv != TC_ACT_OK  # only C allowed: the service's backend B is denied
    # the policy never sees the VIP: allowing the VIP alone does not allow the service
    h.dp.maps["nat_ct"].clear()
    program(h, (p.Rule("allow", dst_nets=(VIP + "/32",)),), frontends=(web(B),))
    rv, _ = run(h, "from", tcp_ok(A, VIP, 40003, 80), "d1")
    assert rv != TC_ACT_OK


def test_service_without_backends_is_rejected_with_port_unreachable(harness: Harness) -> None:
    h = harness
    program(h, frontends=(web(),))
    syn = tcp_ok(A, VIP, 40000, 80)
    rv, out = run(h, "from", syn, "d1")
    assert rv == TC_ACT_REDIRECT  # back out of d1, towards pod A
    seen = parse(out)
    assert (seen["src"], seen["dst"], seen["proto"], seen["icmp"]) == (VIP, A, 1, (3, 3))
    assert seen["ip_csum_ok"] and seen["icmp_csum_ok"] and seen["quoted_dst"] == VIP
    assert out[0:6] == syn[6:12] and out[6:12] == syn[0:6]  # MACs swapped
    # the error passes A's ingress hook as related to the rejected tuple
    rv, _ = run(h, "to", out, "d1")
    assert rv == TC_ACT_OK
    assert nat_counters.read(h.dp.maps["nat_counters"])["rejected"] == 1
    # UDP is rejected the same way (a short datagram grows to carry the quote)
    program(h, frontends=(web(protocol=17),))
    rv, out = run(h, "from", pk.udp(A, VIP, 40001, 80, payload=b""), "d1")
    seen = parse(out)
    assert rv == TC_ACT_REDIRECT and seen["icmp"] == (3, 3) and seen["icmp_csum_ok"]


def test_balancing_and_client_ip_affinity(harness: Harness) -> None:
    h = harness
    program(h, frontends=(web(B, C),))
    chosen = Counter(parse(run(h, "from", tcp_ok(A, VIP, 41000 + i, 80), "d1")[1])["dst"]
                     for i in range(60))
    assert set(chosen) == {B, C} and min(chosen.values()) >= 10, chosen
    h.dp.maps["nat_ct"].clear()
    program(h, frontends=(web(B, C, affinity=30),))
    chosen = Counter(parse(run(h, "from", tcp_ok(A, VIP, 42000 + i, 80), "d1")[1])["dst"]
                     for i in range(30))
    assert len(chosen) == 1, chosen
    assert nat_counters.read(h.dp.maps["nat_counters"])["affinity_hit"] >= 29


def test_backends_beyond_the_frontends_inline_copy_come_from_nat_backend(
        harness: Harness) -> None:
    h = harness
    many = [B, C] + [f"10.65.9.{i}" for i in range(1, nat_frontend.INLINE_BACKENDS + 1)]
    assert len(many) > nat_frontend.INLINE_BACKENDS
    program(h, frontends=(web(*many),))
    chosen = Counter(parse(run(h, "from", tcp_ok(A, VIP, 47000 + i, 80), "d1")[1])["dst"]
                     for i in range(200))
    assert set(chosen) == set(many), chosen  # balanced over every backend, inline or not
    # the programs read nat_backend only beyond the inline copy: without those entries,
    # their indexes drop (fail closed, counted) and the inline ones still translate
    be = h.dp.maps["nat_backend"]
    be.delete_many([k for k, _ in be.items()
                    if nat_backend.decode_key(k)[1] >= nat_frontend.INLINE_BACKENDS])
    h.dp.maps["nat_ct"].clear()
    before = nat_counters.read(h.dp.maps["nat_counters"])["no_backend"]
    results = [run(h, "from", tcp_ok(A, VIP, 48000 + i, 80), "d1") for i in range(200)]
    passed = {parse(out)["dst"] for rv, out in results if rv == TC_ACT_OK}
    dropped = sum(1 for rv, _ in results if rv != TC_ACT_OK)
    assert passed == set(many[:nat_frontend.INLINE_BACKENDS])
    assert dropped > 0
    assert nat_counters.read(h.dp.maps["nat_counters"])["no_backend"] - before == dropped


def test_backend_change_keeps_established_flows_to_backends_that_stay(harness: Harness) -> None:
    h = harness
    nat = program(h, frontends=(web(B, C),))
    flows: dict[int, str] = {}
    for sport in range(43000, 43040):
        flows[sport] = parse(run(h, "from", tcp_ok(A, VIP, sport, 80), "d1")[1])["dst"]
    nat.on_update(web(B))  # C goes
    nat.apply()
    for sport, backend in flows.items():
        rv, out = run(h, "from", tcp_ok(A, VIP, sport, 80, "A"), "d1")
        if backend == B:
            assert rv == TC_ACT_OK and parse(out)["dst"] == B  # undisturbed
    fresh = {parse(run(h, "from", tcp_ok(A, VIP, 44000 + i, 80), "d1")[1])["dst"]
             for i in range(20)}
    assert fresh == {B}  # new connections avoid the removed backend


def test_cli_nat_dump_and_summary(harness: Harness) -> None:
    import json

    from click.testing import CliRunner

    from pyfelix.cli.main import cli

    h = harness
    program(h, frontends=(web(B, C, affinity=30),
                          p.ServiceFrontendUpdate(id="10.96.0.11:80/6", service="default/empty",
                                                  port_name="", vip="10.96.0.11", port=80,
                                                  protocol=6)))
    run(h, "from", tcp_ok(A, VIP, 45000, 80), "d1")
    pin_dir = h.dp.config.pin_dir
    done = CliRunner().invoke(cli, ["bpf", "nat", "dump", "-o", "json", "--pin-dir", pin_dir])
    assert done.exit_code == 0, done.output
    view = json.loads(done.stdout)
    fronts = {f["frontend"]: f for f in view["frontends"]}
    assert fronts[f"{VIP}:80/tcp"]["backends"] == [f"{B}:8080", f"{C}:8080"]
    assert fronts[f"{VIP}:80/tcp"]["flags"] == ["affinity"]
    assert [a["client"] for a in fronts[f"{VIP}:80/tcp"]["affinity"]] == [A]
    assert fronts["10.96.0.11:80/tcp"]["backends"] == []
    assert view["counters"]["new_flows"] == 1
    done = CliRunner().invoke(cli, ["bpf", "nat", "dump", "--pin-dir", pin_dir])
    assert done.exit_code == 0 and f"{B}:8080" in done.stdout
    done = CliRunner().invoke(cli, ["bpf", "summary", "--pin-dir", pin_dir])
    assert ("services: 2 frontends (1 without backends: rejected), 2 backends, 1 NAT flows"
            in done.stdout), done.stdout


def test_the_vip_filter_gates_the_frontend_lookup(harness: Harness) -> None:
    h = harness
    program(h, frontends=(web(B),))
    assert parse(run(h, "from", tcp_ok(A, VIP, 46000, 80), "d1")[1])["dst"] == B
    filt = h.dp.maps["nat_vip_filter"]
    filt.update_many([(k, bytes(8)) for k, _ in filt.items()])  # every bit clear
    h.dp.maps["nat_ct"].clear()
    rv, out = run(h, "from", tcp_ok(A, VIP, 46001, 80), "d1")
    assert rv == TC_ACT_OK
    assert parse(out)["dst"] == VIP  # not even looked up: the manager keeps bits set


def test_hairpin_a_pod_reaches_itself_through_its_service(harness: Harness) -> None:
    """Pod A is the Service's only backend: the four passes through A's interface."""
    h = harness
    program(h, frontends=(web(A),))
    mark = 0x5A1E0C11  # PF_MARK_HAIRPIN

    def at(hook: str, frame: bytes, skb_mark: int = 0) -> tuple[int, dict]:
        fd = h.dp.prog_fd(HOOK_PROGRAMS[hook])
        out = h.ns.call(run_tc, fd, frame, ifindex=h.ifindexes["d1"], mark=skb_mark)
        return out.retval, parse(out.data_out)

    # 1. A -> VIP:80 at from_wep: DNAT to A:8080 and SNAT to the VIP, sent back to A
    syn = tcp_ok(A, VIP, 47000, 80)
    fd = h.dp.prog_fd(HOOK_PROGRAMS["from"])
    out = h.ns.call(run_tc, fd, syn, ifindex=h.ifindexes["d1"])
    assert out.data_out[0:6] == syn[6:12] and out.data_out[6:12] == syn[0:6]  # to A's MAC
    h.dp.maps["nat_ct"].clear()
    h.dp.maps["conntrack"].clear()
    rv, seen = at("from", syn)
    assert rv == TC_ACT_REDIRECT
    assert (seen["src"], seen["sport"], seen["dst"], seen["dport"]) == (VIP, 47000, A, 8080)
    assert seen["ip_csum_ok"] and seen["l4_csum_ok"]
    # 2. the same packet at to_wep (carrying the hairpin mark): A's ingress policy, delivered
    rv, _ = at("to", tcp_ok(VIP, A, 47000, 8080), mark)
    assert rv == TC_ACT_OK
    # 3. A replies A:8080 -> VIP:47000 at from_wep: a reply, sent back to A untranslated
    rv, seen = at("from", tcp_ok(A, VIP, 8080, 47000, "SA"))
    assert rv == TC_ACT_REDIRECT and (seen["src"], seen["dst"]) == (A, VIP)
    # 4. at to_wep the reply becomes VIP:80 -> A:47000, what A's socket connected to
    rv, seen = at("to", tcp_ok(A, VIP, 8080, 47000, "SA"))
    assert rv == TC_ACT_OK
    assert (seen["src"], seen["sport"], seen["dst"], seen["dport"]) == (VIP, 80, A, 47000)
    assert seen["ip_csum_ok"] and seen["l4_csum_ok"]
    # later forward packets take the same way through conntrack
    rv, seen = at("from", tcp_ok(A, VIP, 47000, 80, "A"))
    assert rv == TC_ACT_REDIRECT and (seen["src"], seen["dst"]) == (VIP, A)
    assert at("to", tcp_ok(VIP, A, 47000, 8080, "A"), mark)[0] == TC_ACT_OK


def test_hairpin_is_policed_on_both_passes(harness: Harness) -> None:
    h = harness
    # A's egress allows only C: the pod may not reach itself through the Service either
    program(h, (p.Rule("allow", dst_nets=(C + "/32",)),), frontends=(web(A),))
    rv, _ = run(h, "from", tcp_ok(A, VIP, 48000, 80), "d1")
    assert rv not in (TC_ACT_OK, TC_ACT_REDIRECT)


def test_icmp_errors_about_a_service_flow_are_translated_back(harness: Harness) -> None:
    h = harness
    program(h, frontends=(web(B, port=5353, protocol=17),))
    rv, out = run(h, "from", pk.udp(A, VIP, 40100, 80), "d1")
    assert rv == TC_ACT_OK and parse(out)["dst"] == B
    # the backend has no socket on 5353: its port unreachable quotes A -> B:5353 (built
    # with a correct ICMP checksum, which the program must keep correct)
    quoted_in = out[14:14 + 28]
    body = struct.pack("!BBHI", 3, 3, 0, 0) + quoted_in
    body = body[:2] + struct.pack("!H", pk.checksum(body)) + body[4:]
    error = pk.ipv4(B, A, 1, body)
    rv, out = run(h, "to", error, "d1")
    assert rv == TC_ACT_OK
    seen = parse(out)
    assert (seen["src"], seen["icmp"], seen["quoted_dst"]) == (VIP, (3, 3), VIP)
    assert seen["ip_csum_ok"] and seen["icmp_csum_ok"]
    quoted = out[14 + 20 + 8:]
    assert pk.checksum(quoted[:20]) == 0  # the quoted IP header's checksum is right
    assert struct.unpack("!HH", quoted[20:24]) == (40100, 80)  # what A's socket sent to


def test_affinity_entries_expire_after_their_timeout(harness: Harness) -> None:
    from pyfelix.agent.bpf.maps import nat_affinity as aff_map
    from pyfelix.agent.bpf.maps.conntrack import now_ns

    h = harness
    nat = program(h, frontends=(web(B, affinity=30),))
    sid = nat.service_ids()[f"{VIP}:80/6"]
    aff = h.dp.maps["nat_affinity"]
    # used just now: honoured (C, though no longer a backend: the manager would have removed
    # it; written here by hand to see which one the program picks)
    aff.update(aff_map.encode_key(sid, A), aff_map.encode_value(C, 8080, now_ns()))
    assert parse(run(h, "from", tcp_ok(A, VIP, 49000, 80), "d1")[1])["dst"] == C
    # last used 31 s ago with a 30 s timeout: expired, a backend is chosen afresh
    aff.update(aff_map.encode_key(sid, A),
               aff_map.encode_value(C, 8080, now_ns() - 31 * 1_000_000_000))
    assert parse(run(h, "from", tcp_ok(A, VIP, 49001, 80), "d1")[1])["dst"] == B

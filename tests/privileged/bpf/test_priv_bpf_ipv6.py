"""IPv6 policy in the real tc/XDP programs (BPF_PROG_TEST_RUN on crafted IPv6 frames).

Pod A is 10.65.0.1 / fd00:65::1 behind d1, pod B 10.65.0.2 / fd00:65::2 behind d2. "to" runs
calico_to_wep (the pod's ingress policy), "from" calico_from_wep (its egress policy and its
source check). Policy verdicts are also checked against the reference semantics
(tests/bpf/bpf_reference.expected_verdict). Conntrack is cleared before each policy verdict
unless the test is about conntrack. Covered: set/net/port/ipVersion/ICMPv6 matching,
conntrack of both families (replies, echo, related ICMPv6 errors), the IPv6 source check,
extension headers walked to the L4 header (and chains the parser does not walk dropped),
fragments (non-first ones carry no ports and never bypass policy), the endpoint-to-host
action for the host's IPv6 addresses, Ipv6Support false, and malformed IPv6.
"""

from __future__ import annotations

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import conntrack as ct_map
from tests.bpf.bpf_reference import Pkt, expected_verdict
from tests.privileged.bpf.bpf_harness import Harness

pytestmark = pytest.mark.privileged

A, B = "10.65.0.1", "10.65.0.2"
A6, B6, C6, HOST6 = "fd00:65::1", "fd00:65::2", "fd00:65::3", "fd00:ffff::1"
ALLOW_ALL = p.ActiveProfileUpdate("allow-all", p.Profile(
    inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))
WID_A = p.WorkloadEndpointID("k8s", "default/a", "eth0")


def endpoint_a(h: Harness, **kw: object) -> p.WorkloadEndpointUpdate:
    kw.setdefault("ipv6", (f"{A6}/128",))
    return h.endpoint("a", "d1", **kw)  # type: ignore[arg-type]


def ingress(h: Harness, *rules: p.Rule) -> None:
    """A's ingress: policy `pol` with `rules` (tier default deny); egress allow-all."""
    h.apply(ALLOW_ALL, p.IPSetUpdate("clients", "net", frozenset({f"{B}/32", f"{B6}/128"})),
            p.ActivePolicyUpdate(p.PolicyID("default", "pol"), p.Policy(inbound_rules=rules)),
            endpoint_a(h, profiles=("allow-all",),
                       tiers=(p.TierInfo("default", ingress_policies=("pol",)),)))


def to_a(h: Harness, frame: bytes) -> str:
    h.dp.maps["conntrack"].clear()
    return h.verdict("to", frame, "d1")


def check(h: Harness, frame: bytes, model: Pkt, want: str) -> None:
    """Kernel verdict == want == reference semantics, for traffic to pod A."""
    ep = h.state.endpoints[WID_A]
    assert expected_verdict(h.state, ep, "ingress", model) == want, model
    assert to_a(h, frame) == want, model


def test_ipv6_rules_match_sets_nets_ports_and_ip_version(harness):
    h = harness
    ingress(h,
            p.Rule("allow", protocol=6, src_ip_set_ids=("clients",),
                   dst_ports=(p.PortRange(8080, 8080),)),
            p.Rule("allow", ip_version=4, protocol=6, dst_ports=(p.PortRange(9090, 9090),)),
            p.Rule("allow", protocol=17, src_nets=("fd00:65::/120",), not_src_nets=(f"{C6}/128",)),
            p.Rule("allow", protocol=6, not_src_nets=("10.0.0.0/8",),
                   dst_ports=(p.PortRange(7070, 7070),)))
    check(h, pk.tcp6(B6, A6, 40000, 8080), Pkt(B6, A6, 6, 40000, 8080), "allow")
    check(h, pk.tcp(B, A, 40000, 8080), Pkt(B, A, 6, 40000, 8080), "allow")
    check(h, pk.tcp6(C6, A6, 40000, 8080), Pkt(C6, A6, 6, 40000, 8080), "deny")  # not in set
    check(h, pk.tcp6(B6, A6, 40000, 8081), Pkt(B6, A6, 6, 40000, 8081), "deny")
    # ipVersion 4: the IPv4 packet passes, the same port over IPv6 does not
    check(h, pk.tcp(B, A, 40000, 9090), Pkt(B, A, 6, 40000, 9090), "allow")
    check(h, pk.tcp6(B6, A6, 40000, 9090), Pkt(B6, A6, 6, 40000, 9090), "deny")
    # IPv6 nets and notNets
    check(h, pk.udp6(B6, A6, 1, 53), Pkt(B6, A6, 17, 1, 53), "allow")
    check(h, pk.udp6(C6, A6, 1, 53), Pkt(C6, A6, 17, 1, 53), "deny")
    check(h, pk.udp6("fd00:66::2", A6, 1, 53), Pkt("fd00:66::2", A6, 17, 1, 53), "deny")
    # notNets holding only IPv4 nets: Felix renders the rule for IPv4 only
    check(h, pk.tcp("192.0.2.1", A, 1, 7070), Pkt("192.0.2.1", A, 6, 1, 7070), "allow")
    check(h, pk.tcp6(C6, A6, 1, 7070), Pkt(C6, A6, 6, 1, 7070), "deny")


def test_icmpv6_type_and_code_match_and_icmp_rules_do_not(harness):
    h = harness
    ingress(h,
            p.Rule("allow", protocol=58, icmp_type=128),  # echo request
            p.Rule("allow", protocol=58, icmp_type=1, icmp_code=4),  # port unreachable
            p.Rule("allow", protocol=1, icmp_type=8))  # ICMP (IPv4) echo request
    check(h, pk.icmp6(B6, A6, 128), Pkt(B6, A6, 58, icmp_type=128), "allow")
    check(h, pk.icmp6(B6, A6, 1, 4), Pkt(B6, A6, 58, icmp_type=1, icmp_code=4), "allow")
    check(h, pk.icmp6(B6, A6, 1, 3), Pkt(B6, A6, 58, icmp_type=1, icmp_code=3), "deny")
    check(h, pk.icmp6(B6, A6, 129), Pkt(B6, A6, 58, icmp_type=129), "deny")
    check(h, pk.icmp(B, A, 8), Pkt(B, A, 1, icmp_type=8), "allow")
    # an IPv4 ICMP rule does not allow ICMPv6, and type 8 in ICMPv6 is not an echo
    check(h, pk.icmp6(B6, A6, 8), Pkt(B6, A6, 58, icmp_type=8), "deny")


def test_ipv6_conntrack_allows_replies_echo_and_related_errors_only(harness):
    h = harness
    ingress(h, p.Rule("allow", protocol=6, dst_ports=(p.PortRange(80, 80),)),
            p.Rule("allow", protocol=58, icmp_type=128))
    h.dp.maps["conntrack"].clear()
    assert h.verdict("to", pk.tcp6(B6, A6, 40000, 80, "S"), "d1") == "allow"
    assert h.verdict("from", pk.tcp6(A6, B6, 80, 40000, "SA"), "d1") == "allow"
    assert h.verdict("to", pk.tcp6(B6, A6, 40000, 80, "A"), "d1") == "allow"
    g = h.globals()
    assert g["ct_hit"] == 2 and g["ct_created"] >= 1
    # a new flow from A's side to B's port 40000 at the to hook: not the tracked flow
    assert h.verdict("to", pk.tcp6(B6, A6, 40001, 81, "S"), "d1") == "deny"
    # echo: the request creates the entry, the reply hits it; a request the other way not
    assert h.verdict("to", pk.icmp6(B6, A6, 128, ident=9), "d1") == "allow"
    assert h.verdict("from", pk.icmp6(A6, B6, 129, ident=9), "d1") == "allow"
    assert h.verdict("to", pk.icmp6(B6, A6, 129, ident=9), "d1") == "deny"
    # an ICMPv6 error quoting the tracked flow is related; one quoting another flow is not
    out = pk.tcp6(A6, B6, 80, 40000, "A")
    too_big = pk.icmp6_error("fd00:65::fe", A6, out, icmp_type=2, code=0)
    assert h.verdict("to", too_big, "d1") == "allow"
    stray = pk.icmp6_error("fd00:65::fe", A6, pk.tcp6(A6, B6, 80, 40999, "A"), icmp_type=2)
    assert h.verdict("to", stray, "d1") == "deny"
    assert h.globals()["ct_related"] == 1
    flows = {(k.family, k.addr_a, k.addr_b, k.port_a, k.port_b, k.proto)
             for k in map(ct_map.decode_key, h.dp.maps["conntrack"].iter_keys())}
    assert (6, A6, B6, 80, 40000, 6) in flows  # normalised: A6 < B6
    assert (6, A6, B6, 9, 9, 58) in flows  # the echo id as both ports


def test_ipv6_sources_a_pod_may_not_use_are_dropped_before_policy(harness):
    h = harness
    h.apply(ALLOW_ALL, endpoint_a(h, profiles=("allow-all",), allow_spoofed=("fd00:99::/64",)),
            h.endpoint("b", "d2", profiles=("allow-all",)))  # B: no IPv6 address
    assert h.verdict("from", pk.tcp6(A6, B6, 1, 80), "d1") == "allow"
    assert h.verdict("from", pk.tcp6("fd00:99::5", B6, 1, 80), "d1") == "allow"
    for forged in (B6, C6, "fd00:98::5", "fe80::1", "::"):
        assert h.verdict("from", pk.tcp6(forged, B6, 1, 80), "d1") == "deny", forged
    # an IPv4 address's bytes in the IPv6 source do not match the IPv4 entry
    assert h.verdict("from", pk.tcp6("a41:1::", B6, 1, 80), "d1") == "deny"
    # B has no IPv6 address: it sends no IPv6 (its IPv4 still goes)
    assert h.verdict("from", pk.tcp6(B6, A6, 1, 80), "d2") == "deny"
    assert h.verdict("from", pk.tcp(B, A, 1, 80), "d2") == "allow"
    g = h.globals()
    assert g["spoofed_dropped"] == 7
    assert h.endpoint_counters("a")["spoofed"]["packets"] == 6


def test_extension_headers_are_walked_to_the_l4_header(harness):
    h = harness
    ingress(h, p.Rule("allow", protocol=6, dst_ports=(p.PortRange(8080, 8080),)),
            p.Rule("allow", protocol=17, src_ip_set_ids=("clients",)))
    chain = (pk.ext_header(pk.EXT_HOP_BY_HOP), pk.ext_header(pk.EXT_DSTOPTS, 2),
             pk.ext_header(pk.EXT_ROUTING), pk.ext_header(pk.EXT_AH, 4),
             pk.ext_header(pk.EXT_DSTOPTS))
    check(h, pk.tcp6(B6, A6, 1, 8080, ext=chain), Pkt(B6, A6, 6, 1, 8080), "allow")
    check(h, pk.tcp6(B6, A6, 1, 9090, ext=chain), Pkt(B6, A6, 6, 1, 9090), "deny")
    # the most the parser walks: 8 extension headers
    eight = tuple(pk.ext_header(pk.EXT_DSTOPTS) for _ in range(8))
    assert to_a(h, pk.tcp6(B6, A6, 1, 8080, ext=eight)) == "allow"
    before = h.globals()
    # nine: dropped and counted, even where policy would allow
    nine = (*eight, pk.ext_header(pk.EXT_DSTOPTS))
    assert to_a(h, pk.tcp6(B6, A6, 1, 8080, ext=nine)) == "deny"
    # headers the parser does not walk (mobility, HIP, shim6, experimental): dropped
    for kind in (135, 139, 140, 253):
        assert to_a(h, pk.udp6(B6, A6, 1, 53, ext=(pk.ext_header(kind),))) == "deny", kind
    # an extension header cut short is malformed
    cut = pk.tcp6(B6, A6, 1, 8080, ext=(pk.ext_header(pk.EXT_HOP_BY_HOP, 4),))[:14 + 40 + 16]
    assert to_a(h, cut) == "deny"
    after = h.globals()
    assert after["ipv6_ext_dropped"] - before["ipv6_ext_dropped"] == 5
    assert after["malformed_dropped"] - before["malformed_dropped"] == 1
    assert after["policy_allowed"] == before["policy_allowed"]  # none reached policy
    # the counters are exposed as drop reasons
    from pyfelix.agent.bpf.maps.counters import GlobalCounter
    assert GlobalCounter.IPV6_EXT_DROPPED.name.lower() == "ipv6_ext_dropped"


def test_ipv6_fragments_are_evaluated_without_ports_and_never_bypass_policy(harness):
    h = harness
    ingress(h, p.Rule("allow", protocol=17, dst_ports=(p.PortRange(53, 53),)),
            p.Rule("allow", protocol=17, src_nets=(f"{C6}/128",)))
    first = pk.udp6(B6, A6, 1, 53, ext=(pk.ext_fragment(0, more=True),))
    later = pk.ipv6(B6, A6, 17, bytes(16), ext=(pk.ext_fragment(1448),))
    # the first fragment has the UDP header: its port matches
    assert to_a(h, first) == "allow"
    # a later fragment has no ports: the port rule cannot match it; the set-only rule can
    assert to_a(h, later) == "deny"
    assert to_a(h, pk.ipv6(C6, A6, 17, bytes(16), ext=(pk.ext_fragment(1448),))) == "allow"
    # nor does conntrack let it through after the first fragment created an entry
    h.dp.maps["conntrack"].clear()
    assert h.verdict("to", first, "d1") == "allow"
    assert h.verdict("to", later, "d1") == "deny"
    # a fragment behind other extension headers is found too
    behind = pk.ipv6(B6, A6, 17, bytes(16),
                     ext=(pk.ext_header(pk.EXT_HOP_BY_HOP), pk.ext_fragment(64)))
    assert to_a(h, behind) == "deny"
    assert h.globals()["fragments"] == 6


def test_ipv6_to_the_host_follows_the_endpoint_to_host_action(harness):
    h = harness
    h.route_inputs.local_addrs = {"eth0": frozenset({f"{HOST6}/64"})}
    h.apply(ALLOW_ALL, endpoint_a(h, profiles=("allow-all",)),
            h.endpoint("b", "d2", profiles=("allow-all",), ipv6=(f"{B6}/128",)))
    to_host = pk.tcp6(A6, HOST6, 40000, 22)
    assert h.verdict("from", to_host, "d1") == "deny"  # Felix's default: Drop
    assert h.globals()["ep_to_host_dropped"] == 1
    assert h.verdict("from", pk.tcp6(A6, B6, 40000, 22), "d1") == "allow"
    h.apply(p.ConfigUpdate((("DefaultEndpointToHostAction", "Accept"),)))
    h.dp.maps["conntrack"].clear()
    assert h.verdict("from", to_host, "d1") == "allow"


def test_ipv6_support_false_drops_ipv6_but_not_neighbour_discovery(harness):
    h = harness
    h.apply(ALLOW_ALL, endpoint_a(h, profiles=("allow-all",)),
            p.ConfigUpdate((("Ipv6Support", "false"),)))
    assert h.verdict("to", pk.tcp6(B6, A6, 1, 80), "d1") == "deny"
    assert h.verdict("from", pk.tcp6(A6, B6, 1, 80), "d1") == "deny"
    assert h.verdict("to", pk.tcp(B, A, 1, 80), "d1") == "allow"
    assert h.verdict("to", pk.icmpv6("fe80::1", "ff02::1:ff00:1", 135), "d1") == "allow"
    g = h.globals()
    assert g["ipv6_dropped"] == 2 and g["ipv6_nd_passed"] == 1
    h.apply(p.ConfigUpdate(()))
    assert to_a(h, pk.tcp6(B6, A6, 1, 80)) == "allow"


def test_malformed_ipv6_drops(harness):
    h = harness
    h.apply(ALLOW_ALL, endpoint_a(h, profiles=("allow-all",)))
    full = pk.tcp6(B6, A6, 1, 80)
    # (a frame cut inside the IPv6 header is refused by BPF_PROG_TEST_RUN itself)
    assert to_a(h, full[:14 + 40 + 10]) == "deny"  # TCP header cut short
    wrong_version = full[:14] + bytes([0x40]) + full[15:]  # IPv6 ethertype, version 4
    assert to_a(h, wrong_version) == "deny"
    assert h.globals()["malformed_dropped"] == 2

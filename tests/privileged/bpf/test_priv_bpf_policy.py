"""The real tc programs decide policy as Calico does (BPF_PROG_TEST_RUN on crafted packets).

Pod A is 10.65.0.1 behind interface d1, pod B 10.65.0.2 behind d2. "to" runs calico_to_wep
(the pod's ingress policy), "from" runs calico_from_wep (its egress policy). Every verdict
is checked against a hard-coded expectation AND against the reference semantics
(tests/bpf/bpf_reference.expected_verdict) where a rule is involved. Conntrack is cleared
before each policy verdict unless the test is about conntrack.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps import endpoints as endpoints_map
from pyfelix.agent.bpf.maps import ep_by_ifindex as ep_array
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_REDIRECT
from tests.bpf.bpf_reference import Pkt, expected_verdict
from tests.bpf.test_bpf_compiler import SETS, rules
from tests.privileged.bpf.bpf_harness import Harness

pytestmark = pytest.mark.privileged

A, B, OTHER, EXT = "10.65.0.1", "10.65.0.2", "10.65.9.9", "192.0.2.10"
ALLOW_ALL = p.ActiveProfileUpdate("allow-all", p.Profile(
    inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),)))


def ingress_policy(h: Harness, *rules_: p.Rule, name: str = "pol", tier: str = "default",
                   default: str = "deny", profiles: tuple[str, ...] = ()) -> None:
    h.apply(ALLOW_ALL,
            p.ActivePolicyUpdate(p.PolicyID(tier, name), p.Policy(inbound_rules=rules_)),
            h.endpoint("a", "d1", profiles=profiles, tiers=(
                p.TierInfo(tier, ingress_policies=(name,), default_action=default),)))


def to_a(h: Harness, pkt: bytes) -> str:
    h.dp.maps["conntrack"].clear()
    return h.verdict("to", pkt, "d1")


def check(h: Harness, frame: bytes, model: Pkt, want: str) -> None:
    """Kernel verdict == want == reference semantics, for traffic to pod A."""
    ep = h.state.endpoints[p.WorkloadEndpointID("k8s", "default/a", "eth0")]
    assert expected_verdict(h.state, ep, "ingress", model) == want, model
    assert to_a(h, frame) == want, model


def tcp(src: str, dport: int, sport: int = 40000, dst: str = A) -> tuple[bytes, Pkt]:
    return pk.tcp(src, dst, sport, dport), Pkt(src, dst, 6, sport, dport)


def udp(src: str, dport: int, sport: int = 40000, dst: str = A) -> tuple[bytes, Pkt]:
    return pk.udp(src, dst, sport, dport), Pkt(src, dst, 17, sport, dport)


def sctp(src: str, dport: int, sport: int = 40000) -> tuple[bytes, Pkt]:
    return pk.sctp(src, A, sport, dport), Pkt(src, A, 132, sport, dport)


def icmp(src: str, t: int = 8, code: int = 0) -> tuple[bytes, Pkt]:
    return pk.icmp(src, A, t, code), Pkt(src, A, 1, 7, 7, t, code)


# --- every rule field ---------------------------------------------------------------------


def test_protocol_and_not_protocol(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", protocol=17))
    check(h, *udp(B, 53), "allow")
    check(h, *tcp(B, 53), "deny")
    check(h, *sctp(B, 53), "deny")
    ingress_policy(h, p.Rule("allow", not_protocol=6))
    check(h, *udp(B, 53), "allow")
    check(h, *icmp(B), "allow")
    check(h, *tcp(B, 53), "deny")


def test_src_and_dst_nets_and_not_nets(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", src_nets=("10.65.0.0/30", "192.0.2.0/28")))
    check(h, *tcp(B, 80), "allow")
    check(h, *tcp(EXT, 80), "allow")
    check(h, *tcp(OTHER, 80), "deny")
    ingress_policy(h, p.Rule("allow", not_src_nets=("10.65.0.0/16",)))
    check(h, *tcp(EXT, 80), "allow")
    check(h, *tcp(B, 80), "deny")
    ingress_policy(h, p.Rule("allow", dst_nets=("10.65.0.1/32",)))
    check(h, *tcp(B, 80), "allow")
    check(h, *tcp(B, 80, dst="10.65.0.3"), "deny")
    ingress_policy(h, p.Rule("allow", not_dst_nets=("10.65.0.0/31",)))
    check(h, *tcp(B, 80, dst="10.65.0.3"), "allow")
    check(h, *tcp(B, 80), "deny")


def test_selectors_and_not_selectors_through_ip_sets(harness):
    h = harness
    h.apply(p.IPSetUpdate("s:frontend", "net", frozenset({B, "10.65.1.0/24"})),
            p.IPSetUpdate("s:canary", "net", frozenset({"10.65.1.7"})))
    ingress_policy(h, p.Rule("allow", src_ip_set_ids=("s:frontend",),
                             not_src_ip_set_ids=("s:canary",)))
    check(h, *tcp(B, 80), "allow")
    check(h, *tcp("10.65.1.5", 80), "allow")
    check(h, *tcp("10.65.1.7", 80), "deny")  # in the notSelector set
    check(h, *tcp(OTHER, 80), "deny")
    # membership changes apply without touching the rules
    h.apply(p.IPSetDeltaUpdate("s:frontend", added=frozenset({OTHER}),
                               removed=frozenset({B})))
    check(h, *tcp(OTHER, 80), "allow")
    check(h, *tcp(B, 80), "deny")
    # dst selector: the set must contain the destination (pod A)
    h.apply(p.IPSetUpdate("s:dst", "net", frozenset({A})))
    ingress_policy(h, p.Rule("allow", dst_ip_set_ids=("s:dst",)))
    check(h, *tcp(B, 80), "allow")
    ingress_policy(h, p.Rule("allow", not_dst_ip_set_ids=("s:dst",)))
    check(h, *tcp(B, 80), "deny")


def test_ports_and_not_ports_with_ranges(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", protocol=6, dst_ports=(
        p.PortRange(80, 80), p.PortRange(8000, 8099)), not_dst_ports=(p.PortRange(8050, 8059),)))
    for port, want in ((80, "allow"), (81, "deny"), (8000, "allow"), (8099, "allow"),
                       (8100, "deny"), (8049, "allow"), (8050, "deny"), (8059, "deny")):
        check(h, *tcp(B, port), want)
    ingress_policy(h, p.Rule("allow", protocol=17, src_ports=(p.PortRange(53, 53),)))
    check(h, *udp(B, 9999, sport=53), "allow")
    check(h, *udp(B, 53, sport=54), "deny")
    ingress_policy(h, p.Rule("allow", protocol=17, not_src_ports=(p.PortRange(0, 1023),)))
    check(h, *udp(B, 53, sport=1024), "allow")
    check(h, *udp(B, 53, sport=1023), "deny")
    # a port constraint never matches a packet without ports
    check(h, *icmp(B), "deny")
    ingress_policy(h, p.Rule("allow", protocol=132, dst_ports=(p.PortRange(9000, 9000),)))
    check(h, *sctp(B, 9000), "allow")
    check(h, *sctp(B, 9001), "deny")


def test_many_ports_and_not_ports_overflowing_the_slots(harness):
    h = harness
    ports = tuple(p.PortRange(1000 + 10 * i, 1000 + 10 * i) for i in range(30))
    not_ports = tuple(p.PortRange(1000 + 20 * i, 1000 + 20 * i) for i in range(12))
    ingress_policy(h, p.Rule("allow", protocol=6, dst_ports=ports, not_dst_ports=not_ports))
    assert sum(r.action == rules_map.Action.SKIP for r in
               h.last.programs[next(iter(h.last.programs))].ingress.records) == 1
    for port in (1000, 1010, 1020, 1030, 1230, 1250, 1290, 1300, 1005):
        frame, model = tcp(B, port)
        check(h, frame, model, expected_verdict(h.state, next(iter(h.state.endpoints.values())),
                                                "ingress", model))


def test_named_ports_through_ip_port_sets(harness):
    h = harness
    h.apply(p.IPSetUpdate("n:http", "ip_port", frozenset({f"{A}/32,tcp:8080", "10.65.0.9,tcp:80"})),
            p.IPSetUpdate("n:dns", "ip_port", frozenset({f"{B}/32,udp:53"})))
    ingress_policy(h, p.Rule("allow", dst_named_port_ip_set_ids=("n:http",),
                             dst_ports=(p.PortRange(9090, 9090),)))
    check(h, *tcp(B, 8080), "allow")  # (A, tcp, 8080) is in the set
    check(h, *tcp(B, 80), "deny")  # port 80 is a named port of another pod
    check(h, *udp(B, 8080), "deny")  # protocol is part of the member
    check(h, *tcp(B, 9090), "allow")  # numeric ports OR named ports
    ingress_policy(h, p.Rule("allow", src_named_port_ip_set_ids=("n:dns",)))
    check(h, *udp(B, 5000, sport=53), "allow")
    check(h, *udp(OTHER, 5000, sport=53), "deny")
    ingress_policy(h, p.Rule("allow", protocol=6, not_dst_named_port_ip_set_ids=("n:http",)))
    check(h, *tcp(B, 8080), "deny")
    check(h, *tcp(B, 8081), "allow")


def test_icmp_type_and_code_and_their_negation(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", protocol=1, icmp_type=8))
    check(h, *icmp(B, 8, 0), "allow")
    check(h, *icmp(B, 0, 0), "deny")
    ingress_policy(h, p.Rule("allow", protocol=1, icmp_type=3, icmp_code=4))
    check(h, *icmp(B, 3, 4), "allow")
    check(h, *icmp(B, 3, 1), "deny")
    ingress_policy(h, p.Rule("allow", protocol=1, not_icmp_type=3, not_icmp_code=4))
    check(h, *icmp(B, 3, 1), "allow")
    check(h, *icmp(B, 8, 0), "allow")
    check(h, *icmp(B, 3, 4), "deny")
    ingress_policy(h, p.Rule("allow", icmp_type=8))
    check(h, *tcp(B, 8), "deny")  # ICMP fields need an ICMP packet


# --- tiers, actions, profiles ---------------------------------------------------------------


def two_tier_endpoint(h: Harness, t1_rules, t2_rules, t1_default="deny", profiles=()):
    h.apply(ALLOW_ALL,
            p.ActivePolicyUpdate(p.PolicyID("t1", "p1"), p.Policy(inbound_rules=t1_rules)),
            p.ActivePolicyUpdate(p.PolicyID("t2", "p2"), p.Policy(inbound_rules=t2_rules)),
            h.endpoint("a", "d1", profiles=profiles, tiers=(
                p.TierInfo("t1", ingress_policies=("p1",), default_action=t1_default),
                p.TierInfo("t2", ingress_policies=("p2",)))))


def test_first_matching_allow_or_deny_is_final_across_tiers(harness):
    h = harness
    two_tier_endpoint(h, (p.Rule("deny", src_nets=(EXT + "/32",)), p.Rule("allow", protocol=6)),
                      (p.Rule("allow"),))
    check(h, *tcp(EXT, 80), "deny")  # tier 1 deny, tier 2's allow never reached
    check(h, *tcp(B, 80), "allow")
    check(h, *udp(B, 80), "deny")  # tier 1 has policies and none matched: end of tier


def test_pass_ends_the_tier_and_default_action_pass(harness):
    h = harness
    two_tier_endpoint(h, (p.Rule("pass", protocol=17), p.Rule("allow", protocol=17)),
                      (p.Rule("deny", dst_ports=(p.PortRange(53, 53),), protocol=17),
                       p.Rule("allow", protocol=17)))
    check(h, *udp(B, 53), "deny")  # passed to tier 2, which denies 53
    check(h, *udp(B, 54), "allow")
    check(h, *tcp(B, 54), "deny")  # end of tier 1
    two_tier_endpoint(h, (p.Rule("deny", protocol=1),), (p.Rule("allow", protocol=6),),
                      t1_default="pass")
    check(h, *tcp(B, 80), "allow")  # tier 1 no match, default pass -> tier 2
    check(h, *icmp(B), "deny")
    check(h, *udp(B, 80), "deny")  # tier 2's end


def test_pass_in_the_last_tier_reaches_the_profiles(harness):
    h = harness
    h.apply(p.ActiveProfileUpdate("udp-only", p.Profile(inbound_rules=(
        p.Rule("allow", protocol=17),))))
    two_tier_endpoint(h, (p.Rule("pass"),), (p.Rule("pass"),), profiles=("udp-only",))
    check(h, *udp(B, 5), "allow")
    check(h, *tcp(B, 5), "deny")  # profiles matched nothing: final deny


def test_no_policies_means_profiles_and_nothing_matched_means_deny(harness):
    h = harness
    h.apply(p.ActiveProfileUpdate("tcp-only", p.Profile(inbound_rules=(
        p.Rule("allow", protocol=6),))),
        h.endpoint("a", "d1", profiles=("tcp-only",), tiers=(
            p.TierInfo("default", egress_policies=("egress-only",)),)),
        p.ActivePolicyUpdate(p.PolicyID("default", "egress-only"),
                             p.Policy(outbound_rules=(p.Rule("deny"),))))
    check(h, *tcp(B, 80), "allow")  # no ingress policy: profile
    check(h, *udp(B, 80), "deny")
    assert h.verdict("from", pk.tcp(A, B, 1, 2), "d1") == "deny"  # egress: the policy
    h.apply(h.endpoint("a", "d1"))
    check(h, *tcp(B, 80), "deny")  # no policy, no profile


def test_log_counts_and_continues(harness):
    h = harness
    ingress_policy(h, p.Rule("log", protocol=6, rule_id="log-tcp"),
                   p.Rule("allow", dst_ports=(p.PortRange(80, 80),), protocol=6,
                          rule_id="allow-80"))
    check(h, *tcp(B, 80), "allow")
    check(h, *tcp(B, 81), "deny")
    assert h.rule_counter("log-tcp")[0] == 2
    assert h.rule_counter("allow-80")[0] == 1


def test_a_present_array_slot_is_the_endpoint_and_a_cleared_one_falls_back_to_the_hash(harness):
    # lookup_endpoint() (endpoints.h): the ep_by_ifindex slot when PRESENT, else the hash.
    # The harness writes only the hash; here the slot says admin-down, the hash does not.
    h = harness
    pod_to_pod(h, (p.Rule("allow"),))
    pkt = pk.tcp(A, B, 40000, 80, "S")  # B allows all ingress
    assert h.verdict("to", pkt, "d2") == "allow"  # from the hash entry
    ifindex = h.ifindexes["d2"]
    entry = endpoints_map.decode_value(
        h.dp.maps["endpoints"].lookup(endpoints_map.encode_key(ifindex)))
    array = h.dp.maps["ep_by_ifindex"]
    down = endpoints_map.encode_value(
        entry["endpoint_id"], endpoints_map.FLAG_ADMIN_DOWN | ep_array.FLAG_PRESENT,
        (entry["ingress"]["start"], entry["ingress"]["len"]),
        (entry["egress"]["start"], entry["egress"]["len"]))
    array.update(ep_array.encode_index(ifindex), down)
    assert h.verdict("to", pkt, "d2") == "deny"  # the slot wins
    assert h.globals()["admin_down_dropped"] == 1
    array.update(ep_array.encode_index(ifindex), ep_array.EMPTY)
    assert h.verdict("to", pkt, "d2") == "allow"  # cleared: the hash again


def test_admin_down_endpoint_drops_everything(harness):
    h = harness
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",), state="inactive"))
    assert to_a(h, pk.tcp(B, A, 1, 2)) == "deny"
    assert h.verdict("from", pk.tcp(A, B, 1, 2), "d1") == "deny"
    assert h.globals()["admin_down_dropped"] == 2


def test_unknown_interface_and_malformed_drop(harness):
    h = harness
    assert h.verdict("to", pk.tcp(B, A, 1, 2), "d3") == "deny"
    assert h.globals()["no_endpoint_dropped"] == 1
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",)))
    truncated = pk.tcp(B, A, 1, 2)[:14 + 20 + 10]  # TCP header cut short
    assert h.verdict("to", truncated, "d1") == "deny"
    assert h.globals()["malformed_dropped"] == 1


def test_unknown_protocols_drop_arp_and_link_scope_nd_pass_the_rest_of_ipv6_is_policed(
        harness):
    """Nothing passes unpoliced: unknown ethertypes drop even under allow-all; ARP and
    link-scope neighbour discovery pass before policy, per direction; every other IPv6
    packet goes through the source check and policy (here an endpoint with no policy at
    all, which denies everything)."""
    h = harness
    h.apply(h.endpoint("a", "d1", ipv6=("fe80::1/128", "fd00::1/128")),
            p.RouteUpdate("fd00::fe/128", "local_host"))
    for hook in ("to", "from"):
        assert h.verdict(hook, pk.ipv6_udp("fd00::1", "fd00::2", 1, 2), "d1") == "deny"
        # ICMPv6 echo is not neighbour discovery, even to a link-local address
        assert h.verdict(hook, pk.icmpv6("fe80::1", "fe80::2", 128), "d1") == "deny"
        # ND to a routable address: only between the pod and the host, as the iptables
        # fallback's INPUT/OUTPUT accepts (to the pod with hop limit 255: the host sent
        # it, e.g. the answer to the pod's solicitation from its global address; from the
        # pod: to one of the host's addresses); a routed one (hop limit 64) is policed
        assert h.verdict(hook, pk.icmpv6("fe80::1", "fd00::2", 135), "d1") == \
            ("allow" if hook == "to" else "deny")
        assert h.verdict(hook, pk.icmpv6("fe80::1", "fd00::fe", 136, hop_limit=64),
                         "d1") == "deny"
        assert h.verdict(hook, pk.icmpv6("fe80::1", "ff02::1:ff00:2", 135, hop_limit=64),
                         "d1") == "deny"
        assert h.verdict(hook, pk.raw_ethertype(0x88B5), "d1") == "deny"  # IEEE local exp.
        assert h.verdict(hook, pk.arp_request(A, B), "d1") == "allow"
        for nd_type in (135, 136):  # neighbour solicitation / advertisement
            assert h.verdict(hook, pk.icmpv6("fe80::1", "ff02::1:ff00:2", nd_type),
                             "d1") == "allow"
        # MLDv2 report behind a hop-by-hop header, hop limit 1
        assert h.verdict(hook, pk.icmpv6("fe80::1", "ff02::16", 143, hop_limit=1,
                                         hop_by_hop=True), "d1") == "allow"
        assert h.verdict(hook, pk.icmpv6("fe80::1", "fe80::2", 137), "d1") == "deny"  # redirect
    assert h.verdict("from", pk.icmpv6("fd00::1", "fd00::fe", 136), "d1") == "allow"
    assert h.verdict("from", pk.icmpv6("fd00::1", "fd00::fe", 128), "d1") == "deny"
    # router solicitations only from the pod, advertisements only to it
    assert h.verdict("from", pk.icmpv6("fe80::1", "ff02::2", 133), "d1") == "allow"
    assert h.verdict("to", pk.icmpv6("fe80::1", "ff02::2", 133), "d1") == "deny"
    assert h.verdict("to", pk.icmpv6("fe80::1", "ff02::1", 134), "d1") == "allow"
    assert h.verdict("from", pk.icmpv6("fe80::1", "ff02::1", 134), "d1") == "deny"
    g = h.globals()
    assert g["policy_denied"] == 5 + 6 + 1 + 2  # the non-ND IPv6: policed (and denied)
    assert g["ipv6_packets"] == 5 + 6 + 1 + 2
    assert g["ipv6_dropped"] == 0  # Ipv6Support is on
    assert g["unknown_proto_dropped"] == 2
    assert g["arp_passed"] == 2
    assert g["ipv6_nd_passed"] == 2 * 3 + 1 + 1 + 2
    assert g["policy_allowed"] == 0


def test_sources_a_pod_may_not_use_are_dropped_before_policy(harness):
    """RPF: under allow-all, a pod may send only from its own addresses or an allowed
    spoofed prefix; another pod's address, a host address or an outside address drops,
    counted globally and against the endpoint, and creates no conntrack entry."""
    h = harness
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",)),
            h.endpoint("b", "d2", profiles=("allow-all",)))
    assert h.verdict("from", pk.tcp(A, B, 40000, 80), "d1") == "allow"
    for forged in (B, "198.18.0.1", "203.0.113.9"):
        assert h.verdict("from", pk.tcp(forged, B, 40000, 80), "d1") == "deny", forged
        assert h.verdict("from", pk.udp(forged, B, 40000, 53), "d1") == "deny", forged
    assert h.globals()["spoofed_dropped"] == 6
    assert h.endpoint_counters("a")["spoofed"]["packets"] == 6
    assert h.endpoint_counters("b")["spoofed"]["packets"] == 0
    # the same traffic TO the pod is not subject to the source check
    assert h.verdict("to", pk.udp("203.0.113.9", A, 40000, 53), "d1") == "allow"
    # allowSpoofedSourcePrefixes opens exactly that prefix
    h.apply(h.endpoint("a", "d1", profiles=("allow-all",), allow_spoofed=("203.0.113.0/24",)))
    assert h.verdict("from", pk.udp("203.0.113.9", B, 40000, 53), "d1") == "allow"
    assert h.verdict("from", pk.udp("203.0.114.9", B, 40000, 53), "d1") == "deny"
    assert h.verdict("from", pk.udp(B, A, 40000, 53), "d1") == "deny"
    # and withdrawing it closes it again; an endpoint without addresses sends nothing
    h.apply(h.endpoint("a", "d1", profiles=("allow-all",)))
    assert h.verdict("from", pk.udp("203.0.113.9", B, 40001, 53), "d1") == "deny"
    h.apply(h.endpoint("a", "d1", profiles=("allow-all",), ipv4=()))
    assert h.verdict("from", pk.udp(A, B, 40002, 53), "d1") == "deny"


def test_fragments_are_evaluated_without_ports(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", protocol=17, dst_ports=(p.PortRange(53, 53),)),
                   p.Rule("allow", protocol=17, src_nets=(EXT + "/32",)))
    later_fragment = pk.udp(B, A, 1, 53, frag_off=100)
    assert to_a(h, later_fragment) == "deny"
    assert to_a(h, pk.udp(EXT, A, 1, 53, frag_off=100)) == "allow"
    first_fragment = pk.udp(B, A, 1, 53, frag_off=0x2000)  # MF set, offset 0: has ports
    assert to_a(h, first_fragment) == "allow"
    assert h.globals()["fragments"] == 3


def test_endpoint_to_host_action(harness):
    h = harness
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",)),
            p.HostMetadataUpdate("node1", "198.18.0.1"))
    to_host = pk.tcp(A, "198.18.0.1", 40000, 22)
    assert h.verdict("from", to_host, "d1") == "deny"  # Felix's default: Drop
    assert h.globals()["ep_to_host_dropped"] == 1
    assert h.verdict("from", pk.tcp(A, B, 40000, 22), "d1") == "allow"
    h.apply(p.ConfigUpdate((("DefaultEndpointToHostAction", "Accept"),)))
    assert h.verdict("from", to_host, "d1") == "allow"


# --- conntrack ----------------------------------------------------------------------------


def pod_to_pod(h: Harness, b_ingress: tuple[p.Rule, ...]) -> None:
    h.apply(ALLOW_ALL,
            p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"), p.Policy(
                outbound_rules=(p.Rule("allow", protocol=6, dst_ports=(p.PortRange(80, 80),)),),
                inbound_rules=())),
            p.ActivePolicyUpdate(p.PolicyID("default", "b-ingress"), p.Policy(
                inbound_rules=b_ingress)),
            h.endpoint("a", "d1", tiers=(p.TierInfo(
                "default", ingress_policies=("a-egress",), egress_policies=("a-egress",)),)),
            h.endpoint("b", "d2", tiers=(p.TierInfo(
                "default", ingress_policies=("b-ingress",)),), profiles=("allow-all",)))


def test_reply_traffic_is_allowed_by_conntrack_only(harness):
    h = harness
    pod_to_pod(h, (p.Rule("allow", protocol=6, dst_ports=(p.PortRange(80, 80),)),))
    syn = pk.tcp(A, B, 40000, 80, "S")
    synack = pk.tcp(B, A, 80, 40000, "SA")
    assert h.verdict("from", syn, "d1") == "allow"  # A's egress policy
    assert h.verdict("to", syn, "d2") == "allow"  # B's ingress policy
    # A's and B's ingress policy allow nothing from port 80 / to port 40000: only CT does
    assert h.verdict("from", synack, "d2") == "allow"
    assert h.verdict("to", synack, "d1") == "allow"
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "A"), "d1") == "allow"
    g = h.globals()
    assert (g["ct_created"], g["ct_hit"], g["policy_allowed"]) == (2, 3, 2)
    # unsolicited traffic B -> A (new tuple) hits A's ingress policy, which denies it
    assert h.verdict("to", pk.tcp(B, A, 80, 40001, "SA"), "d1") == "deny"
    # the reply direction at the ORIGINAL hook is not established (spoofed source)
    assert h.verdict("from", pk.tcp(B, A, 80, 40000, "A"), "d1") == "deny"
    # a flow that B's ingress policy denies leaves no entry at B's interface
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "b-ingress"), p.Policy()))
    created = h.globals()["ct_created"]
    assert h.verdict("from", pk.tcp(A, B, 40003, 80), "d1") == "allow"
    assert h.verdict("to", pk.tcp(A, B, 40003, 80), "d2") == "deny"
    assert h.globals()["ct_created"] == created + 1
    key_b = ct_map.encode_key(ct_map.normalise(h.ifindexes["d2"], A, B, 40003, 80, 6)[0])
    assert h.dp.maps["conntrack"].lookup(key_b) is None


def test_conntrack_timestamps_are_on_the_clock_python_reads(harness):
    # the cleaner and `pyfelix bpf conntrack dump` compare these stamps with ct_map.now_ns();
    # a program on another clock (e.g. bpf_ktime_get_ns vs the coarse clock) would make
    # every age off by up to a tick, or by boot-time offsets for other clocks
    h = harness
    pod_to_pod(h, (p.Rule("allow"),))
    before = ct_map.now_ns()
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "S"), "d1") == "allow"
    after = ct_map.now_ns()
    key = ct_map.encode_key(ct_map.normalise(h.ifindexes["d1"], A, B, 40000, 80, 6)[0])
    v = ct_map.decode_value(h.dp.maps["conntrack"].lookup(key))
    assert before <= v.created_ns == v.last_seen_ns <= after


def test_conntrack_entries_expire_and_closed_connections_restart_through_policy(harness):
    h = harness
    pod_to_pod(h, (p.Rule("allow"),))
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "S"), "d1") == "allow"
    assert h.verdict("to", pk.tcp(B, A, 80, 40000, "SA"), "d1") == "allow"
    ct = h.dp.maps["conntrack"]
    key = ct_map.encode_key(ct_map.normalise(h.ifindexes["d1"], A, B, 40000, 80, 6)[0])
    v = ct_map.decode_value(ct.lookup(key))
    assert v.flags & ct_map.CtFlags.SEEN_REPLY and v.packets == 2
    # age it past its timeout (as a SYN-only entry: 20 s, since the machine's monotonic
    # clock may be younger than the 1 h established timeout): the reply is now a miss,
    # and A's ingress policy denies it
    now = ct_map.now_ns()
    if now < 25 * ct_map.NS_PER_S:
        pytest.skip("monotonic clock younger than 25 s")
    old = ct_map.FlowValue(v.created_ns, now - 25 * ct_map.NS_PER_S, v.packets, v.bytes,
                           int(ct_map.CtFlags.ORIG_A_TO_B), v.counter_id)
    ct.update(key, ct_map.encode_value(old))
    assert h.verdict("to", pk.tcp(B, A, 80, 40000, "A"), "d1") == "deny"
    assert h.globals()["ct_expired"] == 1
    # RST closes; a new SYN on the same tuple goes through policy again
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "S"), "d1") == "allow"
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "R"), "d1") == "allow"
    assert ct_map.decode_value(ct.lookup(key)).flags & ct_map.CtFlags.RST
    policy_before = h.globals()["policy_allowed"]
    assert h.verdict("from", pk.tcp(A, B, 40000, 80, "S"), "d1") == "allow"
    assert h.globals()["policy_allowed"] == policy_before + 1


def test_icmp_errors_about_a_tracked_flow_are_related(harness):
    h = harness
    pod_to_pod(h, (p.Rule("allow"),))
    out = pk.udp(A, EXT, 5000, 53)
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"), p.Policy(
        outbound_rules=(p.Rule("allow", protocol=17),))))
    assert h.verdict("from", out, "d1") == "allow"
    unreachable = pk.icmp_error("198.18.0.254", A, out, icmp_type=3, code=3)
    assert h.verdict("to", unreachable, "d1") == "allow"
    assert h.globals()["ct_related"] == 1
    stray = pk.icmp_error("198.18.0.254", A, pk.udp(A, EXT, 5001, 53))
    assert h.verdict("to", stray, "d1") == "deny"


def test_echo_reply_is_tracked(harness):
    h = harness
    pod_to_pod(h, (p.Rule("allow"),))
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"), p.Policy(
        outbound_rules=(p.Rule("allow", protocol=1),))))
    assert h.verdict("from", pk.icmp(A, EXT, 8, 0, ident=77), "d1") == "allow"
    assert h.verdict("to", pk.icmp(EXT, A, 0, 0, ident=77), "d1") == "allow"
    assert h.verdict("to", pk.icmp(EXT, A, 0, 0, ident=78), "d1") == "deny"
    # the peer pinging back with the same id is a new exchange: A's ingress policy decides
    assert h.verdict("to", pk.icmp(EXT, A, 8, 0, ident=77), "d1") == "deny"
    # and A answering requests it never saw is not a reply either: egress policy decides
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "a-egress"), p.Policy(
        outbound_rules=(p.Rule("allow", protocol=1, icmp_type=8),))))
    assert h.verdict("from", pk.icmp(A, EXT, 0, 0, ident=77), "d1") == "deny"


# --- counters ------------------------------------------------------------------------------


def test_rule_endpoint_and_global_counters(harness):
    h = harness
    ingress_policy(h, p.Rule("allow", protocol=6, rule_id="r-allow"),
                   p.Rule("deny", protocol=17, rule_id="r-deny"))
    frame = pk.tcp(B, A, 1, 80, payload=b"x" * 100)
    for _ in range(3):
        assert h.verdict("to", frame, "d1") == "allow"  # 1 policy verdict + 2 CT hits
    assert to_a(h, pk.udp(B, A, 1, 2)) == "deny"
    assert h.rule_counter("r-allow") == (1, len(frame))
    assert h.rule_counter("r-deny")[0] == 1
    ep = h.endpoint_counters("a")
    assert ep["ingress_allowed"] == {"packets": 3, "bytes": 3 * len(frame)}
    assert ep["ingress_denied"]["packets"] == 1
    assert ep["egress_allowed"]["packets"] == 0
    g = h.globals()
    assert (g["policy_allowed"], g["policy_denied"], g["ct_hit"]) == (1, 1, 2)


# --- long chains ---------------------------------------------------------------------------


def test_a_1000_rule_chain_costs_one_classifier_step(harness):
    """The classifier finds record 999 of 1,002 without walking the others: one candidate
    word, one step (the linear walk evaluated 1,000 records here)."""
    h = harness
    rules_ = tuple(p.Rule("allow", protocol=6, src_nets=(f"172.16.{i // 250}.{i % 250}/32",))
                   for i in range(999))
    ingress_policy(h, *rules_, p.Rule("allow", protocol=17, rule_id="last"))
    chain = h.last.programs[next(iter(h.last.programs))].ingress.records
    assert len(chain) == 1002  # + tier end + final deny
    assert to_a(h, pk.udp(B, A, 1, 2)) == "allow"
    assert h.rule_counter("last")[0] == 1
    assert h.globals()["classifier_steps"] == 1
    assert to_a(h, pk.tcp(B, A, 1, 2)) == "deny"  # tier end, record 1001
    assert h.globals()["classifier_steps"] == 2
    assert to_a(h, pk.tcp("172.16.3.7", A, 1, 2)) == "allow"  # rule 757
    assert h.globals()["classifier_steps"] == 3
    assert h.globals()["tail_call_failed"] == 0
    assert h.globals()["classifier_error"] == 0


def test_a_15000_rule_policy_is_classified_exactly_and_flat(harness):
    """Calico's figure after program splitting: 15,000 rules in one endpoint direction
    (150 source nets x 100 ports each: every rule its own (net, port)), first, middle and
    last rule found in one step each."""
    h = harness
    rules_ = tuple(p.Rule("allow", protocol=6, src_nets=(f"172.16.{i // 100}.0/24",),
                          dst_ports=(p.PortRange(1000 + i % 5000, 1000 + i % 5000),))
                   for i in range(15_000))
    ingress_policy(h, *rules_)
    out = h.last
    assert [x for x in out.problems if "not counted" not in x] == []
    chain = out.programs[next(iter(out.programs))].ingress.records
    assert len(chain) == 15_002  # + tier end + final deny
    steps = 0
    for i in (0, 7_777, 14_999):
        src = f"172.16.{i // 100}.7"
        assert to_a(h, pk.tcp(src, A, 1, 1000 + i % 5000)) == "allow", i
        assert to_a(h, pk.tcp(src, A, 1, 999)) == "deny", i  # a port no rule names
        steps += 2
        assert h.globals()["classifier_steps"] <= steps
    assert to_a(h, pk.udp("172.16.0.0", A, 1, 1000)) == "deny"
    assert h.globals()["classifier_error"] == 0 and h.globals()["tail_call_failed"] == 0


def test_more_classifier_steps_than_the_tail_call_limit_fail_closed(harness):
    """A pathological chain: records alternate between two sets of constraints such that
    every word has candidates in both fields but none in their AND, for 300 words. The
    program gives up after 33 runs x CLS_STEPS_PER_PROG steps and drops (counted);
    the Python mirror of the program says the same."""
    from pyfelix.agent.bpf import classifier as cls

    h = harness
    rules_ = []
    for _ in range(300 * 64 // 2):
        rules_.append(p.Rule("allow", protocol=6, src_nets=("10.77.0.0/16",),
                             dst_ports=(p.PortRange(81, 81),)))
        rules_.append(p.Rule("allow", protocol=6, src_nets=("10.78.0.0/16",),
                             dst_ports=(p.PortRange(80, 80),)))
    ingress_policy(h, *rules_, p.Rule("allow", rule_id="after-all"))
    out = h.last
    ref = out.programs[next(iter(out.programs))].ingress
    contents = cls.MapContents({
        "rules": out.all_rules(), "cls_chains": out.cls_chains,
        "cls_words": out.cls_words(out.cls_instances.values()),
        "cls_l4": out.cls_l4, "cls_tries": out.cls_tries})
    pkt = cls.Packet(int.from_bytes(bytes([10, 77, 0, 1]), "big"),
                     int.from_bytes(bytes([10, 65, 0, 2]), "big"), 6, 1, 1000, 80)
    assert cls.decide(contents, ref.start, ref.length, pkt) == ("error", 0)
    assert to_a(h, pk.tcp("10.77.0.1", A, 1000, 80)) == "deny"
    assert h.globals()["tail_call_failed"] == 1
    assert h.globals()["policy_allowed"] == 0


def test_a_chain_without_a_classifier_fails_closed(harness):
    from pyfelix.agent.bpf.maps import cls_chains as cls_chains_map

    h = harness
    ingress_policy(h, p.Rule("allow"))
    ref = h.last.programs[next(iter(h.last.programs))].ingress
    assert to_a(h, pk.tcp(B, A, 1, 2)) == "allow"
    h.dp.maps["cls_chains"].update(cls_chains_map.encode_index(ref.start),
                                   cls_chains_map.EMPTY)
    assert to_a(h, pk.tcp(B, A, 1, 3)) == "deny"
    assert h.globals()["classifier_error"] == 1


# --- XDP -----------------------------------------------------------------------------------


def test_xdp_drops_untracked_denied_sources_early(harness):
    from pyfelix.agent.bpf.testrun import XDP_DROP, XDP_PASS

    h = harness
    h.apply(p.IPSetUpdate("s:bad", "net", frozenset({"203.0.113.0/24"})),
            p.ActivePolicyUpdate(p.PolicyID("default", "untracked"), p.Policy(
                untracked=True, inbound_rules=(
                    p.Rule("deny", src_ip_set_ids=("s:bad",), rule_id="xdp-deny"),
                    p.Rule("allow", src_nets=("198.51.100.0/24",)),
                    p.Rule("deny", src_nets=("198.51.0.0/16",))))),
            p.HostEndpointUpdate(p.HostEndpointID("hep-d3"), p.HostEndpoint(
                name="d3", untracked_tiers=(p.TierInfo("default", ("untracked",)),))))
    assert h.xdp(pk.tcp("203.0.113.9", "198.18.0.1", 1, 22), "d3") == XDP_DROP
    assert h.xdp(pk.tcp("203.0.113.9", "198.18.0.1", 1, 22), "d4") == XDP_PASS  # other iface
    assert h.xdp(pk.tcp("198.51.7.7", "198.18.0.1", 1, 22), "d3") == XDP_PASS  # after allow
    assert h.xdp(pk.ipv6_udp("fd00::1", "fd00::2", 1, 2), "d3") == XDP_PASS
    assert h.rule_counter("xdp-deny")[0] == 1
    assert h.globals()["xdp_dropped"] == 1


def test_xdp_drops_untracked_denied_ipv6_sources_early(harness):
    """doNotTrack for IPv6: the leading source-only denies' IPv6 prefixes (nets and IP set
    members) go in the same trie, keyed by family; an ipVersion 4 deny adds none of its
    IPv6 prefixes, and IPv4 with the same leading bits is not matched."""
    from pyfelix.agent.bpf.testrun import XDP_DROP, XDP_PASS

    h = harness
    h.apply(p.IPSetUpdate("s:bad", "net", frozenset({"2001:db8:bad::/48", "203.0.113.0/24"})),
            p.ActivePolicyUpdate(p.PolicyID("default", "untracked"), p.Policy(
                untracked=True, inbound_rules=(
                    p.Rule("deny", src_ip_set_ids=("s:bad",), rule_id="xdp-deny"),
                    p.Rule("deny", ip_version=4, src_nets=("2001:db8:4::/48",)),
                    p.Rule("deny", src_nets=("2001:db8:6::/48",), rule_id="xdp-deny6"),
                    p.Rule("allow")))),
            p.HostEndpointUpdate(p.HostEndpointID("hep-d3"), p.HostEndpoint(
                name="d3", untracked_tiers=(p.TierInfo("default", ("untracked",)),))))
    assert h.xdp(pk.tcp6("2001:db8:bad::9", "fd00::1", 1, 22), "d3") == XDP_DROP
    assert h.xdp(pk.udp6("2001:db8:6::9", "fd00::1", 1, 53), "d3") == XDP_DROP
    assert h.xdp(pk.udp6("2001:db8:4::9", "fd00::1", 1, 53), "d3") == XDP_PASS
    assert h.xdp(pk.tcp6("2001:db8:bad::9", "fd00::1", 1, 22), "d4") == XDP_PASS
    assert h.xdp(pk.tcp("203.0.113.9", "198.18.0.1", 1, 22), "d3") == XDP_DROP
    # 0x2001_0db8 as an IPv4 address: same bits, other family
    assert h.xdp(pk.tcp("32.1.13.184", "198.18.0.1", 1, 22), "d3") == XDP_PASS
    assert h.rule_counter("xdp-deny")[0] == 2
    assert h.rule_counter("xdp-deny6")[0] == 1
    assert h.globals()["xdp_dropped"] == 3


# --- property: the kernel agrees with the semantics -----------------------------------------

ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1", "10.0.2.2", "10.9.9.9"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(rules(), min_size=1, max_size=6), st.sampled_from(["deny", "pass"]),
       st.lists(st.tuples(st.sampled_from(ADDRS), st.sampled_from([1, 6, 17, 132]),
                          st.sampled_from([53, 80, 81, 8080]), st.sampled_from([0, 3, 8])),
                min_size=4, max_size=12))
def test_kernel_verdicts_equal_the_reference_semantics(harness, rule_list, default, pkts):
    h = harness
    h.apply(*(p.IPSetUpdate(n, t, m) for n, (t, m) in SETS.items()))
    h.apply(p.ActiveProfileUpdate("prof", p.Profile(inbound_rules=(
        p.Rule("allow", protocol=17),))))
    ingress_policy(h, *rule_list, default=default, profiles=("prof",))
    ep = h.state.endpoints[p.WorkloadEndpointID("k8s", "default/a", "eth0")]
    for src, proto_num, port, icmp_t in pkts:
        dst = "10.0.2.2"
        model = Pkt(src, dst, proto_num, 1000 + port, port, icmp_t, 0)
        if proto_num == 1:
            frame = pk.icmp(src, dst, icmp_t, 0)
            model = Pkt(src, dst, 1, 7, 7, icmp_t, 0)
        elif proto_num == 6:
            frame = pk.tcp(src, dst, 1000 + port, port)
        elif proto_num == 17:
            frame = pk.udp(src, dst, 1000 + port, port)
        else:
            frame = pk.sctp(src, dst, 1000 + port, port)
        assert to_a(h, frame) == expected_verdict(h.state, ep, "ingress", model), model


def test_host_endpoint_reverse_path_check_strict_loose_disabled(harness, netns_routes):
    """calico_from_hep (BPFEnforceRPF): Strict wants the route back to the source to leave
    by the arrival interface; Loose any route; Disabled nothing. A source that is one of
    the host's own addresses or unroutable fails both checks."""
    h = harness
    prog = "calico_from_hep"
    on_d1 = pk.tcp("192.0.2.50", "192.0.2.1", 40000, 22)  # d1's subnet: route via d1
    via_d2 = pk.udp("198.51.100.7", "192.0.2.1", 40000, 53)  # routed via d2
    local = pk.udp("192.0.2.1", "192.0.2.1", 40000, 53)  # claims the host's own address
    nowhere = pk.udp("203.0.113.9", "192.0.2.1", 40000, 53)  # no route at all

    def verdicts(iface: str) -> list[str]:
        return [h.run_named(prog, pkt, iface) for pkt in (on_d1, via_d2, local, nowhere)]

    h.apply()  # Strict: the zero value of the config map
    assert verdicts("d1") == ["allow", "deny", "deny", "deny"]
    assert verdicts("d2") == ["deny", "allow", "deny", "deny"]
    assert h.globals()["hep_rpf_dropped"] == 6
    h.apply(p.ConfigUpdate((("BPFEnforceRPF", "Loose"),)))
    assert verdicts("d1") == ["allow", "allow", "deny", "deny"]
    h.apply(p.ConfigUpdate((("BPFEnforceRPF", "Disabled"),)))
    assert verdicts("d1") == ["allow", "allow", "allow", "allow"]
    # not IPv4: left to the host's stack and host endpoint policy (iptables)
    assert h.run_named(prog, pk.arp_request("192.0.2.50", "192.0.2.1"), "d1") == "allow"


def test_fast_path_redirects_allowed_pod_to_local_pod_and_follows_bpf_redirect_to_peer(harness):
    """BPFRedirectToPeer, applied live: Enabled (the default) redirects an allowed packet
    from a pod to another local pod (TC_ACT_REDIRECT, TTL decremented, counted); Disabled
    leaves it to the stack (TC_ACT_OK); a denied packet is dropped either way; a packet
    whose TTL would expire takes the stack."""
    h = harness
    h.apply(ALLOW_ALL, h.endpoint("a", "d1", profiles=("allow-all",)),
            h.endpoint("b", "d2", profiles=("allow-all",)),
            p.RouteUpdate(f"{B}/32", "local_workload", local_workload_iface="d2"))
    to_b = pk.tcp(A, B, 40000, 80)
    run = h.run("from", to_b, "d1")
    assert run.retval == TC_ACT_REDIRECT
    assert run.data_out[14 + 8] == to_b[14 + 8] - 1  # TTL
    assert h.globals()["fastpath_redirected"] == 1
    expiring = bytearray(to_b)
    expiring[14 + 8] = 1
    assert h.run("from", bytes(expiring), "d1").retval == TC_ACT_OK
    assert h.globals()["fastpath_ttl_expired"] == 1
    h.apply(p.ConfigUpdate((("BPFRedirectToPeer", "Disabled"),)))
    assert h.run("from", pk.tcp(A, B, 40001, 80), "d1").retval == TC_ACT_OK
    h.apply(p.ConfigUpdate((("BPFRedirectToPeer", "L2Only"),)))
    assert h.run("from", pk.tcp(A, B, 40002, 80), "d1").retval == TC_ACT_REDIRECT
    h.apply(h.endpoint("a", "d1"))  # no profile: egress denies
    assert h.verdict("from", pk.tcp(A, B, 40003, 80), "d1") == "deny"
    assert h.globals()["fastpath_redirected"] == 2

"""Renderer semantics: each proto.Rule field and action, rendered to chains, programmed into
FakeIptables by the managers, and judged by PacketWalker on packets that must and must not
match. Traffic goes from workload `calia` (10.65.0.1) to workload `calib` (10.65.0.2); the
policy under test is calib's only ingress policy, calia's egress is open (profile)."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import MAX_CHAIN_NAME
from pyfelix.agent.dataplane.iptables.render import RenderError, RuleRenderer
from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    ConfigUpdate,
    IPSetUpdate,
    Policy,
    PolicyID,
    PortRange,
    Profile,
    Rule,
    TierInfo,
)
from tests.dataplane.dp_harness import Harness, endpoint

A_IP, B_IP = "10.65.0.1", "10.65.0.2"
OPEN = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                           outbound_rules=(Rule(action="allow"),)))
SETS = [
    IPSetUpdate("s-a", "net", frozenset({"10.65.0.1/32"})),
    IPSetUpdate("s-b", "net", frozenset({"10.65.0.2/32", "10.70.0.0/16"})),
    IPSetUpdate("n-web", "ip_port", frozenset({"10.65.0.2/32,tcp:8080", "10.65.0.1/32,udp:53"})),
    IPSetUpdate("n-src", "ip_port", frozenset({"10.65.0.1/32,tcp:5555"})),
]


def P(*ports: int | tuple[int, int]) -> tuple[PortRange, ...]:
    return tuple(PortRange(p, p) if isinstance(p, int) else PortRange(*p) for p in ports)


def harness_with_ingress(*rules: Rule, tiers: tuple[TierInfo, ...] | None = None,
                         extra: tuple = ()) -> Harness:
    h = Harness()
    msgs = [*SETS, OPEN, *extra]
    if tiers is None:
        msgs.append(ActivePolicyUpdate(PolicyID("default", "p"), Policy(inbound_rules=rules)))
        tiers = (TierInfo("default", ingress_policies=("p",)),)
    msgs += [endpoint("calia", A_IP, profiles=["open"]),
             endpoint("calib", B_IP, tiers=tiers, profiles=["open"])]
    h.sync(msgs)
    return h


def check(h: Harness, cases: list[tuple[dict, str]]) -> None:
    for packet, expected in cases:
        pkt = {"src": A_IP, "dst": B_IP, **packet}
        assert h.forward("calia", "calib", **pkt) == expected, packet


FIELD_CASES = {
    "protocol": (Rule(action="allow", protocol=6),
                 [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")]),
    "not_protocol": (Rule(action="allow", not_protocol=17),
                     [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")]),
    "src_nets one": (Rule(action="allow", src_nets=("10.65.0.0/30",)),
                     [({}, "ACCEPT"), ({"src": "10.65.1.1"}, "DROP")]),
    "src_nets any of": (Rule(action="allow", src_nets=("10.65.0.1/32", "10.70.0.0/16")),
                        [({}, "ACCEPT"), ({"src": "10.70.3.3"}, "ACCEPT"),
                         ({"src": "10.65.0.5"}, "DROP")]),
    "not_src_nets one": (Rule(action="allow", not_src_nets=("10.65.0.1/32",)),
                         [({}, "DROP"), ({"src": "10.65.0.3"}, "ACCEPT")]),
    "not_src_nets none of": (Rule(action="allow", not_src_nets=("10.65.0.1/32", "10.65.0.3/32")),
                             [({}, "DROP"), ({"src": "10.65.0.3"}, "DROP"),
                              ({"src": "10.65.0.4"}, "ACCEPT")]),
    "src_nets and not_src_nets": (
        Rule(action="allow", src_nets=("10.65.0.0/24",),
             not_src_nets=("10.65.0.1/32", "10.65.0.3/32")),
        [({}, "DROP"), ({"src": "10.65.0.3"}, "DROP"), ({"src": "10.65.0.4"}, "ACCEPT"),
         ({"src": "10.66.0.4"}, "DROP")]),
    "dst_nets any of": (Rule(action="allow", dst_nets=("10.65.0.2/32", "10.80.0.0/16")),
                        [({}, "ACCEPT"), ({"dst": "10.80.1.1"}, "ACCEPT"),
                         ({"dst": "10.65.0.9"}, "DROP")]),
    "not_dst_nets": (Rule(action="allow", not_dst_nets=("10.65.0.2/32",)),
                     [({}, "DROP"), ({"dst": "10.65.0.9"}, "ACCEPT")]),
    "src and dst nets, several each": (
        Rule(action="allow", src_nets=("10.65.0.1/32", "10.65.0.3/32"),
             dst_nets=("10.65.0.2/32", "10.65.0.4/32")),
        [({}, "ACCEPT"), ({"src": "10.65.0.3", "dst": "10.65.0.4"}, "ACCEPT"),
         ({"src": "10.65.0.5"}, "DROP"), ({"dst": "10.65.0.5"}, "DROP")]),
    "src_ip_set_ids": (Rule(action="allow", src_ip_set_ids=("s-a",)),
                       [({}, "ACCEPT"), ({"src": "10.65.0.7"}, "DROP")]),
    "not_src_ip_set_ids": (Rule(action="allow", not_src_ip_set_ids=("s-a",)),
                           [({}, "DROP"), ({"src": "10.65.0.7"}, "ACCEPT")]),
    "dst_ip_set_ids": (Rule(action="allow", dst_ip_set_ids=("s-b",)),
                       [({}, "ACCEPT"), ({"dst": "10.70.9.9"}, "ACCEPT"),
                        ({"dst": "10.65.0.9"}, "DROP")]),
    "not_dst_ip_set_ids": (Rule(action="allow", not_dst_ip_set_ids=("s-b",)),
                           [({}, "DROP"), ({"dst": "10.65.0.9"}, "ACCEPT")]),
    "dst_ports and ranges": (Rule(action="allow", protocol=6, dst_ports=P(80, (1000, 2000))),
                             [({"dport": 80}, "ACCEPT"), ({"dport": 1500}, "ACCEPT"),
                              ({"dport": 2001}, "DROP"), ({"dport": 81}, "DROP"),
                              ({"dport": 80, "proto": 17}, "DROP")]),
    "not_dst_ports": (Rule(action="allow", protocol=6, not_dst_ports=P(80, (90, 99))),
                      [({"dport": 80}, "DROP"), ({"dport": 95}, "DROP"),
                       ({"dport": 81}, "ACCEPT")]),
    "src_ports": (Rule(action="allow", protocol=17, src_ports=P(53)),
                  [({"proto": 17, "sport": 53}, "ACCEPT"), ({"proto": 17, "sport": 54}, "DROP")]),
    "not_src_ports": (Rule(action="allow", protocol=17, not_src_ports=P(53)),
                      [({"proto": 17, "sport": 53}, "DROP"),
                       ({"proto": 17, "sport": 54}, "ACCEPT")]),
    "more than 15 ports (multiport chunks)": (
        Rule(action="allow", protocol=6, dst_ports=P(*range(100, 120), (200, 210))),
        [({"dport": 100}, "ACCEPT"), ({"dport": 119}, "ACCEPT"), ({"dport": 205}, "ACCEPT"),
         ({"dport": 120}, "DROP")]),
    "more than 15 not-ports": (
        Rule(action="allow", protocol=6, not_dst_ports=P(*range(100, 120))),
        [({"dport": 100}, "DROP"), ({"dport": 119}, "DROP"), ({"dport": 121}, "ACCEPT")]),
    "dst named port": (Rule(action="allow", dst_named_port_ip_set_ids=("n-web",)),
                       [({"dport": 8080}, "ACCEPT"), ({"dport": 8081}, "DROP"),
                        ({"dport": 8080, "proto": 17}, "DROP")]),
    "dst ports OR named port": (
        Rule(action="allow", protocol=6, dst_ports=P(80), dst_named_port_ip_set_ids=("n-web",)),
        [({"dport": 80}, "ACCEPT"), ({"dport": 8080}, "ACCEPT"), ({"dport": 81}, "DROP")]),
    "not dst named port": (Rule(action="allow", protocol=6,
                                not_dst_named_port_ip_set_ids=("n-web",)),
                           [({"dport": 8080}, "DROP"), ({"dport": 80}, "ACCEPT")]),
    "src named port": (Rule(action="allow", src_named_port_ip_set_ids=("n-src",)),
                       [({"sport": 5555}, "ACCEPT"), ({"sport": 5556}, "DROP")]),
    "not src named port": (Rule(action="allow", not_src_named_port_ip_set_ids=("n-src",)),
                           [({"sport": 5555}, "DROP"), ({"sport": 5556}, "ACCEPT")]),
    "icmp_type": (Rule(action="allow", protocol=1, icmp_type=8),
                  [({"proto": 1, "icmp_type": 8, "icmp_code": 0}, "ACCEPT"),
                   ({"proto": 1, "icmp_type": 0, "icmp_code": 0}, "DROP"),
                   ({"proto": 6}, "DROP")]),
    "icmp_type and code": (Rule(action="allow", protocol=1, icmp_type=3, icmp_code=1),
                           [({"proto": 1, "icmp_type": 3, "icmp_code": 1}, "ACCEPT"),
                            ({"proto": 1, "icmp_type": 3, "icmp_code": 2}, "DROP")]),
    "not_icmp_type": (Rule(action="allow", protocol=1, not_icmp_type=8),
                      [({"proto": 1, "icmp_type": 8, "icmp_code": 0}, "DROP"),
                       ({"proto": 1, "icmp_type": 0, "icmp_code": 0}, "ACCEPT")]),
    "icmp_type with not type/code": (
        Rule(action="allow", protocol=1, icmp_type=3, not_icmp_type=3, not_icmp_code=3),
        [({"proto": 1, "icmp_type": 3, "icmp_code": 1}, "ACCEPT"),
         ({"proto": 1, "icmp_type": 3, "icmp_code": 3}, "DROP")]),
    "ip_version 6 renders nothing": (Rule(action="allow", ip_version=6), [({}, "DROP")]),
    "IPv6-only nets render nothing": (Rule(action="allow", src_nets=("fd00::/64",)),
                                      [({}, "DROP")]),
    "IPv6 nets dropped from a mixed list": (
        Rule(action="allow", src_nets=("fd00::/64", "10.65.0.1/32")), [({}, "ACCEPT")]),
}


@pytest.mark.parametrize("case", sorted(FIELD_CASES))
def test_rule_field(case: str) -> None:
    rule, cases = FIELD_CASES[case]
    check(harness_with_ingress(rule), cases)


def test_deny_then_allow() -> None:
    h = harness_with_ingress(Rule(action="deny", protocol=17), Rule(action="allow"))
    check(h, [({"proto": 17}, "DROP"), ({"proto": 6}, "ACCEPT")])


def test_deny_with_multiple_nets_uses_marks_and_leaves_no_scratch_bits() -> None:
    h = harness_with_ingress(
        Rule(action="deny", src_nets=("10.65.0.1/32", "10.65.0.3/32"), protocol=6),
        Rule(action="allow"))
    check(h, [({}, "DROP"), ({"src": "10.65.0.3"}, "DROP"), ({"proto": 17}, "ACCEPT"),
              ({"src": "10.65.0.4"}, "ACCEPT")])


def test_log_logs_and_continues() -> None:
    h = harness_with_ingress(Rule(action="log", protocol=6), Rule(action="allow", protocol=6))
    check(h, [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")])
    assert len(h.walker.logged) == 1 and h.walker.logged[0].proto == 6


def _tiers_case(t1_rules, t2_rules, t1_default="deny"):  # type: ignore[no-untyped-def]
    extra = (ActivePolicyUpdate(PolicyID("t1", "p1"), Policy(inbound_rules=t1_rules)),
             ActivePolicyUpdate(PolicyID("t2", "p2"), Policy(inbound_rules=t2_rules)))
    tiers = (TierInfo("t1", ingress_policies=("p1",), default_action=t1_default),
             TierInfo("t2", ingress_policies=("p2",)))
    return harness_with_ingress(tiers=tiers, extra=extra)


def test_pass_goes_to_next_tier() -> None:
    h = _tiers_case((Rule(action="pass", protocol=6), Rule(action="deny")),
                    (Rule(action="allow", protocol=6, dst_ports=P(80)),))
    check(h, [({"dport": 80}, "ACCEPT"), ({"dport": 81}, "DROP"), ({"proto": 17}, "DROP")])


def test_tier_without_match_drops_unless_default_pass() -> None:
    h = _tiers_case((Rule(action="allow", protocol=17),), (Rule(action="allow", protocol=6),))
    check(h, [({"proto": 17}, "ACCEPT"), ({"proto": 6}, "DROP")])
    h = _tiers_case((Rule(action="allow", protocol=17),), (Rule(action="allow", protocol=6),),
                    t1_default="pass")
    check(h, [({"proto": 17}, "ACCEPT"), ({"proto": 6}, "ACCEPT"), ({"proto": 1}, "DROP")])


def test_pass_in_every_tier_reaches_profiles() -> None:
    h = _tiers_case((Rule(action="pass"),), (Rule(action="pass", protocol=6),))
    # t2 passes tcp -> profile "open" allows; udp unmatched in t2 -> drop
    check(h, [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")])


def test_no_policy_uses_profiles_in_order_and_no_profile_drops() -> None:
    deny_udp = ActiveProfileUpdate("deny-udp", Profile(inbound_rules=(
        Rule(action="deny", protocol=17),)))
    h = Harness()
    h.sync([*SETS, OPEN, deny_udp,
            endpoint("calia", A_IP, profiles=["open"]),
            endpoint("calib", B_IP, profiles=["deny-udp", "open"]),
            endpoint("calic", "10.65.0.3")])
    check(h, [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")])
    assert h.forward("calia", "calic", src=A_IP, dst="10.65.0.3") == "DROP"


def test_egress_policy_of_the_sender_applies() -> None:
    h = Harness()
    h.sync([OPEN,
            ActivePolicyUpdate(PolicyID("default", "eg"), Policy(outbound_rules=(
                Rule(action="allow", protocol=6, dst_ports=P(443)),))),
            endpoint("calia", A_IP, profiles=["open"],
                     tiers=[TierInfo("default", egress_policies=("eg",))]),
            endpoint("calib", B_IP, profiles=["open"])])
    check(h, [({"dport": 443}, "ACCEPT"), ({"dport": 80}, "DROP")])


def test_conntrack_established_accepted_invalid_dropped_before_policy() -> None:
    h = harness_with_ingress(Rule(action="deny"))
    check(h, [({}, "DROP"), ({"ctstate": "ESTABLISHED"}, "ACCEPT"),
              ({"ctstate": "RELATED"}, "ACCEPT"), ({"ctstate": "INVALID"}, "DROP")])


def test_unknown_policy_fails_closed_and_inactive_endpoint_drops() -> None:
    h = harness_with_ingress(tiers=(TierInfo("default", ingress_policies=("ghost",)),))
    check(h, [({}, "DROP")])
    h = Harness()
    h.sync([OPEN, endpoint("calia", A_IP, profiles=["open"]),
            endpoint("calib", B_IP, profiles=["open"], state="inactive")])
    check(h, [({}, "DROP")])


def test_unknown_workload_interface_dropped_other_traffic_untouched() -> None:
    h = harness_with_ingress(Rule(action="allow"))
    assert h.forward("calia", "calizzz", src=A_IP, dst="10.65.0.9") == "DROP"
    assert h.forward("eth0", "eth1", src="198.18.0.1", dst="198.18.0.2") == "ACCEPT"


@pytest.mark.parametrize(("action", "expected"), [("Drop", "DROP"), ("Accept", "ACCEPT"),
                                                  ("Return", "ACCEPT")])
def test_workload_to_host_action(action: str, expected: str) -> None:
    h = Harness()
    h.sync([OPEN, ConfigUpdate((("DefaultEndpointToHostAction", action),)),
            endpoint("calia", A_IP, profiles=["open"])])
    assert h.to_host("calia", src=A_IP, dst="10.65.0.254") == expected


def test_workload_to_host_still_applies_egress_policy() -> None:
    h = Harness(endpoint_to_host_action="Accept")
    h.sync([OPEN,
            ActivePolicyUpdate(PolicyID("default", "eg"), Policy(outbound_rules=(
                Rule(action="deny", protocol=17),))),
            endpoint("calia", A_IP, profiles=["open"],
                     tiers=[TierInfo("default", egress_policies=("eg",))])])
    assert h.to_host("calia", src=A_IP, dst="10.65.0.254", proto=17) == "DROP"


# --- invalid input: clear errors, fail closed ------------------------------------------------

INVALID = {
    "ports without port protocol": (Rule(action="allow", dst_ports=P(80)), "ports: need"),
    "port out of range": (Rule(action="allow", protocol=6, dst_ports=P(70000)), "dst_ports"),
    "icmp code without type": (Rule(action="allow", protocol=1, icmp_code=1), "icmp_code"),
    "icmp without icmp protocol": (Rule(action="allow", protocol=6, icmp_type=8), "icmp_type"),
    "bad net": (Rule(action="allow", src_nets=("10.0.0.300/8",)), "src_nets"),
    "bad action": (Rule(action="maybe"), "action"),
    "protocol out of range": (Rule(action="allow", protocol=300), "protocol"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_rule_raises_naming_the_field(case: str) -> None:
    rule, field = INVALID[case]
    with pytest.raises(RenderError, match=field):
        RuleRenderer().render_rule(rule)


def test_invalid_allow_matches_nothing_invalid_deny_drops_everything() -> None:
    h = harness_with_ingress(Rule(action="allow", dst_ports=P(80)), Rule(action="allow",
                                                                          protocol=6))
    check(h, [({"proto": 6}, "ACCEPT"), ({"proto": 17}, "DROP")])
    h = harness_with_ingress(Rule(action="deny", dst_ports=P(80)), Rule(action="allow"))
    check(h, [({"proto": 6}, "DROP"), ({"proto": 17}, "DROP")])


# --- text-level properties -------------------------------------------------------------------


def test_single_rule_renders_to_one_iptables_rule_plus_return() -> None:
    r = RuleRenderer()
    out = r.render_rule(Rule(action="allow", protocol=6, src_nets=("10.0.0.0/8",),
                             dst_ports=P(80, (1000, 2000))))
    assert out == [
        "-p tcp -s 10.0.0.0/8 -m multiport --dports 80,1000:2000 -j MARK --set-xmark "
        "0x10000/0x10000",
        "-m mark --mark 0x10000/0x10000 -j RETURN",
    ]
    assert r.render_rule(Rule(action="deny", protocol=17, not_dst_nets=("1.2.3.4/32",))) == [
        "-p udp ! -d 1.2.3.4/32 -j DROP"]


def test_multiport_chunks_count_ranges_twice() -> None:
    out = RuleRenderer().render_rule(
        Rule(action="deny", protocol=6, not_dst_ports=P(*range(1, 15), (20, 30), (40, 50))))
    assert out == ["-p tcp -m multiport ! --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14 "
                   "-m multiport ! --dports 20:30,40:50 -j DROP"]


def test_chain_names_fit_and_differ_for_long_policy_names() -> None:
    r = RuleRenderer()
    long_a = PolicyID("tier-" + "x" * 60, "ns/" + "p" * 200)
    long_b = PolicyID("tier-" + "x" * 60, "ns/" + "p" * 199 + "q")
    names_a = [c.name for c in r.policy_chains(long_a, Policy())]
    names_b = [c.name for c in r.policy_chains(long_b, Policy())]
    assert all(len(n) <= MAX_CHAIN_NAME for n in names_a + names_b)
    assert set(names_a).isdisjoint(names_b)


def test_chain_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="chain name"):
        Chain("cali-" + "x" * 30)


def test_invalid_renderer_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="DefaultEndpointToHostAction"):
        RuleRenderer(endpoint_to_host_action="Maybe")

"""Rule resolution: model rules -> proto.Rule with IP-set ids (RuleScanner's conversion)."""

from __future__ import annotations

from calc_testlib import gnp, named, np, profile, sel

from pyfelix.agent import proto
from pyfelix.agent.calc.rule_scanner import DENY_ALL, convert_policy, convert_profile
from pyfelix.agent.model import parse_resource


def _policy(doc: dict) -> tuple[proto.Policy, dict]:
    return convert_policy(parse_resource(doc))


def test_ports_protocols_icmp_and_actions() -> None:
    policy, ip_sets = _policy(gnp("p", "all()", ingress=[
        {"action": "Allow", "protocol": "TCP", "ipVersion": 4,
         "source": {"nets": ["10.0.0.0/8"], "notNets": ["10.1.0.0/16"], "ports": ["1000:2000"]},
         "destination": {"ports": [80, 443], "notPorts": [8080]}},
        {"action": "Pass", "protocol": "ICMP", "icmp": {"type": 8, "code": 0},
         "notICMP": {"type": 3}},
        {"action": "Deny", "notProtocol": "UDP"},
        {"action": "Log"},
    ]))
    allow, passed, deny, log = policy.inbound_rules
    assert (allow.action, allow.protocol, allow.ip_version) == ("allow", 6, 4)
    assert allow.src_nets == ("10.0.0.0/8",) and allow.not_src_nets == ("10.1.0.0/16",)
    assert allow.src_ports == (proto.PortRange(1000, 2000),)
    assert allow.dst_ports == (proto.PortRange(80, 80), proto.PortRange(443, 443))
    assert allow.not_dst_ports == (proto.PortRange(8080, 8080),)
    assert (passed.action, passed.protocol, passed.icmp_type, passed.icmp_code) == (
        "pass", 1, 8, 0)
    assert (passed.not_icmp_type, passed.not_icmp_code) == (3, None)
    assert (deny.action, deny.not_protocol) == ("deny", 17)
    assert log.action == "log"
    assert ip_sets == {}
    assert policy.outbound_rules == ()


def test_selector_and_not_selector_sets() -> None:
    policy, ip_sets = _policy(gnp("p", "all()", ingress=[
        {"action": "Allow", "source": {"selector": "a == 'x'", "notSelector": "b == 'y'"}},
        {"action": "Allow", "source": {"notSelector": "b == 'y'"}},
    ]))
    folded, negated = policy.inbound_rules
    # with a positive selector the negation is folded into it (one set)
    assert folded.src_ip_set_ids == (sel("a == 'x' && b != 'y'"),)
    assert folded.not_src_ip_set_ids == ()
    # alone it stays a negated set, used as written
    assert negated.not_src_ip_set_ids == (sel("b == 'y'"),)
    assert negated.src_ip_set_ids == ()
    assert set(ip_sets) == {sel("a == 'x' && b != 'y'"), sel("b == 'y'")}


def test_namespaced_policy_rules_stay_in_their_namespace() -> None:
    policy, _ = _policy(np("shop", "p", "all()", egress=[
        {"action": "Allow", "destination": {"selector": "app == 'db'"}},
        {"action": "Allow", "destination": {"notSelector": "app == 'db'"}},
        {"action": "Allow", "destination": {"selector": "app == 'db'",
                                            "namespaceSelector": "team == 'a'"}},
        {"action": "Allow", "destination": {"nets": ["192.0.2.0/24"]}},
    ]))
    same_ns, only_not, other_ns, nets_only = policy.outbound_rules
    assert same_ns.dst_ip_set_ids == (
        sel("projectcalico.org/namespace == 'shop' && app == 'db'"),)
    # notSelector alone: the namespace still applies, as a positive set (Calico)
    assert only_not.dst_ip_set_ids == (
        sel("projectcalico.org/namespace == 'shop' && app != 'db'"),)
    assert other_ns.dst_ip_set_ids == (sel("pcns.team == 'a' && app == 'db'"),)
    assert nets_only.dst_ip_set_ids == () and nets_only.dst_nets == ("192.0.2.0/24",)
    assert policy.namespace == "shop"


def test_named_ports() -> None:
    policy, ip_sets = _policy(gnp("p", "all()", ingress=[
        {"action": "Allow", "protocol": "TCP",
         "source": {"selector": "role == 'web'"}, "destination": {"ports": ["http"]}},
        {"action": "Allow", "protocol": "UDP",
         "source": {"selector": "role == 'web'", "ports": ["dns", 53]}},
        {"action": "Allow", "protocol": "TCP", "destination": {"notPorts": ["admin"]}},
    ]))
    only_named, mixed, negated = policy.inbound_rules
    assert only_named.dst_named_port_ip_set_ids == (named("all()", "tcp", "http"),)
    assert only_named.src_ip_set_ids == (sel("role == 'web'"),)
    # named and numeric ports on one side: the selector set stays, for the numeric ports
    assert mixed.src_named_port_ip_set_ids == (named("role == 'web'", "udp", "dns"),)
    assert mixed.src_ports == (proto.PortRange(53, 53),)
    assert mixed.src_ip_set_ids == (sel("role == 'web'"),)
    assert negated.not_dst_named_port_ip_set_ids == (named("all()", "tcp", "admin"),)
    assert {s.type for s in ip_sets.values()} == {"net", "ip_port"}
    assert ip_sets[named("all()", "tcp", "http")].named_port.protocol_name == "tcp"


def test_only_named_ports_drop_the_selector_set() -> None:
    policy, ip_sets = _policy(gnp("p", "all()", ingress=[
        {"action": "Allow", "protocol": "TCP",
         "destination": {"selector": "role == 'db'", "ports": ["pg"]}}]))
    (rule,) = policy.inbound_rules
    assert rule.dst_ip_set_ids == ()
    assert rule.dst_named_port_ip_set_ids == (named("role == 'db'", "tcp", "pg"),)
    assert set(ip_sets) == {named("role == 'db'", "tcp", "pg")}


def test_service_accounts() -> None:
    policy, _ = _policy(np("shop", "p", "all()", ingress=[
        {"action": "Allow", "source": {"serviceAccounts": {"names": ["a", "b"],
                                                           "selector": "tier == 'x'"}}}]))
    (rule,) = policy.inbound_rules
    assert rule.src_ip_set_ids == (sel(
        "projectcalico.org/namespace == 'shop' && "
        "projectcalico.org/serviceaccount in {'a', 'b'} && pcsa.tier == 'x'"),)


def test_rule_ids_are_stable_and_distinct() -> None:
    doc = gnp("p", "all()", ingress=[ALLOW_RULE, ALLOW_RULE], egress=[ALLOW_RULE])
    first, _ = _policy(doc)
    again, _ = _policy(doc)
    ids = [r.rule_id for r in first.inbound_rules + first.outbound_rules]
    assert ids == [r.rule_id for r in again.inbound_rules + again.outbound_rules]
    assert len(set(ids)) == 3 and all(ids)
    other, _ = _policy(gnp("q", "all()", ingress=[ALLOW_RULE]))
    assert other.inbound_rules[0].rule_id != ids[0]


ALLOW_RULE = {"action": "Allow"}


def test_profiles_and_missing_profiles() -> None:
    converted, ip_sets = convert_profile("p", parse_resource(profile(
        "p", ingress=[{"action": "Allow", "source": {"selector": "a == 'b'"}}])))
    assert converted.inbound_rules[0].src_ip_set_ids == (sel("a == 'b'"),)
    assert set(ip_sets) == {sel("a == 'b'")}
    assert convert_profile("gone", None) == (DENY_ALL, {})
    assert [r.action for r in DENY_ALL.inbound_rules + DENY_ALL.outbound_rules] == [
        "deny", "deny"]


def test_policy_flags() -> None:
    policy, _ = _policy(gnp("p", "all()", doNotTrack=True, applyOnForward=True,
                            ingress=[ALLOW_RULE]))
    assert (policy.untracked, policy.pre_dnat, policy.apply_on_forward) == (True, False, True)

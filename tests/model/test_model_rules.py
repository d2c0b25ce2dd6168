"""Every Calico rule field, policy order, types defaulting and tiers."""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.agent.model import (
    EntityRule,
    ICMPMatch,
    NetworkPolicy,
    Port,
    Profile,
    Rule,
    ServiceAccountMatch,
    ValidationError,
    parse_resource,
)


def gnp(spec: dict[str, Any], name: str = "p") -> NetworkPolicy:
    policy = parse_resource({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
                             "metadata": {"name": name}, "spec": spec})
    assert isinstance(policy, NetworkPolicy)
    return policy


def one_rule(rule: dict[str, Any]) -> Rule:
    return gnp({"ingress": [rule]}).ingress[0]


@pytest.mark.parametrize("action", ["Allow", "Deny", "Log", "Pass"])
def test_actions(action: str) -> None:
    assert one_rule({"action": action}) == Rule(action)


@pytest.mark.parametrize(("written", "number"), [
    ("TCP", 6), ("tcp", 6), ("UDP", 17), ("udp", 17), ("ICMP", 1), ("icmp", 1),
    ("ICMPv6", 58), ("icmpv6", 58), ("SCTP", 132), ("sctp", 132), ("UDPLite", 136),
    ("udplite", 136), (1, 1), (47, 47), (255, 255), ("50", 50),
])
def test_protocol_names_and_numbers(written: object, number: int) -> None:
    assert one_rule({"action": "Allow", "protocol": written}).protocol == number
    assert one_rule({"action": "Allow", "notProtocol": written}).not_protocol == number


@pytest.mark.parametrize("bad", [0, 256, -1, "GRE", "", True, 6.0, [6]])
def test_bad_protocols_are_rejected(bad: object) -> None:
    with pytest.raises(ValidationError) as err:
        one_rule({"action": "Allow", "protocol": bad})
    assert err.value.field == "spec.ingress[0].protocol"


def test_icmp_and_not_icmp() -> None:
    rule = one_rule({"action": "Allow", "protocol": "ICMP", "icmp": {"type": 8, "code": 0},
                     "notICMP": {"type": 3}})
    assert rule.icmp == ICMPMatch(8, 0) and rule.not_icmp == ICMPMatch(3, None)
    v6 = one_rule({"action": "Deny", "protocol": "ICMPv6", "ipVersion": 6,
                   "icmp": {"type": 128}})
    assert v6.icmp == ICMPMatch(128) and v6.ip_version == 6


def test_nets_and_not_nets_are_normalised() -> None:
    rule = one_rule({"action": "Allow", "source": {"nets": ["10.1.2.3/8", "192.0.2.1"],
                                                   "notNets": ["10.9.0.0/16"]},
                     "destination": {"nets": ["10.0.0.0/8"], "notNets": ["10.0.0.1"]}})
    assert rule.source.nets == ("10.0.0.0/8", "192.0.2.1/32")
    assert rule.source.not_nets == ("10.9.0.0/16",)
    assert rule.destination.not_nets == ("10.0.0.1/32",)


def test_selectors_namespace_selector_and_service_accounts() -> None:
    rule = one_rule({"action": "Allow", "source": {
        "selector": "app == 'web'", "notSelector": "has(quarantine)",
        "namespaceSelector": "team in {'a', 'b'}",
        "serviceAccounts": {"names": ["sa1", "sa2"], "selector": "tier == 'fe'"}}})
    assert rule.source == EntityRule(
        selector="app == 'web'", not_selector="has(quarantine)",
        namespace_selector="team in {'a', 'b'}",
        service_accounts=ServiceAccountMatch(("sa1", "sa2"), "tier == 'fe'"))


def test_ports_numbers_ranges_and_names() -> None:
    rule = one_rule({"action": "Allow", "protocol": "TCP",
                     "source": {"ports": ["1024:65535"]},
                     "destination": {"ports": [80, "443", "8000:8080", "http-alt"],
                                     "notPorts": [8001, "admin"]}})
    assert rule.destination.ports == (Port(80, 80), Port(443, 443), Port(8000, 8080),
                                      Port(name="http-alt"))
    assert rule.destination.not_ports == (Port(8001, 8001), Port(name="admin"))
    assert rule.source.ports == (Port(1024, 65535),)
    assert rule.destination.named_ports() == (Port(name="http-alt"),)
    assert [str(p) for p in rule.destination.ports] == ["80", "443", "8000:8080", "http-alt"]


@pytest.mark.parametrize("protocol", ["TCP", "UDP", "SCTP", "UDPLite", 6])
def test_ports_with_every_protocol_that_has_ports(protocol: object) -> None:
    rule = one_rule({"action": "Allow", "protocol": protocol, "destination": {"ports": [53]}})
    assert rule.destination.ports == (Port(53, 53),)


@pytest.mark.parametrize(("rules", "types", "expected"), [
    ({}, None, ("Ingress",)),
    ({"ingress": [{"action": "Allow"}]}, None, ("Ingress",)),
    ({"egress": [{"action": "Allow"}]}, None, ("Egress",)),
    ({"ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}, None,
     ("Ingress", "Egress")),
    ({"ingress": [{"action": "Allow"}]}, ["Egress"], ("Egress",)),
    ({}, ["Egress", "Ingress"], ("Egress", "Ingress")),
    ({}, [], ("Ingress",)),
])
def test_types_default_as_calico_defaults_them(rules: dict[str, Any], types: list[str] | None,
                                              expected: tuple[str, ...]) -> None:
    spec = dict(rules)
    if types is not None:
        spec["types"] = types
    assert gnp(spec).types == expected


def test_order_is_a_number_and_missing_order_is_none() -> None:
    assert gnp({"order": 10}).order == 10.0
    assert gnp({"order": 0.5}).order == 0.5
    assert gnp({"order": -3}).order == -3.0
    assert gnp({}).order is None


def test_tiers_need_the_tier_prefix_in_the_name() -> None:
    assert gnp({"tier": "security"}, name="security.p").tier == "security"
    assert gnp({}).tier == "default"
    with pytest.raises(ValidationError) as err:
        gnp({"tier": "security"}, name="p")
    assert err.value.field == "spec.tier"


def test_profile_rules_use_the_same_rule_parser() -> None:
    profile = parse_resource({"apiVersion": "projectcalico.org/v3", "kind": "Profile",
                              "metadata": {"name": "p"},
                              "spec": {"ingress": [{"action": "Deny", "protocol": "TCP",
                                                    "destination": {"ports": [22]}}]}})
    assert isinstance(profile, Profile)
    assert profile.ingress[0].destination.ports == (Port(22, 22),)


def test_rule_metadata_is_accepted_and_http_rejected() -> None:
    one_rule({"action": "Allow", "metadata": {"annotations": {"why": "ticket-42"}}})
    with pytest.raises(ValidationError) as err:
        one_rule({"action": "Allow", "http": {"methods": ["GET"]}})
    assert err.value.field == "spec.ingress[0].http"

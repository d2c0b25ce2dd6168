"""BGPFilter: rules typed and checked as Calico checks them; a bad field is named."""

from __future__ import annotations

import pytest

from pyfelix.agent.model import BGPFilter, BGPFilterRule, ValidationError, parse_resource
from tests.model.examples import by_kind, load


def _filter(spec: str) -> dict:
    return load("{apiVersion: projectcalico.org/v3, kind: BGPFilter, metadata: {name: f}, "
                f"spec: {spec}}}")


def test_example_rules_and_prefix_length_defaults() -> None:
    bgp_filter = parse_resource(by_kind("BGPFilter"))
    assert isinstance(bgp_filter, BGPFilter)
    assert bgp_filter.import_v4 == (
        BGPFilterRule("Accept", "44.0.0.0/16", "In", (20, 32)),
        BGPFilterRule("Reject", source="RemotePeers", interface="eth*"))
    assert bgp_filter.export_v6 == (BGPFilterRule("Reject", "fd00:9::/64", "NotEqual"),)
    assert bgp_filter.export_v4 == bgp_filter.import_v6 == ()
    # min below the CIDR's own length is raised to it; max defaults to the family's bits
    six = parse_resource(_filter("{importV6: [{action: Accept, matchOperator: NotIn, "
                                 "cidr: 'fd00::/48', prefixLength: {min: 8, max: 64}}]}"))
    assert six.import_v6[0].prefix_length == (48, 64)


@pytest.mark.parametrize(("spec", "field", "message"), [
    ("{importV4: [{cidr: 10.0.0.0/8, matchOperator: In}]}", "spec.importV4[0].action",
     "required"),
    ("{importV4: [{action: Drop}]}", "spec.importV4[0].action", "not one of Accept, Reject"),
    # the missing one of the pair is named
    ("{exportV4: [{action: Accept, cidr: 10.0.0.0/8}]}", "spec.exportV4[0].matchOperator",
     "both be set"),
    ("{exportV4: [{action: Accept, matchOperator: In}]}", "spec.exportV4[0].cidr",
     "both be set"),
    ("{exportV4: [{action: Accept, matchOperator: Within, cidr: 10.0.0.0/8}]}",
     "spec.exportV4[0].matchOperator", "not one of"),
    ("{exportV4: [{action: Accept, matchOperator: In, cidr: 'fd00::/8'}]}",
     "spec.exportV4[0].cidr", "not an IPv4 CIDR"),
    ("{exportV6: [{action: Accept, matchOperator: In, cidr: 10.0.0.0/8}]}",
     "spec.exportV6[0].cidr", "not an IPv6 CIDR"),
    ("{exportV4: [{action: Accept, prefixLength: {min: 24}}]}",
     "spec.exportV4[0].prefixLength", "cidr is required"),
    ("{exportV4: [{action: Accept, matchOperator: Equal, cidr: 10.0.0.0/8, "
     "prefixLength: {min: 24}}]}", "spec.exportV4[0].prefixLength", "In or NotIn"),
    ("{exportV4: [{action: Accept, matchOperator: In, cidr: 10.0.0.0/8, "
     "prefixLength: {max: 33}}]}", "spec.exportV4[0].prefixLength.max", "out of range"),
    ("{exportV4: [{action: Accept, matchOperator: In, cidr: 10.0.0.0/16, "
     "prefixLength: {max: 8}}]}", "spec.exportV4[0].prefixLength", "empty range"),
    ("{exportV4: [{action: Accept, source: Anywhere}]}", "spec.exportV4[0].source",
     "not one of RemotePeers"),
    ("{exportV4: [{action: Accept, interface: 'eth0\"; accept; #'}]}",
     "spec.exportV4[0].interface", "not an interface name"),
    ("{exportV4: [{action: Accept, interface: averyveryverylongname}]}",
     "spec.exportV4[0].interface", "not an interface name"),
    ("{exportV4: [{action: Accept, communities: {values: ['65000:1']}}]}",
     "spec.exportV4[0].communities", "unknown field"),
    ("{exportV5: []}", "spec.exportV5", "unknown field"),
])
def test_bad_rules_name_the_field(spec: str, field: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_resource(_filter(spec))
    assert info.value.field == field
    assert message in info.value.message


def test_peer_filter_names_are_checked() -> None:
    with pytest.raises(ValidationError) as info:
        parse_resource(load("{apiVersion: projectcalico.org/v3, kind: BGPPeer, metadata: "
                            "{name: p}, spec: {peerIP: 198.18.0.9, asNumber: 65000, "
                            "filters: [ok, 'Not_A_Name']}}"))
    assert info.value.field == "spec.filters[1]"

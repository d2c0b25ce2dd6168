"""Malformed documents: each gets a ValidationError naming kind, namespace/name and field path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pyfelix.agent.model import ValidationError, parse_resource
from tests.model.examples import by_kind

Doc = dict[str, Any]


def edit(kind: str, change: Callable[[Doc], object], name: str | None = None) -> Doc:
    doc = by_kind(kind, name)
    change(doc)
    return doc


def spec_of(doc: Doc) -> Doc:
    spec = doc["spec"]
    assert isinstance(spec, dict)
    return spec


def gnp(spec: Doc) -> Doc:
    return {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "bad"}, "spec": spec}


def rule(**fields: Any) -> Doc:
    return gnp({"ingress": [{"action": "Allow", **fields}]})


# (id, document, expected resource name, expected field path, words the message contains)
CASES: list[tuple[str, Any, str, str, str]] = [
    ("not-a-mapping", ["x"], "document(?)", "", "not a mapping"),
    ("no-kind", {"metadata": {"name": "x"}}, "?(x)", "kind", "missing"),
    ("no-metadata", {"kind": "Tier"}, "Tier(?)", "metadata", "missing"),
    ("no-name", {"kind": "Tier", "metadata": {}}, "Tier(?)", "metadata.name", "missing"),
    ("unknown-kind", {"apiVersion": "projectcalico.org/v3", "kind": "Frobnicator",
                      "metadata": {"name": "x"}}, "Frobnicator(x)", "kind", "unknown kind"),
    ("wrong-api-version", edit("Tier", lambda d: d.update(apiVersion="v1")), "Tier(security)",
     "apiVersion", "projectcalico.org/v3"),
    ("unknown-top-level-field", edit("Tier", lambda d: d.update(sepc={})), "Tier(security)",
     "sepc", "unknown field"),
    ("unknown-spec-field", edit("NetworkPolicy", lambda d: spec_of(d).update(selectr="a")),
     "NetworkPolicy(prod/api-ingress)", "spec.selectr", "unknown field"),
    ("unknown-metadata-field", edit("Tier", lambda d: d["metadata"].update(nmae="x")),
     "Tier(security)", "metadata.nmae", "unknown field"),
    ("bad-name", edit("GlobalNetworkSet", lambda d: d["metadata"].update(name="Bad_Name")),
     "GlobalNetworkSet(Bad_Name)", "metadata.name", "not a valid name"),
    ("bad-label-key", edit("NetworkSet", lambda d: d["metadata"]["labels"].update(
        {"bad key": "x"})), "NetworkSet(prod/partners)", "metadata.labels.bad key",
     "invalid label key"),
    ("bad-label-value", edit("Namespace", lambda d: d["metadata"]["labels"].update(
        env="a b")), "Namespace(prod)", "metadata.labels.env", "invalid label value"),
    ("unknown-rule-field", rule(protcol="TCP"), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].protcol", "unknown field"),
    ("unknown-entity-field", rule(source={"selectr": "a == 'b'"}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].source.selectr", "unknown field"),
    ("unknown-icmp-field", rule(protocol="ICMP", icmp={"typ": 8}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].icmp.typ", "unknown field"),
    ("non-string-field-name", gnp({1: "x"}), "GlobalNetworkPolicy(bad)", "spec",
     "field name 1 is not a string"),
    ("bad-action", edit("NetworkPolicy", lambda d: spec_of(d)["ingress"][1].update(
        action="Accept")), "NetworkPolicy(prod/api-ingress)", "spec.ingress[1].action",
     "not one of Allow, Deny, Log, Pass"),
    ("missing-action", rule(action=None), "GlobalNetworkPolicy(bad)", "spec.ingress[0].action",
     "required"),
    ("bad-protocol", rule(protocol="GRE"), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].protocol", "unknown protocol"),
    ("ports-without-protocol", rule(destination={"ports": [80]}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].destination.ports", "need protocol"),
    ("not-ports-with-icmp", rule(protocol="ICMP", source={"notPorts": [80]}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].source.notPorts", "need protocol"),
    ("port-out-of-range", edit("GlobalNetworkPolicy", lambda d: spec_of(d)["egress"][1][
        "destination"].update(ports=[70000]), "security.allow-dns"),
     "GlobalNetworkPolicy(security.allow-dns)", "spec.egress[1].destination.ports[0]",
     "out of range"),
    ("port-range-reversed", rule(protocol="TCP", destination={"ports": ["90:80"]}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].destination.ports[0]", "invalid port range"),
    ("bad-port-name", rule(protocol="TCP", destination={"ports": ["HTTP_8080"]}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].destination.ports[0]", "invalid port"),
    ("icmp-without-icmp-protocol", rule(protocol="TCP", icmp={"type": 8}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].icmp", "ICMP"),
    ("icmp-code-without-type", rule(protocol="ICMP", icmp={"code": 1}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].icmp.code", "needs an ICMP type"),
    ("icmp-type-out-of-range", rule(protocol="ICMP", notICMP={"type": 255}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].notICMP.type", "out of range"),
    ("icmpv6-with-ipv4", rule(protocol="ICMPv6", ipVersion=4), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].ipVersion", "must be 6"),
    ("bad-cidr", rule(source={"nets": ["10.0.0.0/33"]}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].source.nets[0]", "invalid CIDR"),
    ("mixed-ip-versions", rule(source={"nets": ["10.0.0.0/8"]},
                               destination={"notNets": ["fd00::/8"]}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].destination.notNets", "mix IPv4 and IPv6"),
    ("bad-selector", rule(source={"selector": "app = 'x'"}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].source.selector", "invalid selector"),
    ("bad-policy-selector", gnp({"selector": "has(x"}), "GlobalNetworkPolicy(bad)",
     "spec.selector", "invalid selector"),
    ("global-in-selector", rule(source={"selector": "global()"}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0].source.selector", "global()"),
    ("duplicate-type", gnp({"types": ["Ingress", "Ingress"]}), "GlobalNetworkPolicy(bad)",
     "spec.types[1]", "more than once"),
    ("bad-type", gnp({"types": ["Inbound"]}), "GlobalNetworkPolicy(bad)", "spec.types[0]",
     "not Ingress or Egress"),
    ("order-not-a-number", gnp({"order": "first"}), "GlobalNetworkPolicy(bad)", "spec.order",
     "expected a number"),
    ("order-infinite", gnp({"order": float("inf")}), "GlobalNetworkPolicy(bad)", "spec.order",
     "finite"),
    ("pre-dnat-with-egress", gnp({"preDNAT": True, "applyOnForward": True,
                                  "egress": [{"action": "Allow"}]}),
     "GlobalNetworkPolicy(bad)", "spec.egress", "preDNAT"),
    ("namespaced-do-not-track", edit("NetworkPolicy", lambda d: spec_of(d).update(
        doNotTrack=True)), "NetworkPolicy(prod/api-ingress)", "spec.doNotTrack",
     "unknown field"),
    ("rules-not-a-list", gnp({"ingress": {"action": "Allow"}}), "GlobalNetworkPolicy(bad)",
     "spec.ingress", "expected a list"),
    ("rule-not-a-mapping", gnp({"ingress": ["Allow"]}), "GlobalNetworkPolicy(bad)",
     "spec.ingress[0]", "expected a mapping"),
    ("services-unsupported", rule(destination={"services": {"name": "x"}}),
     "GlobalNetworkPolicy(bad)", "spec.ingress[0].destination.services", "not supported"),
    ("wep-network-too-wide", edit("WorkloadEndpoint", lambda d: spec_of(d).update(
        ipNetworks=["10.65.0.0/24"])), "WorkloadEndpoint(prod/node1-k8s-legacy--vm-eth0)",
     "spec.ipNetworks[0]", "several addresses"),
    ("wep-missing-node", edit("WorkloadEndpoint", lambda d: spec_of(d).pop("node")),
     "WorkloadEndpoint(prod/node1-k8s-legacy--vm-eth0)", "spec.node", "required"),
    ("hep-without-interface", edit("HostEndpoint", lambda d: spec_of(d).update(
        interfaceName=None, expectedIPs=[])), "HostEndpoint(node1-eth0)",
     "spec.interfaceName", "interfaceName or expectedIPs"),
    ("pool-not-strict", edit("IPPool", lambda d: spec_of(d).update(cidr="10.65.1.0/16"),
                             "pods-v4"), "IPPool(pods-v4)", "spec.cidr", "strictly masked"),
    ("pool-both-encaps", edit("IPPool", lambda d: spec_of(d).update(ipipMode="Always"),
                              "pods-v4"), "IPPool(pods-v4)", "spec.vxlanMode", "cannot both"),
    ("peer-without-as", edit("BGPPeer", lambda d: spec_of(d).pop("asNumber"), "rack1-tor"),
     "BGPPeer(rack1-tor)", "spec.asNumber", "required with peerIP"),
    ("node-bad-address", edit("Node", lambda d: spec_of(d)["bgp"].update(
        ipv4Address="fd00::1/64"), "node1"), "Node(node1)", "spec.bgp.ipv4Address",
     "not an IPv4"),
    ("pod-bad-ip", edit("Pod", lambda d: d["status"]["podIPs"][0].update(ip="10.65.0.999")),
     "Pod(prod/api-7d9f8-abcde)", "status.podIPs[0].ip", "invalid IP"),
    ("pod-bad-port-protocol", edit("Pod", lambda d: d["spec"]["containers"][0]["ports"][0]
                                   .update(protocol="ICMP")),
     "Pod(prod/api-7d9f8-abcde)", "spec.containers[0].ports[0].protocol", "TCP, UDP or SCTP"),
    ("knp-bad-operator", edit("KubernetesNetworkPolicy", lambda d: spec_of(d)["podSelector"][
        "matchExpressions"][0].update(operator="Like")),
     "KubernetesNetworkPolicy(db/db-from-web)", "spec.podSelector.matchExpressions[0].operator",
     "not one of In, NotIn"),
    ("knp-except-outside-cidr", edit("KubernetesNetworkPolicy", lambda d: spec_of(d)[
        "ingress"][0]["from"][1]["ipBlock"].update({"except": ["10.0.0.0/8"]})),
     "KubernetesNetworkPolicy(db/db-from-web)", "spec.ingress[0].from[1].ipBlock.except[0]",
     "strictly inside"),
    ("knp-end-port-with-name", edit("KubernetesNetworkPolicy", lambda d: spec_of(d)[
        "ingress"][0]["ports"][0].update(endPort=6000)),
     "KubernetesNetworkPolicy(db/db-from-web)", "spec.ingress[0].ports[0].endPort",
     "numeric port"),
    ("knp-empty-peer", edit("KubernetesNetworkPolicy", lambda d: spec_of(d)["egress"][0].update(
        to=[{}])), "KubernetesNetworkPolicy(db/db-from-web)", "spec.egress[0].to[0]",
     "needs podSelector"),
    ("knp-unknown-field", edit("KubernetesNetworkPolicy", lambda d: spec_of(d)["ingress"][0]
                               .update(form=[])),
     "KubernetesNetworkPolicy(db/db-from-web)", "spec.ingress[0].form", "unknown field"),
]


@pytest.mark.parametrize(("doc", "resource", "field", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_document_error_names_resource_and_field(doc: Any, resource: str,
                                                           field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_resource(doc)
    assert err.value.resource == resource
    assert err.value.field == field
    assert words in err.value.message
    text = str(err.value)
    assert text.startswith(resource) and field in text


def test_the_table_is_big_enough_and_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


def test_every_case_differs_from_a_valid_document() -> None:
    # Sanity: the examples the table edits are themselves valid.
    for kind, name in [("Tier", None), ("NetworkPolicy", None), ("WorkloadEndpoint", None),
                       ("HostEndpoint", None), ("IPPool", "pods-v4"), ("BGPPeer", "rack1-tor"),
                       ("Node", "node1"), ("Pod", None), ("KubernetesNetworkPolicy", None),
                       ("GlobalNetworkPolicy", "security.allow-dns"), ("Namespace", None),
                       ("NetworkSet", None), ("GlobalNetworkSet", None)]:
        parse_resource(by_kind(kind, name))

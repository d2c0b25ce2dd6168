"""Every validated name and name-like field, with a trailing newline and other bad values.

Regexes checked with `re.match` and `^...$` accept a trailing newline (`$` matches before
it), so `peer1\\n` used to pass as a BGPPeer name and then break every bird.conf it was
written into. Each case below takes a realistic example document (tests/model/examples.py),
puts a value into one field and parses it:
- a "name" field must REJECT every bad value, with an error naming that field;
- an address or number field may accept surrounding white space but must normalise it
  away: no newline may survive into the parsed resource.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pyfelix.agent.model import Node, ValidationError, parse_resource
from tests.model.examples import by_kind

Setter = Callable[[dict[str, Any], str], None]


def at(*path: Any) -> Setter:
    """Set the value at `path` (keys and list indexes) of the document."""
    def put(doc: dict[str, Any], value: str) -> None:
        node: Any = doc
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
    return put


def key_at(*path: Any, old: str) -> Setter:
    """Rename the key `old` of the mapping at `path` to the value (label keys...)."""
    def put(doc: dict[str, Any], value: str) -> None:
        node: Any = doc
        for step in path:
            node = node.setdefault(step, {})
        node[value] = node.pop(old)
    return put


def named(kind: str, name: str | None = None, *, namespace: str | None = None,
          tier: str | None = None) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        doc = by_kind(kind, name)
        if namespace is not None:
            doc["metadata"]["namespace"] = namespace
        if tier is not None:
            doc["spec"]["tier"] = tier
        return doc
    return make


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], dict[str, Any]]
    put: Setter
    good: str
    field: str  # what the error must name
    bad: tuple[str, ...] = ()
    reject: bool = True  # False: white space may be accepted, but only normalised away


DNS_SUBDOMAIN_BAD = ("UPPER", "a_b", "-lead", "trail-", "a..b", "a" * 254, "a b", "")
DNS_LABEL_BAD = ("UPPER", "a.b", "-lead", "a" * 64, "a_b")
PORT_NAME_BAD = ("HTTP", "a--b", "1234", "-ab", "abcdefghijklmnop", "a b")
IFACE_BAD = (".", "..", "a/b", "a:b", "a b", "x" * 16, "tab\there", "é")
DURATION_BAD = ("2 m", "s", "10", "10x")
LABEL_KEY_BAD = ("-app", "a b", "Pre/fix/x", "/app", "x" * 64)
LABEL_VALUE_BAD = ("-web", "a b", "x" * 64, "a/b")

CASES = [
    # metadata, per kind's name rule
    Case("GlobalNetworkPolicy name", named("GlobalNetworkPolicy", "host-protect"),
         at("metadata", "name"), "host-protect", "metadata.name",
         ("UPPER", "a_b", "a.b.c")),
    Case("NetworkPolicy name", named("NetworkPolicy"), at("metadata", "name"), "api-ingress",
         "metadata.name", ("a.b.c", "UPPER")),
    Case("Tier name", named("Tier"), at("metadata", "name"), "security", "metadata.name",
         DNS_LABEL_BAD),
    Case("Namespace name", named("Namespace"), at("metadata", "name"), "prod",
         "metadata.name", DNS_LABEL_BAD),
    Case("metadata.namespace", named("NetworkPolicy"), at("metadata", "namespace"), "prod",
         "metadata.namespace", DNS_LABEL_BAD),
    *(Case(f"{kind} name", named(kind, name), at("metadata", "name"), good, "metadata.name",
           DNS_SUBDOMAIN_BAD)
      for kind, name, good in [
          ("BGPPeer", "rack1-tor", "peer1"), ("Node", "node1", "node7"),
          ("IPPool", "pods-v4", "pool-1"), ("HostEndpoint", None, "node1-eth0"),
          ("GlobalNetworkSet", None, "cloud-metadata"), ("Profile", None, "host-defaults"),
          ("BGPConfiguration", None, "default"), ("FelixConfiguration", None, "default"),
          ("WorkloadEndpoint", None, "node1-k8s-legacy--vm-eth0"),
          ("Pod", None, "api-7d9f8-abcde"), ("ServiceAccount", None, "api"),
          ("KubernetesNetworkPolicy", None, "db-from-web"),
      ]),
    Case("label key", named("GlobalNetworkSet"), key_at("metadata", "labels", old="kind"),
         "kind", "metadata.labels", LABEL_KEY_BAD),
    Case("label value", named("GlobalNetworkSet"), at("metadata", "labels", "kind"),
         "metadata-service", "metadata.labels.kind", LABEL_VALUE_BAD),
    Case("annotation key", named("Pod"),
         key_at("metadata", "annotations", old="cni.projectcalico.org/containerID"),
         "cni.projectcalico.org/containerID", "metadata.annotations", ("a b", "/x")),
    Case("profile labelsToApply key", named("Profile"), key_at("spec", "labelsToApply",
                                                                old="zone"),
         "zone", "spec.labelsToApply", LABEL_KEY_BAD),
    # policies
    Case("policy tier", named("NetworkPolicy", namespace="prod", tier="default"),
         at("spec", "tier"), "default", "spec.tier", ("UPPER", "a.b")),
    Case("rule named port", named("NetworkPolicy"),
         at("spec", "ingress", 0, "destination", "ports", 0), "http",
         "spec.ingress[0].destination.ports[0]",
         tuple(v for v in PORT_NAME_BAD if v != "1234")),  # a number is a port there
    # endpoints
    Case("WorkloadEndpoint interfaceName", named("WorkloadEndpoint"),
         at("spec", "interfaceName"), "cali0123456789a", "spec.interfaceName", IFACE_BAD),
    Case("HostEndpoint interfaceName", named("HostEndpoint"), at("spec", "interfaceName"),
         "eth0", "spec.interfaceName", IFACE_BAD),
    Case("WorkloadEndpoint mac", named("WorkloadEndpoint"), at("spec", "mac"),
         "ee:ee:ee:ee:ee:ee", "spec.mac",
         ("ee:ee:ee:ee:ee", "ee:ee:ee:ee:ee:ee:ee", "g0:ee:ee:ee:ee:ee")),
    Case("WorkloadEndpoint port name", named("WorkloadEndpoint"),
         at("spec", "ports", 0, "name"), "http", "spec.ports[0].name", PORT_NAME_BAD),
    Case("HostEndpoint port name", named("HostEndpoint"), at("spec", "ports", 0, "name"),
         "bgp", "spec.ports[0].name", PORT_NAME_BAD),
    Case("WorkloadEndpoint node", named("WorkloadEndpoint"), at("spec", "node"), "node1",
         "spec.node", DNS_SUBDOMAIN_BAD),
    Case("HostEndpoint node", named("HostEndpoint"), at("spec", "node"), "node1",
         "spec.node", DNS_SUBDOMAIN_BAD),
    Case("WorkloadEndpoint profile", named("WorkloadEndpoint"), at("spec", "profiles", 0),
         "kns.prod", "spec.profiles[0]", ("UPPER", "a b", "a_b")),
    Case("HostEndpoint profile", named("HostEndpoint"), at("spec", "profiles", 0),
         "host-defaults", "spec.profiles[0]", ("UPPER", "a b")),
    # Kubernetes objects
    Case("Pod nodeName", named("Pod"), at("spec", "nodeName"), "node1", "spec.nodeName",
         DNS_SUBDOMAIN_BAD[:-1]),
    Case("Pod serviceAccountName", named("Pod"), at("spec", "serviceAccountName"), "api",
         "spec.serviceAccountName", DNS_SUBDOMAIN_BAD[:-1]),
    Case("Pod container port name", named("Pod"),
         at("spec", "containers", 0, "ports", 0, "name"), "http",
         "spec.containers[0].ports[0].name", PORT_NAME_BAD),
    Case("Kubernetes policy named port", named("KubernetesNetworkPolicy"),
         at("spec", "ingress", 0, "ports", 0, "port"), "pg", "spec.ingress[0].ports[0].port",
         ("PG", "a--b", "-pg")),
    Case("Kubernetes policy matchLabels value", named("KubernetesNetworkPolicy"),
         at("spec", "podSelector", "matchLabels", "app"), "postgres",
         "spec.podSelector.matchLabels.app", LABEL_VALUE_BAD),
    Case("Kubernetes policy matchExpressions key", named("KubernetesNetworkPolicy"),
         at("spec", "podSelector", "matchExpressions", 0, "key"), "tier",
         "spec.podSelector.matchExpressions[0].key", LABEL_KEY_BAD),
    Case("Kubernetes policy matchExpressions value", named("KubernetesNetworkPolicy"),
         at("spec", "podSelector", "matchExpressions", 0, "values", 0), "db",
         "spec.podSelector.matchExpressions[0].values[0]", LABEL_VALUE_BAD),
    # BGP and configuration
    Case("BGPPeer node", named("BGPPeer", "mesh-rr"), at("spec", "node"), "node7",
         "spec.node", DNS_SUBDOMAIN_BAD[:-1]),
    Case("BGPPeer keepaliveTime", named("BGPPeer", "rack1-tor"), at("spec", "keepaliveTime"),
         "30s", "spec.keepaliveTime", DURATION_BAD),
    Case("BGPPeer maxRestartTime", named("BGPPeer", "rack1-tor"),
         at("spec", "maxRestartTime"), "2m", "spec.maxRestartTime", DURATION_BAD),
    Case("BGPConfiguration nodeMeshMaxRestartTime", named("BGPConfiguration"),
         at("spec", "nodeMeshMaxRestartTime"), "120s", "spec.nodeMeshMaxRestartTime",
         DURATION_BAD),
    Case("BGPConfiguration community value", named("BGPConfiguration"),
         at("spec", "communities", 0, "value"), "64512:300:100", "spec.communities[0].value",
         ("64512:300:100:1", "a:b", "64512", "٣:٣")),
    Case("BGPConfiguration advertised community", named("BGPConfiguration"),
         at("spec", "prefixAdvertisements", 0, "communities", 1), "64512:120",
         "spec.prefixAdvertisements[0].communities[1]", ("64512", "x:y")),
    Case("FelixConfiguration setting name", named("FelixConfiguration"),
         key_at("spec", old="logSeverityScreen"), "logSeverityScreen", "spec",
         ("log-severity", "1abc", "a b")),
    # Address fields: white space may be accepted, never kept.
    Case("Node routeReflectorClusterID", named("Node"),
         at("spec", "bgp", "routeReflectorClusterID"), "224.0.0.1",
         "spec.bgp.routeReflectorClusterID", ("224.0.0", "x"), reject=False),
    Case("Node ipv4Address", named("Node"), at("spec", "bgp", "ipv4Address"),
         "198.18.0.1/15", "spec.bgp.ipv4Address", ("198.18.0.1/33",), reject=False),
    Case("BGPPeer peerIP", named("BGPPeer", "rack1-tor"), at("spec", "peerIP"),
         "198.18.255.1", "spec.peerIP", ("198.18.255", "[198.18.255.1]"), reject=False),
    Case("IPPool cidr", named("IPPool", "pods-v4"), at("spec", "cidr"), "10.65.0.0/16",
         "spec.cidr", ("10.65.0.1/16",), reject=False),
    Case("HostEndpoint expectedIPs", named("HostEndpoint"), at("spec", "expectedIPs", 0),
         "198.18.0.1", "spec.expectedIPs[0]", ("198.18.0.300",), reject=False),
    Case("WorkloadEndpoint ipNetworks", named("WorkloadEndpoint"),
         at("spec", "ipNetworks", 0), "10.65.0.20/32", "spec.ipNetworks[0]",
         ("10.65.0.0/24",), reject=False),
]


def _with(case: Case, value: str) -> dict[str, Any]:
    doc = case.make()
    case.put(doc, value)
    return doc


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_good_value_parses(case: Case) -> None:
    parse_resource(_with(case, case.good))


def _bad_values(case: Case) -> list[str]:
    return [case.good + "\n", case.good + "\r\n", "\n" + case.good, case.good + " ",
            *case.bad]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_trailing_newline_and_other_bad_values(case: Case) -> None:
    for value in _bad_values(case):
        doc = _with(case, value)
        if case.reject or value.strip() == value or value.strip() != case.good:
            with pytest.raises(ValidationError) as caught:
                parse_resource(doc)
            assert caught.value.field.startswith(case.field), (value, str(caught.value))
            continue
        try:
            resource = parse_resource(doc)
        except ValidationError as exc:
            assert exc.field.startswith(case.field), (value, str(exc))
            continue
        assert "\n" not in repr(resource), (value, resource)


def test_route_reflector_cluster_id_is_kept_normalised() -> None:
    doc = by_kind("Node")
    doc["spec"]["bgp"]["routeReflectorClusterID"] = " 224.0.0.1\n"
    node = parse_resource(doc)
    assert isinstance(node, Node) and node.bgp is not None
    assert node.bgp.route_reflector_cluster_id == "224.0.0.1"

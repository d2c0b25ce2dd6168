"""Policy and endpoint resources, and `parse_resource(doc)`: the model's entry point.

Inputs: a raw document (dict) as a syncer emits it. Output: `parse_resource(doc)` returns one
of the frozen dataclasses of `agent.model` or raises `ValidationError` naming kind,
namespace/name and field path. Nothing else ever escapes it, whatever the input
(property-tested). Every resource carries its `key` (agent.syncer.api.ResourceKey) and
`meta` (labels etc.).

This module holds the policy kinds (Tier, (Global)NetworkPolicy, Profile,
(Global)NetworkSet) and endpoints (WorkloadEndpoint, HostEndpoint) and dispatches every
kind; networking/configuration kinds live in `infrastructure`, Kubernetes kinds in
`kubernetes` (all re-exported by `agent.model`, the place to import them from). Turning
Kubernetes objects into Calico's model (workload endpoints, `kns.`/`ksa.` profiles,
`knp.default.` policies) is `agent.conversion`'s job; a Kubernetes v1 Node parses straight
into the model `Node`.

Defaults follow Calico:
- policy `types`: Ingress when there are no egress rules, Egress when there are only egress
  rules, both when both (or as written); tier "default"; a missing `order` sorts last;
- Tier "default" has order 1,000,000 (the only value Calico accepts for it).
Labels Felix adds when it reads Calico's datastore are added here too, so selectors see
them: a WorkloadEndpoint's labels get `projectcalico.org/namespace` and
`projectcalico.org/orchestrator`, a namespaced NetworkSet's `projectcalico.org/namespace`.

Strictness: unknown fields in Calico resources are errors at every level (a typo in a
security policy must not be silently ignored); Kubernetes objects are checked only in the
fields pyfelix reads (see `kubernetes`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.kinds import CALICO_API, KIND_BY_NAME, KIND_K8S_NETWORK_POLICY, KINDS
from pyfelix.agent.model.base import (
    Metadata,
    Resource,
    check_key_fields,
    describe_document,
    ip_address_field,
    ip_address_list,
    name_list,
    net_list,
    node_name,
    parse_metadata,
    shown_key,
    with_labels,
)
from pyfelix.agent.model.fields import Fields, ValidationError, describe_value
from pyfelix.agent.model.infrastructure import (
    parse_bgp_configuration,
    parse_bgp_filter,
    parse_bgp_peer,
    parse_block_affinity,
    parse_calico_node,
    parse_cluster_information,
    parse_felix_configuration,
    parse_ip_pool,
    parse_kubernetes_node,
)
from pyfelix.agent.model.kubernetes import (
    parse_kubernetes_network_policy,
    parse_namespace,
    parse_pod,
    parse_service_account,
)
from pyfelix.agent.model.labels import (
    DEFAULT_TIER,
    DEFAULT_TIER_ORDER,
    LABEL_NAMESPACE,
    LABEL_ORCHESTRATOR,
)
from pyfelix.agent.model.names import is_dns_label, is_interface_name, is_port_name
from pyfelix.agent.model.rules import (
    Rule,
    check_rule_count,
    check_selector_text,
    no_global,
    normalise_ip,
    parse_net,
    parse_network,
    parse_rules,
    parse_selector,
    protocol_number,
)
from pyfelix.agent.model.secrets import parse_secret
from pyfelix.agent.model.services import parse_endpoint_slice, parse_service
from pyfelix.agent.syncer.api import ResourceKey, key_of

# The Kubernetes form of each kind that has one (the kind catalogue's non-CRD resources: v1
# Pod, Namespace, ServiceAccount, Node and networking.k8s.io/v1 NetworkPolicy).
K8S_API_BY_KIND = {info.kind: info.kube.group_version for info in KINDS
                   if info.kube is not None and not info.kube.is_crd}
K8S_KINDS = frozenset(kind for kind, info in KIND_BY_NAME.items()
                      if info.api_version != CALICO_API)
_MAC_RE = re.compile(r"[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}")  # fullmatch only


@dataclass(frozen=True)
class Tier(Resource):
    order: float | None = None
    default_action: str = "Deny"


@dataclass(frozen=True)
class NetworkPolicy(Resource):
    """Calico NetworkPolicy (namespaced) or, with `is_global`, GlobalNetworkPolicy."""

    is_global: bool = False
    tier: str = DEFAULT_TIER
    order: float | None = None
    selector: str = ""
    namespace_selector: str = ""  # GlobalNetworkPolicy only
    service_account_selector: str = ""
    types: tuple[str, ...] = ("Ingress",)
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    do_not_track: bool = False
    pre_dnat: bool = False
    apply_on_forward: bool = False

    @property
    def policy_id(self) -> str:
        """`<name>` for global policies, `<namespace>/<name>` for namespaced ones."""
        return self.key.name if self.is_global else f"{self.key.namespace}/{self.key.name}"


@dataclass(frozen=True)
class Profile(Resource):
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    labels_to_apply: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NetworkSet(Resource):
    """NetworkSet (namespaced) or, with `is_global`, GlobalNetworkSet."""

    is_global: bool = False
    nets: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndpointPort:
    """A named port of an endpoint (and, for workloads, an optional host port mapping)."""

    name: str
    protocol: int
    port: int
    host_port: int = 0
    host_ip: str = ""


@dataclass(frozen=True)
class IPNAT:
    internal_ip: str
    external_ip: str


@dataclass(frozen=True)
class WorkloadEndpoint(Resource):
    node: str = ""
    orchestrator: str = "k8s"
    workload: str = ""
    pod: str = ""
    endpoint: str = "eth0"
    interface_name: str = ""
    mac: str = ""
    ip_networks: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    ports: tuple[EndpointPort, ...] = ()
    service_account_name: str = ""
    container_id: str = ""
    ip_nats: tuple[IPNAT, ...] = ()
    ipv4_gateway: str = ""
    ipv6_gateway: str = ""
    allow_spoofed_source_prefixes: tuple[str, ...] = ()

    @property
    def endpoint_id(self) -> str:
        """`<namespace>/<workload>`, the endpoint's name in `pyfelix calc` output."""
        return f"{self.key.namespace}/{self.workload}"


@dataclass(frozen=True)
class HostEndpoint(Resource):
    node: str = ""
    interface_name: str = ""
    expected_ips: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    ports: tuple[EndpointPort, ...] = ()


def _default_types(spec: Fields, ingress: tuple[Any, ...], egress: tuple[Any, ...],
                   key: str = "types") -> tuple[str, ...]:
    types = spec.str_list(key)
    seen: set[str] = set()
    for i, t in enumerate(types):
        if t not in ("Ingress", "Egress"):
            spec.fail(f"{key}[{i}]", f"{t[:40]!r} is not Ingress or Egress")
        if t in seen:
            spec.fail(f"{key}[{i}]", f"{t!r} is listed more than once")
        seen.add(t)
    if types:
        return types
    if egress and not ingress:
        return ("Egress",)
    if egress:
        return ("Ingress", "Egress")
    return ("Ingress",)


def _endpoint_ports(spec: Fields, *, workload: bool) -> tuple[EndpointPort, ...]:
    allowed = {"name", "protocol", "port", "hostPort", "hostIP"} if workload else {
        "name", "protocol", "port"}
    ports = []
    for item in spec.items("ports", allowed=allowed):
        protocol = protocol_number(item.raw("protocol"), item, "protocol")
        if protocol not in (6, 17, 132, 136):
            item.fail("protocol", "required, and must be a protocol with ports "
                      "(TCP, UDP, SCTP or UDPLite)")
        name = item.str("name")
        if name and not is_port_name(name):
            item.fail("name", f"{name[:40]!r} is not a valid port name (at most 15 lower-case "
                      "letters, digits and '-', with a letter)")
        host_port = item.int("hostPort", 0, lo=0, hi=65535) or 0
        if not name and not (workload and host_port):
            item.fail("name", "required field is missing")
        port = item.int("port", lo=1, hi=65535)
        if port is None:
            item.fail("port", "required field is missing")
        host_ip = item.str("hostIP")
        if host_ip:
            host_ip = ip_address_field(host_ip, item, "hostIP")
        ports.append(EndpointPort(name, protocol, port, host_port, host_ip))
    return tuple(ports)


def _tier(spec: Fields, key: ResourceKey, meta: Metadata) -> Tier:
    spec.only({"order", "defaultAction"})
    order = spec.float("order")
    if key.name == DEFAULT_TIER:
        if order is None:
            order = DEFAULT_TIER_ORDER
        elif order != DEFAULT_TIER_ORDER:
            spec.fail("order", f"the default tier's order must be {DEFAULT_TIER_ORDER:g}")
    return Tier(key, meta, order=order,
                default_action=spec.one_of("defaultAction", ("Deny", "Pass"), "Deny"))


NETWORK_POLICY_FIELDS = frozenset({"tier", "order", "selector", "serviceAccountSelector",
                                   "types", "ingress", "egress", "performanceHints"})
GLOBAL_POLICY_FIELDS = NETWORK_POLICY_FIELDS | {"namespaceSelector", "doNotTrack", "preDNAT",
                                                "applyOnForward"}



def _policy(spec: Fields, key: ResourceKey, meta: Metadata, is_global: bool) -> NetworkPolicy:
    spec.only(GLOBAL_POLICY_FIELDS if is_global else NETWORK_POLICY_FIELDS)
    check_rule_count(spec, len(spec.list("ingress")) + len(spec.list("egress")))
    check_selector_text(spec, ("selector", "namespaceSelector", "serviceAccountSelector"))
    for i, hint in enumerate(spec.str_list("performanceHints")):
        if hint != "AssumeNeededOnEveryNode":
            spec.fail(f"performanceHints[{i}]", f"unknown hint {hint[:40]!r}")
    ingress = parse_rules(spec, "ingress")
    egress = parse_rules(spec, "egress")
    tier = spec.str("tier", DEFAULT_TIER) or DEFAULT_TIER
    if not is_dns_label(tier):
        spec.fail("tier", f"{tier[:40]!r} is not a valid tier name")
    if tier != DEFAULT_TIER and not key.name.startswith(tier + "."):
        # Calico requires tiered policy names to carry the tier as a prefix.
        spec.fail("tier", f"policy in tier {tier!r} must be named '{tier}.<name>'")
    selector = no_global(parse_selector(spec.str("selector"), spec, "selector"), spec,
                         "selector")
    namespace_selector = no_global(
        parse_selector(spec.str("namespaceSelector"), spec, "namespaceSelector"), spec,
        "namespaceSelector")
    sa_selector = no_global(
        parse_selector(spec.str("serviceAccountSelector"), spec, "serviceAccountSelector"),
        spec, "serviceAccountSelector")
    policy = NetworkPolicy(
        key=key,
        meta=meta,
        is_global=is_global,
        tier=tier,
        order=spec.float("order"),
        selector=selector,
        namespace_selector=namespace_selector,
        service_account_selector=sa_selector,
        types=_default_types(spec, ingress, egress),
        ingress=ingress,
        egress=egress,
        do_not_track=spec.bool("doNotTrack"),
        pre_dnat=spec.bool("preDNAT"),
        apply_on_forward=spec.bool("applyOnForward"),
    )
    if policy.do_not_track and policy.pre_dnat:
        spec.fail("preDNAT", "preDNAT and doNotTrack cannot both be true")
    if (policy.do_not_track or policy.pre_dnat) and not policy.apply_on_forward:
        spec.fail("applyOnForward", "must be true when doNotTrack or preDNAT is true")
    if policy.pre_dnat and policy.egress:
        spec.fail("egress", "a preDNAT policy cannot have egress rules")
    if policy.pre_dnat and "Egress" in policy.types:
        spec.fail("types", "a preDNAT policy cannot have type Egress")
    return policy


def _gnp(spec: Fields, key: ResourceKey, meta: Metadata) -> NetworkPolicy:
    return _policy(spec, key, meta, True)


def _np(spec: Fields, key: ResourceKey, meta: Metadata) -> NetworkPolicy:
    return _policy(spec, key, meta, False)


def _profile(spec: Fields, key: ResourceKey, meta: Metadata) -> Profile:
    spec.only({"ingress", "egress", "labelsToApply"})
    check_rule_count(spec, len(spec.list("ingress")) + len(spec.list("egress")))
    check_selector_text(spec)
    return Profile(key, meta, ingress=parse_rules(spec, "ingress"),
                   egress=parse_rules(spec, "egress"),
                   labels_to_apply=tuple(sorted(spec.labels("labelsToApply").items())))


def _network_set(is_global: bool) -> Callable[[Fields, ResourceKey, Metadata], NetworkSet]:
    def parse(spec: Fields, key: ResourceKey, meta: Metadata) -> NetworkSet:
        spec.only({"nets", "allowedEgressDomains"})
        if spec.has("allowedEgressDomains"):
            spec.fail("allowedEgressDomains", "domain-based network sets are not supported")
        if LABEL_NAMESPACE in meta.labels_dict:
            raise ValidationError(shown_key(key), f"metadata.labels.{LABEL_NAMESPACE}",
                                  "this label is reserved (Calico sets it from the namespace)")
        if not is_global:
            meta = with_labels(meta, {LABEL_NAMESPACE: key.namespace})
        return NetworkSet(key, meta, is_global=is_global, nets=net_list(spec, "nets"))
    return parse


WORKLOAD_ENDPOINT_FIELDS = frozenset({
    "node", "orchestrator", "workload", "pod", "endpoint", "containerID", "interfaceName",
    "mac", "ipNetworks", "ipNATs", "ipv4Gateway", "ipv6Gateway", "profiles", "ports",
    "serviceAccountName", "allowSpoofedSourcePrefixes", "qosControls", "awsElasticIPs",
})


def _single_address_networks(spec: Fields, key: str) -> tuple[str, ...]:
    """A workload's addresses as normalised /32 or /128 networks."""
    nets = []
    for i, text in enumerate(spec.list(key)):
        if isinstance(text, str):  # fast path: "a.b.c.d" or "a.b.c.d/32"
            address, slash, prefix = text.strip().partition("/")
            normalised = normalise_ip(address) if ":" not in address else None
            if normalised is not None and (not slash or prefix == "32"):
                nets.append(f"{normalised}/32")
                continue
        net = parse_network(text, spec, f"{key}[{i}]")
        if net.prefixlen != net.max_prefixlen:
            spec.fail(f"{key}[{i}]", f"{net} contains several addresses; a workload's "
                      "networks must be /32 (IPv4) or /128 (IPv6)")
        nets.append(parse_net(text, spec, key))
    return tuple(nets)


def _interface(spec: Fields, key: str, *, allow_wildcard: bool = False) -> str:
    name = spec.str(key)
    if name and not (is_interface_name(name) or (allow_wildcard and name == "*")):
        spec.fail(key, f"{name[:40]!r} is not a valid interface name "
                  "(1-15 letters, digits, '_', '.', '-')")
    return name


def _wep(spec: Fields, key: ResourceKey, meta: Metadata) -> WorkloadEndpoint:
    spec.only(WORKLOAD_ENDPOINT_FIELDS)
    mac = spec.str("mac")
    if mac and not _MAC_RE.fullmatch(mac):
        spec.fail("mac", f"{mac[:40]!r} is not a MAC address")
    ip_networks = _single_address_networks(spec, "ipNetworks")
    nats = []
    for item in spec.items("ipNATs", allowed={"internalIP", "externalIP"}):
        internal = ip_address_field(item.raw("internalIP"), item, "internalIP")
        external = ip_address_field(item.raw("externalIP"), item, "externalIP")
        if ipaddress.ip_address(internal).version != ipaddress.ip_address(external).version:
            item.fail("externalIP", "internal and external IP versions differ")
        if not any(ipaddress.ip_address(internal) in ipaddress.ip_network(n)
                   for n in ip_networks):
            item.fail("internalIP", f"{internal} is not one of the endpoint's ipNetworks")
        nats.append(IPNAT(internal, external))
    gateways = {}
    for gw_key, version in (("ipv4Gateway", 4), ("ipv6Gateway", 6)):
        text = spec.str(gw_key)
        if text:
            text = ip_address_field(text, spec, gw_key)
            if ipaddress.ip_address(text).version != version:
                spec.fail(gw_key, f"not an IPv{version} address")
        gateways[gw_key] = text
    orchestrator = spec.str("orchestrator", "k8s")
    pod = spec.str("pod")
    workload = spec.str("workload") or pod or key.name
    node = node_name(spec, "node", required=True)
    implied = {LABEL_NAMESPACE: key.namespace}
    if orchestrator:
        implied[LABEL_ORCHESTRATOR] = orchestrator
    return WorkloadEndpoint(
        key, with_labels(meta, implied),
        node=node,
        orchestrator=orchestrator,
        workload=workload,
        pod=pod,
        endpoint=spec.str("endpoint", "eth0"),
        interface_name=_interface(spec, "interfaceName"),
        mac=mac,
        ip_networks=tuple(ip_networks),
        profiles=name_list(spec, "profiles"),
        ports=_endpoint_ports(spec, workload=True),
        service_account_name=spec.str("serviceAccountName"),
        container_id=spec.str("containerID"),
        ip_nats=tuple(nats),
        ipv4_gateway=gateways["ipv4Gateway"],
        ipv6_gateway=gateways["ipv6Gateway"],
        allow_spoofed_source_prefixes=net_list(spec, "allowSpoofedSourcePrefixes"),
    )


def _hep(spec: Fields, key: ResourceKey, meta: Metadata) -> HostEndpoint:
    spec.only({"node", "interfaceName", "expectedIPs", "profiles", "ports"})
    hep = HostEndpoint(key, meta, node=node_name(spec, "node", required=True),
                       interface_name=_interface(spec, "interfaceName", allow_wildcard=True),
                       expected_ips=ip_address_list(spec, "expectedIPs"),
                       profiles=name_list(spec, "profiles"),
                       ports=_endpoint_ports(spec, workload=False))
    if not hep.interface_name and not hep.expected_ips:
        spec.fail("interfaceName", "a host endpoint needs interfaceName or expectedIPs")
    return hep


Parser = Callable[[Fields, ResourceKey, Metadata], Resource]


# Calico kinds: parser gets `spec`.
_CALICO_PARSERS: dict[str, Parser] = {
    "Tier": _tier,
    "GlobalNetworkPolicy": _gnp,
    "NetworkPolicy": _np,
    "Profile": _profile,
    "GlobalNetworkSet": _network_set(True),
    "NetworkSet": _network_set(False),
    "WorkloadEndpoint": _wep,
    "HostEndpoint": _hep,
    "IPPool": parse_ip_pool,
    "Node": parse_calico_node,
    "BGPConfiguration": parse_bgp_configuration,
    "BGPPeer": parse_bgp_peer,
    "BGPFilter": parse_bgp_filter,
    "FelixConfiguration": parse_felix_configuration,
    "ClusterInformation": parse_cluster_information,
    "BlockAffinity": parse_block_affinity,
}


# Kubernetes kinds: parser gets the whole document.
_K8S_PARSERS: dict[str, Parser] = {
    "Pod": parse_pod,
    "Namespace": parse_namespace,
    "ServiceAccount": parse_service_account,
    KIND_K8S_NETWORK_POLICY: parse_kubernetes_network_policy,
    "Node": parse_kubernetes_node,
    "Service": parse_service,
    "EndpointSlice": parse_endpoint_slice,
    "Secret": parse_secret,
}


_CALICO_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec"})


KNOWN_KINDS = frozenset(_CALICO_PARSERS) | frozenset(_K8S_PARSERS)
# One parser (per document form) for every kind of the catalogue, and none beside it.
if frozenset(KIND_BY_NAME) != KNOWN_KINDS:
    raise RuntimeError("the kind catalogue (agent.kinds) and the model's parsers disagree: "
                       f"{sorted(KNOWN_KINDS ^ frozenset(KIND_BY_NAME))}")


def parse_resource(doc: Any) -> Resource:
    """Parse and validate one raw document. Raises ValidationError naming resource and field."""
    described = describe_document(doc)
    check_key_fields(doc, described)
    key = key_of(doc)
    described = shown_key(key)
    try:
        return _parse_keyed(doc, key, described)
    except RecursionError:  # a document built in code, not decoded (decoding bounds depth)
        raise ValidationError(described, "", "nested too deeply to validate") from None


def _parse_keyed(doc: dict[str, Any], key: ResourceKey, described: str) -> Resource:
    api_version = doc.get("apiVersion")
    if key.kind in _CALICO_PARSERS and api_version == CALICO_API:
        top = Fields(doc, described, allowed=_CALICO_TOP_FIELDS | (
            {"status"} if key.kind == "Node" else set()))
        meta = parse_metadata(top.sub("metadata"), key)
        return _CALICO_PARSERS[key.kind](top.sub("spec"), key, meta)
    if key.kind in _K8S_PARSERS and api_version == K8S_API_BY_KIND[key.kind]:
        top = Fields(doc, described)
        meta = parse_metadata(top.sub("metadata"), key)
        return _K8S_PARSERS[key.kind](top, key, meta)
    if key.kind not in KNOWN_KINDS:
        raise ValidationError(described, "kind", f"unknown kind {key.kind[:60]!r}")
    expected = sorted({CALICO_API for k in [key.kind] if k in _CALICO_PARSERS}
                      | {K8S_API_BY_KIND[key.kind] for k in [key.kind] if k in _K8S_PARSERS})
    shown = describe_value(api_version)[:60]
    raise ValidationError(described, "apiVersion",
                          f"{shown} is not {' or '.join(repr(e) for e in expected)} "
                          f"for kind {key.kind}")


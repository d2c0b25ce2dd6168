"""Typed, immutable Calico v3 and Kubernetes resources, parsed from raw documents.

Inputs: a raw document (dict) as a syncer emits it. Output: `parse_resource(doc)` returns one
of the frozen dataclasses below or raises `ValidationError` naming kind, namespace/name and
field path. Nothing else ever escapes it, whatever the input (property-tested).
Every resource carries its `key` (agent.syncer.api.ResourceKey) and `meta` (labels etc.).

Kubernetes kinds (Pod, Namespace, ServiceAccount, networking.k8s.io NetworkPolicy keyed as
`KubernetesNetworkPolicy`) are kept as their own typed objects here; turning them into
Calico's model (workload endpoints, `kns.`/`ksa.` profiles, `knp.default.` policies) is
`agent.conversion`'s job. A Kubernetes v1 Node parses straight into the model `Node`.

Defaults follow Calico:
- policy `types`: Ingress when there are no egress rules, Egress when there are only egress
  rules, both when both (or as written); tier "default"; a missing `order` sorts last;
- Tier "default" has order 1,000,000 (the only value Calico accepts for it);
- IPPool blockSize 26 (IPv4) / 122 (IPv6), nodeSelector all(), modes Never;
- a Kubernetes NetworkPolicy without policyTypes gets Ingress, plus Egress when it has
  egress rules (what the API server's defaulting does).
Labels Felix adds when it reads Calico's datastore are added here too, so selectors see
them: a WorkloadEndpoint's labels get `projectcalico.org/namespace` and
`projectcalico.org/orchestrator`, a namespaced NetworkSet's `projectcalico.org/namespace`.

Strictness: unknown fields in Calico resources are errors at every level. Kubernetes
objects come from an API server and carry many fields pyfelix does not read: only the
fields read here are checked (and NetworkPolicy, whose spec is small, is strict).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.model.fields import Fields, ValidationError
from agent.model.labels import (
    DEFAULT_TIER,
    DEFAULT_TIER_ORDER,
    LABEL_NAMESPACE,
    LABEL_ORCHESTRATOR,
)
from agent.model.names import (
    is_decimal,
    is_dns_label,
    is_dns_subdomain,
    is_interface_name,
    is_port_name,
    label_value_problem,
    qualified_name_problem,
)
from agent.model.rules import (
    RULE_FIELDS,
    Network,
    Rule,
    no_global,
    parse_net,
    parse_network,
    parse_rules,
    parse_selector,
    protocol_number,
)
from agent.syncer.api import K8S_NETWORKING_API, KIND_K8S_NETWORK_POLICY, ResourceKey, key_of

CALICO_API = "projectcalico.org/v3"
K8S_API_BY_KIND = {"Pod": "v1", "Namespace": "v1", "ServiceAccount": "v1", "Node": "v1",
                   KIND_K8S_NETWORK_POLICY: K8S_NETWORKING_API}
K8S_KINDS = frozenset({"Pod", "Namespace", "ServiceAccount", KIND_K8S_NETWORK_POLICY})

_MAX_AS_NUMBER = 4294967295
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}$")
_STANDARD_COMMUNITY_RE = re.compile(r"^(\d+):(\d+)$")
_LARGE_COMMUNITY_RE = re.compile(r"^(\d+):(\d+):(\d+)$")
_DURATION_RE = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
_FELIX_SETTING_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
# Calico's policy name rules (libcalico-go validator).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NP_NAME_RE = re.compile(
    rf"^(({_LABEL})(\.{_LABEL})?|((knp|ossg)\.default\.{_LABEL}(\.{_LABEL})*))$")
_GNP_NAME_RE = re.compile(rf"^({_LABEL}\.)?{_LABEL}$")


@dataclass(frozen=True)
class Metadata:
    name: str
    namespace: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    uid: str = ""
    resource_version: str = ""

    @property
    def labels_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def annotations_dict(self) -> dict[str, str]:
        return dict(self.annotations)


@dataclass(frozen=True)
class Resource:
    key: ResourceKey
    meta: Metadata


# --- policy -------------------------------------------------------------------------------


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


# --- endpoints -----------------------------------------------------------------------------


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


# --- networking ----------------------------------------------------------------------------


@dataclass(frozen=True)
class IPPool(Resource):
    cidr: str = ""
    block_size: int = 26
    ipip_mode: str = "Never"
    vxlan_mode: str = "Never"
    nat_outgoing: bool = False
    disabled: bool = False
    disable_bgp_export: bool = False
    node_selector: str = "all()"
    allowed_uses: tuple[str, ...] = ("Workload", "Tunnel")
    assignment_mode: str = "Automatic"


@dataclass(frozen=True)
class NodeBGP:
    ipv4_address: str = ""  # as written: address/prefix, e.g. "198.18.0.1/15"
    ipv6_address: str = ""
    as_number: int | None = None
    route_reflector_cluster_id: str = ""
    ipv4_ipip_tunnel_addr: str = ""


@dataclass(frozen=True)
class Node(Resource):
    """Calico Node (projectcalico.org/v3) or a Kubernetes v1 Node.

    A Kubernetes Node gets `addresses` from status (InternalIP/ExternalIP), `pod_cidrs` from
    spec, and `bgp` from Calico's `projectcalico.org/IPv4Address`-style annotations.
    """

    bgp: NodeBGP | None = None
    addresses: tuple[str, ...] = ()
    ipv4_vxlan_tunnel_addr: str = ""
    pod_cidrs: tuple[str, ...] = ()
    ipv6_vxlan_tunnel_addr: str = ""


@dataclass(frozen=True)
class Community:
    name: str
    value: str


@dataclass(frozen=True)
class PrefixAdvertisement:
    cidr: str
    communities: tuple[str, ...] = ()


@dataclass(frozen=True)
class BGPConfiguration(Resource):
    as_number: int | None = None
    node_to_node_mesh_enabled: bool = True
    listen_port: int = 179
    log_severity_screen: str = "Info"
    service_cluster_ips: tuple[str, ...] = ()
    service_external_ips: tuple[str, ...] = ()
    service_load_balancer_ips: tuple[str, ...] = ()
    communities: tuple[Community, ...] = ()
    prefix_advertisements: tuple[PrefixAdvertisement, ...] = ()
    node_mesh_password: str = ""
    node_mesh_max_restart_time: str = ""
    bind_mode: str = "None"


@dataclass(frozen=True)
class BGPPeer(Resource):
    node: str = ""
    peer_ip: str = ""
    as_number: int | None = None
    node_selector: str = ""
    peer_selector: str = ""
    password: str = ""
    keep_original_next_hop: bool = False
    source_address: str = "UseNodeIP"
    max_restart_time: str = ""
    keepalive_time: str = ""
    port: int | None = None
    ttl_security: int = 0
    reachable_by: str = ""


@dataclass(frozen=True)
class FelixConfiguration(Resource):
    """Free-form Felix settings (spec keys as Calico spells them) -> string values."""

    settings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class BlockAffinity(Resource):
    node: str = ""
    cidr: str = ""
    state: str = "confirmed"
    deleted: bool = False


# --- Kubernetes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerPort:
    name: str
    port: int
    protocol: int = 6
    host_port: int = 0
    host_ip: str = ""


@dataclass(frozen=True)
class Pod(Resource):
    node_name: str = ""
    pod_ips: tuple[str, ...] = ()
    phase: str = ""
    host_network: bool = False
    service_account_name: str = "default"
    ports: tuple[ContainerPort, ...] = ()
    deleted: bool = False  # deletionTimestamp set


@dataclass(frozen=True)
class Namespace(Resource):
    pass


@dataclass(frozen=True)
class ServiceAccount(Resource):
    pass


@dataclass(frozen=True)
class LabelSelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes label selector; `None` at the use site means "not given"."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


@dataclass(frozen=True)
class K8sPort:
    protocol: int = 6
    port: int | str | None = None  # number, name, or None for all ports
    end_port: int | None = None


@dataclass(frozen=True)
class IPBlock:
    cidr: str
    except_: tuple[str, ...] = ()


@dataclass(frozen=True)
class K8sPeer:
    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None


@dataclass(frozen=True)
class K8sPolicyRule:
    peers: tuple[K8sPeer, ...] = ()  # empty: all sources/destinations
    ports: tuple[K8sPort, ...] = ()  # empty: all ports


@dataclass(frozen=True)
class K8sNetworkPolicy(Resource):
    pod_selector: LabelSelector = LabelSelector()
    policy_types: tuple[str, ...] = ("Ingress",)
    ingress: tuple[K8sPolicyRule, ...] = ()
    egress: tuple[K8sPolicyRule, ...] = ()


# --- parsing: metadata ------------------------------------------------------------------------

METADATA_FIELDS = frozenset({
    "name", "namespace", "labels", "annotations", "uid", "resourceVersion",
    "creationTimestamp", "generation", "generateName", "ownerReferences", "finalizers",
    "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
})

_NAME_RULES: dict[str, tuple[Callable[[str], bool], str]] = {
    "Tier": (is_dns_label, "a DNS label (lower case letters, digits and '-')"),
    "Namespace": (is_dns_label, "a DNS label (lower case letters, digits and '-')"),
    "NetworkPolicy": (lambda n: bool(_NP_NAME_RE.match(n)) and len(n) <= 253,
                      "lower case letters, digits and '-', with at most one '.'"),
    "GlobalNetworkPolicy": (lambda n: bool(_GNP_NAME_RE.match(n)) and len(n) <= 253,
                            "lower case letters, digits and '-', with at most one '.'"),
}
_DEFAULT_NAME_RULE = (is_dns_subdomain, "a DNS subdomain (lower case letters, digits, '-', '.')")


def _describe(doc: Any) -> str:
    """`Kind(namespace/name)` as far as the document allows, with `?` for what is missing."""
    try:
        return str(key_of(doc))
    except ValueError:
        pass
    if not isinstance(doc, dict):
        return "document(?)"
    kind = doc.get("kind")
    kind_text = kind if isinstance(kind, str) and kind else "?"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    name_text = name if isinstance(name, str) and name else "?"
    return f"{kind_text[:60]}({name_text[:120]})"


def _check_key_fields(doc: Any, described: str) -> None:
    """Fail with a precise field path when `key_of` would fail."""
    if not isinstance(doc, dict):
        raise ValidationError(described, "", f"document is {type(doc).__name__}, not a mapping")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValidationError(described, "kind", "missing, empty or not a string")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise ValidationError(described, "metadata", "missing or not a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValidationError(described, "metadata.name", "missing, empty or not a string")
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise ValidationError(described, "metadata.namespace", "not a string")


def _metadata(meta: Fields, key: ResourceKey) -> Metadata:
    meta.only(METADATA_FIELDS)
    check, wanted = _NAME_RULES.get(key.kind, _DEFAULT_NAME_RULE)
    if not check(key.name):
        meta.fail("name", f"{key.name[:80]!r} is not a valid name: expected {wanted}")
    if key.namespace and not is_dns_label(key.namespace):
        meta.fail("namespace", f"{key.namespace[:80]!r} is not a valid namespace name")
    annotations = meta.str_map("annotations")
    for k in annotations:
        problem = qualified_name_problem(k.lower())
        if problem:
            meta.fail(f"annotations.{k}", f"invalid annotation key: {problem}")
    uid = meta.raw("uid")
    version = meta.raw("resourceVersion")
    return Metadata(
        name=key.name,
        namespace=key.namespace,
        labels=tuple(sorted(meta.labels("labels").items())),
        annotations=tuple(sorted(annotations.items())),
        uid=uid if isinstance(uid, str) else "",
        resource_version=str(version) if isinstance(version, str | int) else "",
    )


def _with_labels(meta: Metadata, extra: dict[str, str]) -> Metadata:
    merged = dict(meta.labels)
    merged.update(extra)
    return Metadata(meta.name, meta.namespace, tuple(sorted(merged.items())), meta.annotations,
                    meta.uid, meta.resource_version)


# --- parsing: small shared helpers --------------------------------------------------------------


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


def _ip_address(text: Any, fields: Fields, key: str) -> str:
    if not isinstance(text, str):
        fields.fail(key, f"expected an IP address string, got {type(text).__name__}")
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        fields.fail(key, f"invalid IP address {text[:60]!r}")


def _ip_list(spec: Fields, key: str) -> tuple[str, ...]:
    return tuple(_ip_address(t, spec, f"{key}[{i}]") for i, t in enumerate(spec.list(key)))


def _net_list(spec: Fields, key: str) -> tuple[str, ...]:
    return tuple(parse_net(t, spec, f"{key}[{i}]") for i, t in enumerate(spec.list(key)))


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
            host_ip = _ip_address(host_ip, item, "hostIP")
        ports.append(EndpointPort(name, protocol, port, host_port, host_ip))
    return tuple(ports)


def _as_number(fields: Fields, key: str) -> int | None:
    """An AS number: 1..4294967295, or Calico's dotted "high.low" notation."""
    raw = fields.raw(key)
    if isinstance(raw, float):
        fields.fail(key, f"invalid AS number {raw!r} (quote dotted notation: \"{raw}\")")
    if isinstance(raw, str) and "." in raw:
        high, _, low = raw.partition(".")
        if is_decimal(high) and is_decimal(low) and len(high) <= 5 and len(low) <= 5:
            h, lo = int(high), int(low)
            if h <= 65535 and lo <= 65535 and (h or lo):
                return h * 65536 + lo
        fields.fail(key, f"invalid AS number {raw[:40]!r}")
    return fields.int(key, lo=1, hi=_MAX_AS_NUMBER)


def _duration(fields: Fields, key: str) -> str:
    text = fields.str(key)
    if text and not _DURATION_RE.match(text):
        fields.fail(key, f"{text[:40]!r} is not a duration such as '120s' or '2m'")
    return text


# --- parsing: Calico kinds ----------------------------------------------------------------------


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
# Kept for importers of the old name (the union of both).
POLICY_FIELDS = GLOBAL_POLICY_FIELDS


def _policy(spec: Fields, key: ResourceKey, meta: Metadata, is_global: bool) -> NetworkPolicy:
    spec.only(GLOBAL_POLICY_FIELDS if is_global else NETWORK_POLICY_FIELDS)
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
    return Profile(key, meta, ingress=parse_rules(spec, "ingress"),
                   egress=parse_rules(spec, "egress"),
                   labels_to_apply=tuple(sorted(spec.labels("labelsToApply").items())))


def _network_set(is_global: bool) -> Callable[[Fields, ResourceKey, Metadata], NetworkSet]:
    def parse(spec: Fields, key: ResourceKey, meta: Metadata) -> NetworkSet:
        spec.only({"nets", "allowedEgressDomains"})
        if spec.has("allowedEgressDomains"):
            spec.fail("allowedEgressDomains", "domain-based network sets are not supported")
        if LABEL_NAMESPACE in meta.labels_dict:
            raise ValidationError(str(key), f"metadata.labels.{LABEL_NAMESPACE}",
                                  "this label is reserved (Calico sets it from the namespace)")
        if not is_global:
            meta = _with_labels(meta, {LABEL_NAMESPACE: key.namespace})
        return NetworkSet(key, meta, is_global=is_global, nets=_net_list(spec, "nets"))
    return parse


WORKLOAD_ENDPOINT_FIELDS = frozenset({
    "node", "orchestrator", "workload", "pod", "endpoint", "containerID", "interfaceName",
    "mac", "ipNetworks", "ipNATs", "ipv4Gateway", "ipv6Gateway", "profiles", "ports",
    "serviceAccountName", "allowSpoofedSourcePrefixes", "qosControls", "awsElasticIPs",
})


def _single_address_networks(spec: Fields, key: str) -> dict[str, Network]:
    """{normalised text: network} of a workload's addresses (each /32 or /128)."""
    nets = {}
    for i, text in enumerate(spec.list(key)):
        net = parse_network(text, spec, f"{key}[{i}]")
        if net.prefixlen != net.max_prefixlen:
            spec.fail(f"{key}[{i}]", f"{net} contains several addresses; a workload's "
                      "networks must be /32 (IPv4) or /128 (IPv6)")
        nets[parse_net(text, spec, key)] = net
    return nets


def _interface(spec: Fields, key: str, *, allow_wildcard: bool = False) -> str:
    name = spec.str(key)
    if name and not (is_interface_name(name) or (allow_wildcard and name == "*")):
        spec.fail(key, f"{name[:40]!r} is not a valid interface name "
                  "(1-15 letters, digits, '_', '.', '-')")
    return name


def _wep(spec: Fields, key: ResourceKey, meta: Metadata) -> WorkloadEndpoint:
    spec.only(WORKLOAD_ENDPOINT_FIELDS)
    mac = spec.str("mac")
    if mac and not _MAC_RE.match(mac):
        spec.fail("mac", f"{mac[:40]!r} is not a MAC address")
    ip_networks = _single_address_networks(spec, "ipNetworks")
    nats = []
    for item in spec.items("ipNATs", allowed={"internalIP", "externalIP"}):
        internal = _ip_address(item.raw("internalIP"), item, "internalIP")
        external = _ip_address(item.raw("externalIP"), item, "externalIP")
        if ipaddress.ip_address(internal).version != ipaddress.ip_address(external).version:
            item.fail("externalIP", "internal and external IP versions differ")
        if not any(ipaddress.ip_address(internal) in n for n in ip_networks.values()):
            item.fail("internalIP", f"{internal} is not one of the endpoint's ipNetworks")
        nats.append(IPNAT(internal, external))
    gateways = {}
    for gw_key, version in (("ipv4Gateway", 4), ("ipv6Gateway", 6)):
        text = spec.str(gw_key)
        if text:
            text = _ip_address(text, spec, gw_key)
            if ipaddress.ip_address(text).version != version:
                spec.fail(gw_key, f"not an IPv{version} address")
        gateways[gw_key] = text
    orchestrator = spec.str("orchestrator", "k8s")
    pod = spec.str("pod")
    workload = spec.str("workload") or pod or key.name
    node = spec.str("node", required=True)
    implied = {LABEL_NAMESPACE: key.namespace}
    if orchestrator:
        implied[LABEL_ORCHESTRATOR] = orchestrator
    return WorkloadEndpoint(
        key, _with_labels(meta, implied),
        node=node,
        orchestrator=orchestrator,
        workload=workload,
        pod=pod,
        endpoint=spec.str("endpoint", "eth0"),
        interface_name=_interface(spec, "interfaceName"),
        mac=mac,
        ip_networks=tuple(ip_networks),
        profiles=spec.str_list("profiles"),
        ports=_endpoint_ports(spec, workload=True),
        service_account_name=spec.str("serviceAccountName"),
        container_id=spec.str("containerID"),
        ip_nats=tuple(nats),
        ipv4_gateway=gateways["ipv4Gateway"],
        ipv6_gateway=gateways["ipv6Gateway"],
        allow_spoofed_source_prefixes=_net_list(spec, "allowSpoofedSourcePrefixes"),
    )


def _hep(spec: Fields, key: ResourceKey, meta: Metadata) -> HostEndpoint:
    spec.only({"node", "interfaceName", "expectedIPs", "profiles", "ports"})
    hep = HostEndpoint(key, meta, node=spec.str("node", required=True),
                       interface_name=_interface(spec, "interfaceName", allow_wildcard=True),
                       expected_ips=_ip_list(spec, "expectedIPs"),
                       profiles=spec.str_list("profiles"),
                       ports=_endpoint_ports(spec, workload=False))
    if not hep.interface_name and not hep.expected_ips:
        spec.fail("interfaceName", "a host endpoint needs interfaceName or expectedIPs")
    return hep


IP_POOL_FIELDS = frozenset({"cidr", "blockSize", "ipipMode", "vxlanMode", "natOutgoing",
                            "disabled", "disableBGPExport", "nodeSelector", "allowedUses",
                            "assignmentMode"})
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def _pool(spec: Fields, key: ResourceKey, meta: Metadata) -> IPPool:
    spec.only(IP_POOL_FIELDS)
    text = spec.str("cidr", required=True)
    cidr = parse_net(text, spec, "cidr")
    network = ipaddress.ip_network(cidr)
    try:
        ipaddress.ip_network(text.strip(), strict=True)
    except ValueError:
        spec.fail("cidr", f"{text[:60]!r} is not strictly masked (did you mean {cidr}?)")
    if any(network.version == ll.version and network.overlaps(ll) for ll in _LINK_LOCAL):
        spec.fail("cidr", f"{cidr} overlaps the link-local range")
    v4 = network.version == 4
    block_size = spec.int("blockSize", 26 if v4 else 122, lo=20 if v4 else 116,
                          hi=32 if v4 else 128)
    assert block_size is not None
    modes = ("Never", "Always", "CrossSubnet")
    uses = spec.str_list("allowedUses") or ("Workload", "Tunnel")
    for i, use in enumerate(uses):
        if use not in ("Workload", "Tunnel", "LoadBalancer"):
            spec.fail(f"allowedUses[{i}]", f"unknown use {use[:40]!r}")
    pool = IPPool(key, meta, cidr=cidr, block_size=block_size,
                  ipip_mode=spec.one_of("ipipMode", modes, "Never"),
                  vxlan_mode=spec.one_of("vxlanMode", modes, "Never"),
                  nat_outgoing=spec.bool("natOutgoing"), disabled=spec.bool("disabled"),
                  disable_bgp_export=spec.bool("disableBGPExport"),
                  node_selector=parse_selector(spec.str("nodeSelector", "all()") or "all()",
                                               spec, "nodeSelector"),
                  allowed_uses=tuple(uses),
                  assignment_mode=spec.one_of("assignmentMode", ("Automatic", "Manual"),
                                              "Automatic"))
    if pool.ipip_mode != "Never" and pool.vxlan_mode != "Never":
        spec.fail("vxlanMode", "ipipMode and vxlanMode cannot both be enabled")
    if not v4 and pool.ipip_mode != "Never":
        spec.fail("ipipMode", "IPIP is not supported on an IPv6 pool")
    if not pool.disabled and network.prefixlen > block_size:
        spec.fail("cidr", f"pool /{network.prefixlen} is smaller than its block size "
                  f"/{block_size}")
    return pool


NODE_FIELDS = frozenset({"bgp", "ipv4VXLANTunnelAddr", "ipv6VXLANTunnelAddr",
                         "vxlanTunnelMACAddr", "vxlanTunnelMACAddrV6", "orchRefs", "wireguard",
                         "addresses"})
NODE_BGP_FIELDS = frozenset({"ipv4Address", "ipv6Address", "asNumber",
                             "routeReflectorClusterID", "ipv4IPIPTunnelAddr"})


def _interface_address(fields: Fields, key: str, version: int) -> str:
    """An address with prefix length as Calico writes node addresses ("198.18.0.1/15")."""
    text = fields.str(key)
    if not text:
        return ""
    try:
        iface = ipaddress.ip_interface(text.strip())
    except ValueError:
        fields.fail(key, f"{text[:60]!r} is not an IP address or address/prefix")
    if iface.version != version:
        fields.fail(key, f"{text[:60]!r} is not an IPv{version} address")
    return text.strip()


def _optional_ip(fields: Fields, key: str) -> str:
    text = fields.str(key)
    return _ip_address(text, fields, key) if text else ""


def _node_bgp(b: Fields) -> NodeBGP:
    bgp = NodeBGP(_interface_address(b, "ipv4Address", 4), _interface_address(b, "ipv6Address", 6),
                  _as_number(b, "asNumber"), b.str("routeReflectorClusterID"),
                  _optional_ip(b, "ipv4IPIPTunnelAddr"))
    if bgp.route_reflector_cluster_id:
        _ip_address(bgp.route_reflector_cluster_id, b, "routeReflectorClusterID")
    return bgp


def _node_addresses(items: list[Any], fields: Fields, key: str,
                    skip_types: frozenset[str] = frozenset()) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(items):
        entry = Fields(item, fields.resource, fields.at(f"{key}[{i}]"))
        if entry.str("type") in skip_types:
            continue
        text = entry.str("address", required=True)
        try:
            out.append(str(ipaddress.ip_interface(text.strip()).ip))
        except ValueError:
            entry.fail("address", f"{text[:60]!r} is not an IP address")
    return tuple(out)


def _calico_node(spec: Fields, key: ResourceKey, meta: Metadata) -> Node:
    spec.only(NODE_FIELDS)
    bgp = _node_bgp(spec.sub("bgp", allowed=NODE_BGP_FIELDS)) if spec.has("bgp") else None
    if bgp == NodeBGP():
        spec.fail("bgp", "must not be empty")
    return Node(key, meta, bgp=bgp,
                addresses=_node_addresses(spec.list("addresses"), spec, "addresses"),
                ipv4_vxlan_tunnel_addr=_optional_ip(spec, "ipv4VXLANTunnelAddr"),
                ipv6_vxlan_tunnel_addr=_optional_ip(spec, "ipv6VXLANTunnelAddr"))


# Calico keeps a Kubernetes node's BGP settings in these annotations.
_NODE_ANNOTATIONS = {
    "projectcalico.org/IPv4Address": "ipv4Address",
    "projectcalico.org/IPv6Address": "ipv6Address",
    "projectcalico.org/ASNumber": "asNumber",
    "projectcalico.org/RouteReflectorClusterID": "routeReflectorClusterID",
    "projectcalico.org/IPv4IPIPTunnelAddr": "ipv4IPIPTunnelAddr",
}


def _k8s_node(top: Fields, key: ResourceKey, meta: Metadata) -> Node:
    annotations = meta.annotations_dict
    bgp_fields = {field: annotations[ann] for ann, field in _NODE_ANNOTATIONS.items()
                  if ann in annotations}
    bgp = None
    if bgp_fields:
        bgp = _node_bgp(Fields(bgp_fields, top.resource, "metadata.annotations"))
    spec = top.sub("spec")
    pod_cidrs = _net_list(spec, "podCIDRs")
    if not pod_cidrs and spec.str("podCIDR"):
        pod_cidrs = (parse_net(spec.str("podCIDR"), spec, "podCIDR"),)
    status = top.sub("status")
    vxlan = annotations.get("projectcalico.org/IPv4VXLANTunnelAddr", "")
    if vxlan:
        vxlan = _ip_address(vxlan, top, "metadata.annotations.projectcalico.org/"
                            "IPv4VXLANTunnelAddr")
    return Node(key, meta, bgp=bgp,
                addresses=_node_addresses(status.list("addresses"), status, "addresses",
                                          frozenset({"Hostname", "InternalDNS", "ExternalDNS"})),
                ipv4_vxlan_tunnel_addr=vxlan, pod_cidrs=pod_cidrs)


def _community_ok(value: str) -> bool:
    standard = _STANDARD_COMMUNITY_RE.match(value)
    if standard:
        return all(len(g) <= 5 and int(g) <= 65535 for g in standard.groups())
    large = _LARGE_COMMUNITY_RE.match(value)
    return bool(large) and all(len(g) <= 10 and int(g) <= _MAX_AS_NUMBER
                               for g in large.groups())


BGP_CONFIGURATION_FIELDS = frozenset({
    "asNumber", "nodeToNodeMeshEnabled", "listenPort", "logSeverityScreen", "serviceClusterIPs",
    "serviceExternalIPs", "serviceLoadBalancerIPs", "communities", "prefixAdvertisements",
    "nodeMeshPassword", "nodeMeshMaxRestartTime", "bindMode", "ignoredInterfaces",
    "localWorkloadPeeringIPV4", "localWorkloadPeeringIPV6", "programClusterRoutes",
})


def _bgp_config(spec: Fields, key: ResourceKey, meta: Metadata) -> BGPConfiguration:
    spec.only(BGP_CONFIGURATION_FIELDS)

    def cidrs(name: str) -> tuple[str, ...]:
        return tuple(parse_net(i.raw("cidr"), i, "cidr")
                     for i in spec.items(name, allowed={"cidr"}))

    communities = []
    for item in spec.items("communities", allowed={"name", "value"}):
        community = Community(item.str("name", required=True), item.str("value", required=True))
        if not _community_ok(community.value):
            item.fail("value", f"{community.value[:40]!r} is not a community ('aa:nn' or "
                      "'aa:nn:mm')")
        communities.append(community)
    names = {c.name for c in communities}
    adverts = []
    for item in spec.items("prefixAdvertisements", allowed={"cidr", "communities"}):
        advert = PrefixAdvertisement(parse_net(item.str("cidr", required=True), item, "cidr"),
                                     item.str_list("communities"))
        for i, c in enumerate(advert.communities):
            if c not in names and not _community_ok(c):
                item.fail(f"communities[{i}]", f"{c[:40]!r} is neither a defined community "
                          "name nor a community value")
        adverts.append(advert)
    password = _secret(spec.sub("nodeMeshPassword")) if spec.has("nodeMeshPassword") else ""
    config = BGPConfiguration(
        key, meta,
        as_number=_as_number(spec, "asNumber"),
        node_to_node_mesh_enabled=spec.bool("nodeToNodeMeshEnabled", True),
        listen_port=spec.int("listenPort", 179, lo=1, hi=65535) or 179,
        log_severity_screen=spec.one_of(
            "logSeverityScreen", ("Trace", "Debug", "Info", "Warning", "Error", "Fatal"),
            "Info"),
        service_cluster_ips=cidrs("serviceClusterIPs"),
        service_external_ips=cidrs("serviceExternalIPs"),
        service_load_balancer_ips=cidrs("serviceLoadBalancerIPs"),
        communities=tuple(communities),
        prefix_advertisements=tuple(adverts),
        node_mesh_password=password,
        node_mesh_max_restart_time=_duration(spec, "nodeMeshMaxRestartTime"),
        bind_mode=spec.one_of("bindMode", ("None", "NodeIP"), "None"),
    )
    if not config.node_to_node_mesh_enabled and config.node_mesh_password:
        spec.fail("nodeMeshPassword", "cannot be set when nodeToNodeMeshEnabled is false")
    return config


def _secret(password: Fields) -> str:
    """Calico takes a password from a Secret reference; pyfelix also accepts `value` inline."""
    password.only({"secretKeyRef", "value"})
    if password.has("value"):
        return password.str("value")
    ref = password.sub("secretKeyRef", allowed={"name", "key", "optional"})
    if ref.has("name"):
        # Without a Kubernetes API the secret cannot be read here; the BGP syncer resolves it.
        return f"secret:{ref.str('name')}/{ref.str('key', required=True)}"
    password.fail("", "expected secretKeyRef (name, key) or value")


BGP_PEER_FIELDS = frozenset({
    "node", "peerIP", "asNumber", "nodeSelector", "peerSelector", "password", "sourceAddress",
    "maxRestartTime", "keepaliveTime", "numAllowedLocalASNumbers", "ttlSecurity", "filters",
    "reachableBy", "keepOriginalNextHop", "nextHopMode", "localWorkloadSelector",
    "reversePeering", "localASNumber",
})


def _peer_ip(spec: Fields) -> tuple[str, int | None]:
    """Calico's peerIP forms: `IP`, `IPv4:port`, `[IPv6]:port`."""
    text = spec.str("peerIP").strip()
    if not text:
        return "", None
    host, port = text, None
    if text.startswith("[") or text.count(":") == 1:
        head, _, port_text = text.rpartition(":")
        if not (is_decimal(port_text) and len(port_text) <= 5
                and 1 <= int(port_text) <= 65535):
            spec.fail("peerIP", f"invalid port in {text[:60]!r}")
        host, port = head, int(port_text)
        if text.startswith("["):
            if not head.endswith("]"):
                spec.fail("peerIP", f"invalid peer address {text[:60]!r}")
            host = head[1:-1]
    return _ip_address(host, spec, "peerIP"), port


def _bgp_peer(spec: Fields, key: ResourceKey, meta: Metadata) -> BGPPeer:
    spec.only(BGP_PEER_FIELDS)
    peer_ip, port = _peer_ip(spec)
    password = _secret(spec.sub("password")) if spec.has("password") else ""
    reachable_by = _optional_ip(spec, "reachableBy")
    peer = BGPPeer(
        key, meta,
        node=spec.str("node"),
        peer_ip=peer_ip,
        as_number=_as_number(spec, "asNumber"),
        node_selector=parse_selector(spec.str("nodeSelector"), spec, "nodeSelector"),
        peer_selector=parse_selector(spec.str("peerSelector"), spec, "peerSelector"),
        password=password,
        keep_original_next_hop=spec.bool("keepOriginalNextHop"),
        source_address=spec.one_of("sourceAddress", ("UseNodeIP", "None"), "UseNodeIP"),
        max_restart_time=_duration(spec, "maxRestartTime"),
        keepalive_time=_duration(spec, "keepaliveTime"),
        port=port,
        ttl_security=spec.int("ttlSecurity", 0, lo=0, hi=255) or 0,
        reachable_by=reachable_by,
    )
    if peer.peer_selector and peer.peer_ip:
        spec.fail("peerSelector", "peerSelector and peerIP are mutually exclusive")
    if not peer.peer_selector and not peer.peer_ip:
        spec.fail("peerIP", "a BGPPeer needs peerIP or peerSelector")
    if peer.peer_ip and peer.as_number is None:
        spec.fail("asNumber", "required with peerIP")
    if peer.peer_selector and peer.as_number is not None:
        spec.fail("asNumber", "must be empty when peerSelector is given (the peers' own AS "
                  "numbers are used)")
    if peer.node and peer.node_selector:
        spec.fail("nodeSelector", "node and nodeSelector are mutually exclusive")
    if reachable_by and (not peer_ip or ipaddress.ip_address(reachable_by).version
                         != ipaddress.ip_address(peer_ip).version):
        spec.fail("reachableBy", "needs a peerIP of the same IP version")
    return peer


def _settings(spec: Fields) -> tuple[tuple[str, str], ...]:
    out = []
    for k, v in spec.data.items():
        if not _FELIX_SETTING_RE.match(k):
            spec.fail(k, "not a FelixConfiguration setting name")
        if isinstance(v, dict | list):
            try:
                out.append((k, json.dumps(v, sort_keys=True)))
            except (TypeError, ValueError):
                spec.fail(k, "value cannot be represented as JSON")
        elif isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        elif isinstance(v, str | int | float):
            out.append((k, str(v)))
        elif v is not None:
            spec.fail(k, f"unsupported value of type {type(v).__name__}")
    return tuple(sorted(out))


def _felix_config(spec: Fields, key: ResourceKey, meta: Metadata) -> FelixConfiguration:
    return FelixConfiguration(key, meta, settings=_settings(spec))


def _block_affinity(spec: Fields, key: ResourceKey, meta: Metadata) -> BlockAffinity:
    spec.only({"node", "cidr", "state", "deleted", "type"})
    deleted = spec.raw("deleted")
    if deleted is not None and not isinstance(deleted, bool | str):
        spec.fail("deleted", "expected true/false")
    return BlockAffinity(key, meta, node=spec.str("node", required=True),
                         cidr=parse_net(spec.str("cidr", required=True), spec, "cidr"),
                         state=spec.one_of("state", ("confirmed", "pending",
                                                     "pendingDeletion"), "confirmed"),
                         deleted=str(deleted).lower() == "true")


# --- parsing: Kubernetes kinds --------------------------------------------------------------------

# Calico reads pod IPs from these annotations when status has none (its CNI plugin sets them).
ANNOTATION_POD_IPS = "cni.projectcalico.org/podIPs"
ANNOTATION_POD_IP = "cni.projectcalico.org/podIP"


def _container_ports(spec: Fields) -> tuple[ContainerPort, ...]:
    ports = []
    for group in ("containers", "initContainers"):
        for container in spec.items(group):
            for item in container.items("ports"):
                number = item.int("containerPort", lo=1, hi=65535)
                name = item.str("name")
                if name and not is_port_name(name):
                    item.fail("name", f"{name[:40]!r} is not a valid port name")
                protocol = protocol_number(item.raw("protocol") or "TCP", item, "protocol")
                if protocol not in (6, 17, 132):
                    item.fail("protocol", "must be TCP, UDP or SCTP")
                host_port = item.int("hostPort", 0, lo=0, hi=65535) or 0
                host_ip = _optional_ip(item, "hostIP")
                if number is None:
                    item.fail("containerPort", "required field is missing")
                if name or host_port:
                    assert protocol is not None
                    ports.append(ContainerPort(name, number, protocol, host_port, host_ip))
    return tuple(ports)


def _pod_ips(top: Fields, meta: Metadata) -> tuple[str, ...]:
    status = top.sub("status")
    found: list[tuple[Fields, str, Any]] = []
    for item in status.items("podIPs"):
        found.append((item, "ip", item.raw("ip")))
    if not found and status.has("podIP"):
        found.append((status, "podIP", status.raw("podIP")))
    if not found:
        annotations = meta.annotations_dict
        for name in (ANNOTATION_POD_IPS, ANNOTATION_POD_IP):
            if annotations.get(name):
                parts = annotations[name].split(",")
                holder = Fields({name: None}, top.resource, "metadata.annotations")
                found.extend((holder, name, p.strip()) for p in parts)
                break
    ips = []
    for fields, key, text in found:
        if not isinstance(text, str) or not text:
            fields.fail(key, "missing or not a string")
        try:
            ips.append(str(ipaddress.ip_interface(text.strip()).ip))
        except ValueError:
            fields.fail(key, f"invalid IP address {text[:60]!r}")
    return tuple(dict.fromkeys(ips))


def _pod(top: Fields, key: ResourceKey, meta: Metadata) -> Pod:
    spec = top.sub("spec")
    status = top.sub("status")
    node_name = spec.str("nodeName")
    if node_name and not is_dns_subdomain(node_name):
        spec.fail("nodeName", f"{node_name[:80]!r} is not a valid node name")
    service_account = (spec.str("serviceAccountName") or spec.str("serviceAccount")
                       or "default")
    if not is_dns_subdomain(service_account):
        spec.fail("serviceAccountName", f"{service_account[:80]!r} is not a valid name")
    return Pod(key, meta, node_name=node_name, pod_ips=_pod_ips(top, meta),
               phase=status.str("phase"), host_network=spec.bool("hostNetwork"),
               service_account_name=service_account,
               ports=_container_ports(spec),
               deleted=top.sub("metadata").raw("deletionTimestamp") is not None)


def _label_selector(fields: Fields) -> LabelSelector:
    fields.only({"matchLabels", "matchExpressions"})
    expressions = []
    for item in fields.items("matchExpressions", allowed={"key", "operator", "values"}):
        key = item.str("key", required=True)
        problem = qualified_name_problem(key)
        if problem:
            item.fail("key", f"invalid label key: {problem}")
        operator = item.str("operator", required=True)
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            item.fail("operator", f"{operator[:40]!r} is not one of In, NotIn, Exists, "
                      "DoesNotExist")
        values = item.str_list("values")
        if operator in ("In", "NotIn") and not values:
            item.fail("values", f"operator {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            item.fail("values", f"operator {operator} takes no values")
        for i, value in enumerate(values):
            problem = label_value_problem(value)
            if problem:
                item.fail(f"values[{i}]", f"invalid label value {value[:40]!r}: {problem}")
        expressions.append(LabelSelectorRequirement(key, operator, values))
    return LabelSelector(tuple(sorted(fields.labels("matchLabels").items())), tuple(expressions))


def _optional_selector(peer: Fields, key: str) -> LabelSelector | None:
    if peer.raw(key) is None:
        return None
    return _label_selector(peer.sub(key))


def _ip_block(peer: Fields) -> IPBlock:
    block = peer.sub("ipBlock", allowed={"cidr", "except"})
    cidr = parse_net(block.str("cidr", required=True), block, "cidr")
    network = ipaddress.ip_network(cidr)
    excepts = []
    for i, text in enumerate(block.list("except")):
        excluded = ipaddress.ip_network(parse_net(text, block, f"except[{i}]"))
        if (excluded.version != network.version or not excluded.subnet_of(network)  # type: ignore[arg-type]
                or excluded == network):
            block.fail(f"except[{i}]", f"{excluded} must be strictly inside cidr {cidr}")
        excepts.append(str(excluded))
    return IPBlock(cidr, tuple(excepts))


def _k8s_ports(item: Fields) -> tuple[K8sPort, ...]:
    ports = []
    for port in item.items("ports", allowed={"protocol", "port", "endPort"}):
        protocol = protocol_number(port.raw("protocol") or "TCP", port, "protocol")
        if protocol not in (6, 17, 132):
            port.fail("protocol", "must be TCP, UDP or SCTP")
        assert protocol is not None
        raw_port = port.raw("port")
        value: int | str | None
        if raw_port is None:
            value = None
        elif (isinstance(raw_port, int) and not isinstance(raw_port, bool)) or (
                isinstance(raw_port, str) and is_decimal(raw_port)):
            value = port.int("port", lo=1, hi=65535)
        elif isinstance(raw_port, str) and is_port_name(raw_port):
            value = raw_port
        else:
            port.fail("port", f"invalid port {str(raw_port)[:40]!r} (a number 1-65535 or a "
                      "port name)")
        end_port = port.int("endPort", lo=1, hi=65535)
        if end_port is not None and not (isinstance(value, int) and end_port >= value):
            port.fail("endPort", "needs a numeric port less than or equal to endPort")
        ports.append(K8sPort(protocol, value, end_port))
    return tuple(ports)


def _k8s_rules(spec: Fields, key: str, peer_key: str) -> tuple[K8sPolicyRule, ...]:
    rules = []
    for item in spec.items(key, allowed={peer_key, "ports"}):
        peers = []
        for peer in item.items(peer_key, allowed={"podSelector", "namespaceSelector",
                                                  "ipBlock"}):
            ip_block = _ip_block(peer) if peer.has("ipBlock") else None
            if ip_block and (peer.has("podSelector") or peer.has("namespaceSelector")):
                peer.fail("ipBlock", "ipBlock cannot be combined with podSelector or "
                          "namespaceSelector")
            parsed = K8sPeer(pod_selector=_optional_selector(peer, "podSelector"),
                             namespace_selector=_optional_selector(peer, "namespaceSelector"),
                             ip_block=ip_block)
            if parsed == K8sPeer():
                peer.fail("", "a peer needs podSelector, namespaceSelector or ipBlock")
            peers.append(parsed)
        rules.append(K8sPolicyRule(tuple(peers), _k8s_ports(item)))
    return tuple(rules)


def _k8s_np(spec: Fields, key: ResourceKey, meta: Metadata) -> K8sNetworkPolicy:
    spec.only({"podSelector", "policyTypes", "ingress", "egress"})
    ingress = _k8s_rules(spec, "ingress", "from")
    egress = _k8s_rules(spec, "egress", "to")
    types = spec.str_list("policyTypes")
    for i, t in enumerate(types):
        if t not in ("Ingress", "Egress"):
            spec.fail(f"policyTypes[{i}]", f"{t[:40]!r} is not Ingress or Egress")
    if not types:  # the API server's default: Ingress, plus Egress when egress rules exist
        types = ("Ingress", "Egress") if egress else ("Ingress",)
    if spec.raw("podSelector") is None and "podSelector" not in spec.data:
        spec.fail("podSelector", "required field is missing (use {} to select all pods)")
    return K8sNetworkPolicy(key, meta, pod_selector=_label_selector(spec.sub("podSelector")),
                            policy_types=tuple(dict.fromkeys(types)), ingress=ingress,
                            egress=egress)


def _namespace(top: Fields, key: ResourceKey, meta: Metadata) -> Namespace:
    return Namespace(key, meta)


def _service_account(top: Fields, key: ResourceKey, meta: Metadata) -> ServiceAccount:
    return ServiceAccount(key, meta)


# --- dispatch ---------------------------------------------------------------------------------

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
    "IPPool": _pool,
    "Node": _calico_node,
    "BGPConfiguration": _bgp_config,
    "BGPPeer": _bgp_peer,
    "FelixConfiguration": _felix_config,
    "BlockAffinity": _block_affinity,
}
# Kubernetes kinds: parser gets the whole document.
_K8S_PARSERS: dict[str, Parser] = {
    "Pod": _pod,
    "Namespace": _namespace,
    "ServiceAccount": _service_account,
    KIND_K8S_NETWORK_POLICY: lambda top, key, meta: _k8s_np(top.sub("spec"), key, meta),
    "Node": _k8s_node,
}
_CALICO_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec"})

KNOWN_KINDS = frozenset(_CALICO_PARSERS) | frozenset(_K8S_PARSERS)


def parse_resource(doc: Any) -> Resource:
    """Parse and validate one raw document. Raises ValidationError naming resource and field."""
    described = _describe(doc)
    _check_key_fields(doc, described)
    key = key_of(doc)
    described = str(key)
    api_version = doc.get("apiVersion")
    if key.kind in _CALICO_PARSERS and api_version == CALICO_API:
        top = Fields(doc, described, allowed=_CALICO_TOP_FIELDS | (
            {"status"} if key.kind == "Node" else set()))
        meta = _metadata(top.sub("metadata"), key)
        return _CALICO_PARSERS[key.kind](top.sub("spec"), key, meta)
    if key.kind in _K8S_PARSERS and api_version == K8S_API_BY_KIND[key.kind]:
        top = Fields(doc, described)
        meta = _metadata(top.sub("metadata"), key)
        return _K8S_PARSERS[key.kind](top, key, meta)
    if key.kind not in KNOWN_KINDS:
        raise ValidationError(described, "kind", f"unknown kind {key.kind[:60]!r}")
    expected = sorted({CALICO_API for k in [key.kind] if k in _CALICO_PARSERS}
                      | {K8S_API_BY_KIND[key.kind] for k in [key.kind] if k in _K8S_PARSERS})
    shown = repr(api_version)[:60]
    raise ValidationError(described, "apiVersion",
                          f"{shown} is not {' or '.join(repr(e) for e in expected)} "
                          f"for kind {key.kind}")


__all__ = [
    "CALICO_API",
    "K8S_KINDS",
    "KNOWN_KINDS",
    "RULE_FIELDS",
    "parse_resource",
]

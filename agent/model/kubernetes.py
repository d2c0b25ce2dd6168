"""Kubernetes objects pyfelix reads: Pod, Namespace, ServiceAccount, networking.k8s.io
NetworkPolicy (keyed `KubernetesNetworkPolicy`), typed and validated.

Inputs: the whole document as `Fields` (Kubernetes objects keep data in status and at the
top level, not only in spec). Outputs: frozen dataclasses, or `ValidationError`.

Strictness: these objects come from an API server and carry many fields pyfelix never
reads, so only the fields read here are checked - except NetworkPolicy, whose spec is small
and strict. Label keys/values and port names are checked as Kubernetes checks them, which
is what makes them safe to embed in selector text (`agent.conversion`).

Pod details: IPs from status.podIPs, else status.podIP, else Calico CNI's
`cni.projectcalico.org/podIPs`/`podIP` annotations; named ports (and host ports) from
containers and init containers, TCP/UDP/SCTP only; service account "default" when unset.
NetworkPolicy details: policyTypes default as the API server defaults them (Ingress, plus
Egress when there are egress rules); ipBlock except must lie strictly inside its cidr;
endPort needs a numeric port <= endPort; limits (agent.inputs.LIMITS) apply to what the
policy becomes: rules x peers <= max_rules_per_policy, and each label selector's Calico text
<= max_selector_length, all of them together <= max_selector_text_per_policy.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.inputs.limits import LIMITS
from pyfelix.agent.model.base import Metadata, Resource, optional_ip
from pyfelix.agent.model.fields import Fields
from pyfelix.agent.model.names import (
    is_decimal,
    is_dns_subdomain,
    is_port_name,
    label_value_problem,
    qualified_name_problem,
)
from pyfelix.agent.model.rules import (
    check_rule_count,
    check_selector_total,
    normalise_ip,
    parse_net,
    protocol_number,
)
from pyfelix.agent.syncer.api import ResourceKey


@dataclass(frozen=True, slots=True)
class ContainerPort:
    name: str
    port: int
    protocol: int = 6
    host_port: int = 0
    host_ip: str = ""


@dataclass(frozen=True, slots=True)
class Pod(Resource):
    node_name: str = ""
    pod_ips: tuple[str, ...] = ()
    phase: str = ""
    host_network: bool = False
    service_account_name: str = "default"
    ports: tuple[ContainerPort, ...] = ()
    deleted: bool = False  # deletionTimestamp set
    # cni.projectcalico.org/allowedSourcePrefixes: sources the pod may send from besides its
    # own addresses (the WorkloadEndpoint's allowSpoofedSourcePrefixes)
    allowed_source_prefixes: tuple[str, ...] = ()
    # cni.projectcalico.org/floatingIPs: external addresses NATed to the pod's first IP of the
    # same family (the WorkloadEndpoint's ipNATs)
    floating_ips: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Namespace(Resource):
    pass


@dataclass(frozen=True, slots=True)
class ServiceAccount(Resource):
    pass


@dataclass(frozen=True, slots=True)
class LabelSelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector; `None` at the use site means "not given"."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


@dataclass(frozen=True, slots=True)
class K8sPort:
    protocol: int = 6
    port: int | str | None = None  # number, name, or None for all ports
    end_port: int | None = None


@dataclass(frozen=True, slots=True)
class IPBlock:
    cidr: str
    except_: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class K8sPeer:
    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None


@dataclass(frozen=True, slots=True)
class K8sPolicyRule:
    peers: tuple[K8sPeer, ...] = ()  # empty: all sources/destinations
    ports: tuple[K8sPort, ...] = ()  # empty: all ports


@dataclass(frozen=True, slots=True)
class K8sNetworkPolicy(Resource):
    pod_selector: LabelSelector = LabelSelector()
    policy_types: tuple[str, ...] = ("Ingress",)
    ingress: tuple[K8sPolicyRule, ...] = ()
    egress: tuple[K8sPolicyRule, ...] = ()


# Calico reads pod IPs from these annotations when status has none (its CNI plugin sets them).
ANNOTATION_POD_IPS = "cni.projectcalico.org/podIPs"
ANNOTATION_POD_IP = "cni.projectcalico.org/podIP"
# A JSON list of CIDRs the pod may use as source addresses besides its own (Calico's CNI
# plugin and Felix read it; it becomes allowSpoofedSourcePrefixes).
ANNOTATION_ALLOWED_SOURCE_PREFIXES = "cni.projectcalico.org/allowedSourcePrefixes"


def _allowed_source_prefixes(top: Fields, meta: Metadata) -> tuple[str, ...]:
    text = meta.annotations_dict.get(ANNOTATION_ALLOWED_SOURCE_PREFIXES)
    if not text:
        return ()
    holder = Fields({ANNOTATION_ALLOWED_SOURCE_PREFIXES: None}, top.resource,
                    "metadata.annotations")
    try:
        items = json.loads(text)
    except ValueError:
        holder.fail(ANNOTATION_ALLOWED_SOURCE_PREFIXES,
                    f"{text[:60]!r} is not a JSON list of CIDRs")
    if not isinstance(items, list):
        holder.fail(ANNOTATION_ALLOWED_SOURCE_PREFIXES, "must be a JSON list of CIDRs")
    return tuple(parse_net(item, holder, f"{ANNOTATION_ALLOWED_SOURCE_PREFIXES}[{i}]")
                 for i, item in enumerate(items))


# A JSON list of IP addresses NATed to the pod (Calico's CNI plugin and libcalico-go's pod
# conversion read it; each becomes an ipNAT to the pod's first address of its family).
ANNOTATION_FLOATING_IPS = "cni.projectcalico.org/floatingIPs"


def _floating_ips(top: Fields, meta: Metadata) -> tuple[str, ...]:
    text = meta.annotations_dict.get(ANNOTATION_FLOATING_IPS)
    if not text:
        return ()
    holder = Fields({ANNOTATION_FLOATING_IPS: None}, top.resource, "metadata.annotations")
    try:
        items = json.loads(text)
    except ValueError:
        holder.fail(ANNOTATION_FLOATING_IPS, f"{text[:60]!r} is not a JSON list of IPs")
    if not isinstance(items, list):
        holder.fail(ANNOTATION_FLOATING_IPS, "must be a JSON list of IPs")
    out = []
    for i, item in enumerate(items):
        try:
            out.append(str(ipaddress.ip_address(str(item).strip())))
        except ValueError:
            holder.fail(ANNOTATION_FLOATING_IPS, f"[{i}]: {str(item)[:60]!r} is not an IP "
                                                 "address")
    return tuple(out)


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
                host_ip = optional_ip(item, "hostIP")
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
        if item.raw("ip") != "":  # an empty entry means "not assigned yet"
            found.append((item, "ip", item.raw("ip")))
    if not found and status.raw("podIP") not in (None, ""):
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
        address, _, prefix = text.strip().partition("/")  # annotations carry "/32"
        normalised = normalise_ip(address)
        if normalised is None or (prefix and not is_decimal(prefix)):
            fields.fail(key, f"invalid IP address {text[:60]!r}")
        ips.append(normalised)
    return tuple(dict.fromkeys(ips))


def parse_pod(top: Fields, key: ResourceKey, meta: Metadata) -> Pod:
    spec = top.sub("spec")
    status = top.sub("status")
    node_name = spec.str("nodeName")
    if node_name and not is_dns_subdomain(node_name):
        spec.fail("nodeName", f"{node_name[:80]!r} is not a valid node name")
    service_account = (spec.str("serviceAccountName") or spec.str("serviceAccount")
                       or "default")
    if not is_dns_subdomain(service_account):
        spec.fail("serviceAccountName", f"{service_account[:80]!r} is not a valid name")
    return Pod(key, meta, node_name=sys.intern(node_name), pod_ips=_pod_ips(top, meta),
               phase=status.str("phase"), host_network=spec.bool("hostNetwork"),
               service_account_name=sys.intern(service_account),
               ports=_container_ports(spec),
               allowed_source_prefixes=_allowed_source_prefixes(top, meta),
               floating_ips=_floating_ips(top, meta),
               deleted=top.sub("metadata").raw("deletionTimestamp") is not None)


# Characters a label selector's terms take at most as Calico selector text, beyond the keys
# and values themselves (agent.conversion: `k == 'v' && `, `k not in { 'a', 'b' } && `).
_TERM_OVERHEAD = 20
_VALUE_OVERHEAD = 4
_POD_SELECTOR_OVERHEAD = 64  # `projectcalico.org/orchestrator == 'k8s'` and its `&&`


def _converted_length(selector: LabelSelector) -> int:
    """An upper bound of the length of the Calico selector text `selector` becomes."""
    length = _POD_SELECTOR_OVERHEAD + sum(len(k) + len(v) + _TERM_OVERHEAD
                                          for k, v in selector.match_labels)
    for expr in selector.match_expressions:
        length += len(expr.key) + _TERM_OVERHEAD + sum(len(v) + _VALUE_OVERHEAD
                                                       for v in expr.values)
    return length


def _check_converted_length(fields: Fields, selector: LabelSelector) -> None:
    """The selector text it becomes must fit max_selector_length."""
    length = _converted_length(selector)
    if length > LIMITS.max_selector_length:
        fields.fail("", f"becomes a selector of about {length} characters, more than "
                    f"max_selector_length ({LIMITS.max_selector_length})")


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
    selector = LabelSelector(tuple(sorted(fields.labels("matchLabels").items())),
                             tuple(expressions))
    _check_converted_length(fields, selector)
    return selector


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


def _check_converted_rule_count(spec: Fields) -> None:
    """Converted, each rule is one Calico rule per peer (and protocol): rules x peers must
    fit max_rules_per_policy. Checked before any rule is parsed."""
    count = 0
    for key, peer_key in (("ingress", "from"), ("egress", "to")):
        for item in spec.list(key):
            peers = item.get(peer_key) if isinstance(item, dict) else None
            count += max(1, len(peers) if isinstance(peers, list) else 0)
    check_rule_count(spec, count)


def parse_kubernetes_network_policy(top: Fields, key: ResourceKey, meta: Metadata
                                    ) -> K8sNetworkPolicy:
    spec = top.sub("spec")
    spec.only({"podSelector", "policyTypes", "ingress", "egress"})
    _check_converted_rule_count(spec)
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
    policy = K8sNetworkPolicy(key, meta, pod_selector=_label_selector(spec.sub("podSelector")),
                              policy_types=tuple(dict.fromkeys(types)), ingress=ingress,
                              egress=egress)
    distinct = {policy.pod_selector} | {
        selector for rule in ingress + egress for peer in rule.peers
        for selector in (peer.pod_selector, peer.namespace_selector) if selector is not None}
    check_selector_total(spec, sum(_converted_length(s) for s in distinct))
    return policy


def parse_namespace(top: Fields, key: ResourceKey, meta: Metadata) -> Namespace:
    return Namespace(key, meta)


def parse_service_account(top: Fields, key: ResourceKey, meta: Metadata) -> ServiceAccount:
    return ServiceAccount(key, meta)

"""Kubernetes objects -> Calico model objects, as Calico's libcalico-go converts them.

Role: the validator stage calls `to_calico(resource)` for every parsed resource; Kubernetes
kinds become what Felix would see from Calico's Kubernetes datastore driver, every other
kind passes through unchanged.

Inputs: parsed, validated model objects (`agent.model`): Pod, Namespace, ServiceAccount,
K8sNetworkPolicy. Outputs: `{ResourceKey: Resource}` of Calico model objects (possibly
empty: a pod that should have no endpoint). Conversion of a valid model object never fails.

Conversions:
- Pod -> WorkloadEndpoint named `workload_endpoint_name(node, pod)`, i.e.
  `<node>-k8s-<pod>-eth0` with every `-` inside a part doubled (Calico's escaping, so the
  name splits back unambiguously: pod `web-1` on `node-a` -> `node--a-k8s-web--1-eth0`),
  keyed `WorkloadEndpoint` in the pod's namespace. workload = pod = pod name, orchestrator
  `k8s`, endpoint `eth0`; ipNetworks = the pod IPs as /32 or /128; named ports (and host
  ports) from every container and init container; labels = pod labels (minus any
  `pcns.`/`pcsa.` ones, which would impersonate inherited labels) plus
  `projectcalico.org/namespace`, `projectcalico.org/orchestrator: k8s` and
  `projectcalico.org/serviceaccount` (only when shorter than 63 characters, as Calico);
  profiles `kns.<ns>`, `ksa.<ns>.<sa>`; interface `workload_interface_name(ns, pod)`;
  ipNATs from the `cni.projectcalico.org/floatingIPs` annotation (each to the pod's first
  IP of its family).
  NO endpoint for pods that are host-networked, not scheduled (no nodeName), without IP,
  Succeeded/Failed/Completed, or being deleted (deletionTimestamp set: pyfelix drops the
  endpoint at once, where Calico waits for the CNI plugin to release the IP).
- Namespace -> Profile `kns.<ns>`: one allow-all ingress and one allow-all egress rule;
  labelsToApply `pcns.<key>: <value>` per namespace label plus
  `pcns.projectcalico.org/name: <ns>`.
- ServiceAccount -> Profile `ksa.<ns>.<sa>`: no rules; labelsToApply `pcsa.<key>` per label
  plus `pcsa.projectcalico.org/name: <sa>`.
- networking.k8s.io NetworkPolicy -> Calico NetworkPolicy `knp.default.<name>` in the same
  namespace, tier default, order 1000, selector from podSelector (always with
  `projectcalico.org/orchestrator == 'k8s'`), types from policyTypes. Each k8s rule becomes
  one Allow rule per (protocol, peer): ports grouped by protocol (sorted by protocol name,
  "any protocol" first), numeric ports merged into ranges, named ports kept; a port entry
  without port means every port of its protocol; no ports means any protocol. A peer gives
  selector (pod selector, or just the orchestrator term) and namespaceSelector (`all()`
  for `{}`); ipBlock gives nets and except -> notNets; no peers means any peer. A
  namespaceSelector stays in terms of namespace labels: `agent.model.policy_selectors`
  turns it into `pcns.` labels and adds "same namespace" when there is none.

Workload interface names (shared with the lab harness, whose veths must match): prefix +
the first 11 hex digits of sha1("<namespace>.<pod>") - see `workload_interface_name`.

Easy to get wrong: label keys and values are embedded in selector text; the model's label
validation guarantees keys match the selector key syntax and values carry no quotes, and
`quote_value` still refuses a value it cannot quote.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable

from pyfelix.agent.model import (
    IPNAT,
    EndpointPort,
    EntityRule,
    K8sNetworkPolicy,
    K8sPeer,
    K8sPolicyRule,
    K8sPort,
    LabelSelector,
    Metadata,
    Namespace,
    NetworkPolicy,
    Pod,
    Port,
    Profile,
    Resource,
    Rule,
    ServiceAccount,
    WorkloadEndpoint,
)
from pyfelix.agent.model.labels import (
    K8S_POLICY_PREFIX,
    LABEL_NAME,
    LABEL_NAMESPACE,
    LABEL_ORCHESTRATOR,
    LABEL_SERVICE_ACCOUNT,
    NAMESPACE_LABEL_PREFIX,
    NAMESPACE_PROFILE_PREFIX,
    ORCHESTRATOR_K8S,
    SERVICE_ACCOUNT_LABEL_PREFIX,
    SERVICE_ACCOUNT_PROFILE_PREFIX,
)
from pyfelix.agent.model.rules import PROTOCOL_NAMES
from pyfelix.agent.syncer.api import ResourceKey

DEFAULT_INTERFACE_PREFIX = "cali"
WORKLOAD_HASH_DIGITS = 11
IFNAME_MAX_LEN = 15
K8S_POLICY_ORDER = 1000.0
ENDPOINT_NAME = "eth0"
FINISHED_PHASES = frozenset({"Succeeded", "Failed", "Completed"})
ANNOTATION_CONTAINER_ID = "cni.projectcalico.org/containerID"
# Calico copies the service-account label only when it fits a label value.
_MAX_SA_LABEL_LEN = 63


# --- names ----------------------------------------------------------------------------------


def workload_interface_name(namespace: str, pod: str,
                            prefix: str = DEFAULT_INTERFACE_PREFIX) -> str:
    """Host-side veth name of a pod, as Calico's CNI plugin and Felix compute it.

    `prefix` + the first 11 lower-case hex digits of SHA-1 over the UTF-8 bytes of
    "<namespace>.<pod>"; e.g. ("default", "nginx") -> "cali" + sha1(b"default.nginx")[:11].
    A prefix longer than 4 characters would exceed Linux's 15-character limit: ValueError.
    """
    if len(prefix) + WORKLOAD_HASH_DIGITS > IFNAME_MAX_LEN:
        raise ValueError(f"interface prefix {prefix!r} is too long: prefix plus "
                         f"{WORKLOAD_HASH_DIGITS} hex digits must fit in {IFNAME_MAX_LEN} "
                         "characters")
    digest = hashlib.sha1(f"{namespace}.{pod}".encode()).hexdigest()
    return prefix + digest[:WORKLOAD_HASH_DIGITS]


def _escape(part: str) -> str:
    return part.replace("-", "--")


def workload_endpoint_name(node: str, pod: str, orchestrator: str = ORCHESTRATOR_K8S,
                           endpoint: str = ENDPOINT_NAME) -> str:
    """Calico's WorkloadEndpoint name: `<node>-<orchestrator>-<pod>-<endpoint>`, with `-`
    doubled inside each part (`node-a`, `web-1` -> `node--a-k8s-web--1-eth0`)."""
    return "-".join(_escape(p) for p in (node, orchestrator, pod, endpoint))


def namespace_profile_name(namespace: str) -> str:
    # interned: every endpoint of the namespace keeps it
    return sys.intern(NAMESPACE_PROFILE_PREFIX + namespace)


def service_account_profile_name(namespace: str, service_account: str) -> str:
    return sys.intern(f"{SERVICE_ACCOUNT_PROFILE_PREFIX}{namespace or 'default'}."
                      f"{service_account}")


def k8s_policy_name(name: str) -> str:
    return K8S_POLICY_PREFIX + name


# --- pods -----------------------------------------------------------------------------------


def pod_endpoint_problem(pod: Pod) -> str | None:
    """Why `pod` has no workload endpoint, or None when it has one."""
    if pod.host_network:
        return "pod uses the host network"
    if not pod.node_name:
        return "pod is not scheduled to a node"
    if pod.deleted:
        return "pod is being deleted"
    if pod.phase in FINISHED_PHASES:
        return f"pod has finished (phase {pod.phase})"
    if not pod.pod_ips:
        return "pod has no IP address yet"
    return None


def pod_endpoint_key(pod: Pod) -> ResourceKey:
    return ResourceKey("WorkloadEndpoint", pod.key.namespace,
                       workload_endpoint_name(pod.node_name, pod.key.name))


# (key, value) label pairs shared between endpoints: most of an endpoint's pairs (its
# namespace, orchestrator, app, tier...) are the same as thousands of others', and a pair
# tuple costs 56 bytes. Cleared when full, so it stays bounded and relearns what is common.
MAX_SHARED_LABEL_PAIRS = 16384
_label_pairs: dict[tuple[str, str], tuple[str, str]] = {}


def shared_label_pairs(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """`tuple(sorted(labels.items()))`, each pair the one already held for an equal pair."""
    pairs = []
    for pair in sorted(labels.items()):
        held = _label_pairs.get(pair)
        if held is None:
            if len(_label_pairs) >= MAX_SHARED_LABEL_PAIRS:
                _label_pairs.clear()
            held = _label_pairs[pair] = pair
        pairs.append(held)
    return tuple(pairs)


_profile_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}


def _shared_profiles(profiles: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple for every endpoint with the same profiles (a namespace's, a service
    account's), bounded like `shared_label_pairs`."""
    held = _profile_tuples.get(profiles)
    if held is None:
        if len(_profile_tuples) >= MAX_SHARED_LABEL_PAIRS:
            _profile_tuples.clear()
        held = _profile_tuples[profiles] = profiles
    return held


def _host_network(ip: str) -> str:
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def pod_to_workload_endpoint(pod: Pod, *, interface_prefix: str = DEFAULT_INTERFACE_PREFIX
                             ) -> WorkloadEndpoint | None:
    """The pod's WorkloadEndpoint, or None when it should have none (see module docstring)."""
    if pod_endpoint_problem(pod) is not None:
        return None
    namespace, name = pod.key.namespace, pod.key.name
    key = pod_endpoint_key(pod)
    # A pod's own pcns./pcsa. labels would impersonate namespace or service-account
    # labels: dropped, as libcalico-go drops them.
    labels = {k: v for k, v in pod.meta.labels
              if not k.startswith((NAMESPACE_LABEL_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX))}
    labels[LABEL_NAMESPACE] = namespace
    labels[LABEL_ORCHESTRATOR] = ORCHESTRATOR_K8S
    sa = pod.service_account_name
    if sa and len(sa) < _MAX_SA_LABEL_LEN:
        labels[LABEL_SERVICE_ACCOUNT] = sa
    profiles = [namespace_profile_name(namespace)]
    if sa:
        profiles.append(service_account_profile_name(namespace, sa))
    meta = Metadata(name=key.name, namespace=namespace, labels=shared_label_pairs(labels),
                    uid=pod.meta.uid, resource_version=pod.meta.resource_version)
    return WorkloadEndpoint(
        key, meta,
        node=pod.node_name,
        orchestrator=ORCHESTRATOR_K8S,
        workload=name,
        pod=name,
        endpoint=ENDPOINT_NAME,
        interface_name=workload_interface_name(namespace, name, interface_prefix),
        ip_networks=tuple(_host_network(ip) for ip in pod.pod_ips),
        profiles=_shared_profiles(tuple(profiles)),
        ports=tuple(EndpointPort(p.name, p.protocol, p.port, p.host_port, p.host_ip)
                    for p in pod.ports),
        service_account_name=sa,
        container_id=pod.meta.annotations_dict.get(ANNOTATION_CONTAINER_ID, ""),
        allow_spoofed_source_prefixes=pod.allowed_source_prefixes,
        ip_nats=_floating_ip_nats(pod),
    )


def _floating_ip_nats(pod: Pod) -> tuple[IPNAT, ...]:
    """Each floating IP NATed to the pod's first address of the same family (libcalico-go);
    one with no pod address of its family is left out."""
    nats = []
    for external in pod.floating_ips:
        v6 = ":" in external
        internal = next((ip for ip in pod.pod_ips if (":" in ip) == v6), None)
        if internal is not None:
            nats.append(IPNAT(internal, external))
    return tuple(nats)


# --- namespaces and service accounts --------------------------------------------------------


def _prefixed(labels: Iterable[tuple[str, str]], prefix: str, name: str
              ) -> tuple[tuple[str, str], ...]:
    out = {prefix + k: v for k, v in labels}
    out[prefix + LABEL_NAME] = name
    return tuple(sorted(out.items()))


def namespace_to_profile(namespace: Namespace) -> Profile:
    name = namespace_profile_name(namespace.key.name)
    return Profile(
        ResourceKey("Profile", "", name),
        Metadata(name=name, resource_version=namespace.meta.resource_version),
        ingress=(Rule("Allow"),),
        egress=(Rule("Allow"),),
        labels_to_apply=_prefixed(namespace.meta.labels, NAMESPACE_LABEL_PREFIX,
                                  namespace.key.name),
    )


def service_account_to_profile(account: ServiceAccount) -> Profile:
    name = service_account_profile_name(account.key.namespace, account.key.name)
    return Profile(
        ResourceKey("Profile", "", name),
        Metadata(name=name, resource_version=account.meta.resource_version),
        labels_to_apply=_prefixed(account.meta.labels, SERVICE_ACCOUNT_LABEL_PREFIX,
                                  account.key.name),
    )


# --- network policy -------------------------------------------------------------------------


def quote_value(value: str) -> str:
    """`value` as a selector string literal (single quotes unless it contains one)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"label value {value!r} contains both quote characters")


def label_selector_to_calico(selector: LabelSelector | None, *, pods: bool) -> str:
    """A Kubernetes label selector as Calico selector text (libcalico-go's spelling).

    Pod selectors always carry `projectcalico.org/orchestrator == 'k8s'`, even when absent
    (`None`); an empty namespace selector `{}` is `all()`; an absent one is "".
    """
    terms = [f"{LABEL_ORCHESTRATOR} == {quote_value(ORCHESTRATOR_K8S)}"] if pods else []
    if selector is None:
        return " && ".join(terms)
    if not pods and selector.is_empty:
        return "all()"
    terms.extend(f"{k} == {quote_value(v)}" for k, v in selector.match_labels)
    for expr in selector.match_expressions:
        values = ", ".join(quote_value(v) for v in expr.values)
        if expr.operator == "In":
            terms.append(f"{expr.key} in {{ {values} }}")
        elif expr.operator == "NotIn":
            terms.append(f"{expr.key} not in {{ {values} }}")
        elif expr.operator == "Exists":
            terms.append(f"has({expr.key})")
        else:  # DoesNotExist
            terms.append(f"! has({expr.key})")
    return " && ".join(terms) if terms else "all()"


def _merged_ports(ports: list[Port]) -> tuple[Port, ...]:
    """Named ports as given, then numeric ports merged into the fewest ranges, ascending."""
    named = [p for p in ports if p.name]
    ranges = sorted((p.first, p.last) for p in ports if not p.name)
    merged: list[list[int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return tuple(dict.fromkeys(named)) + tuple(Port(a, b) for a, b in merged)


def _ports_by_protocol(ports: tuple[K8sPort, ...]) -> list[tuple[int | None, tuple[Port, ...]]]:
    """[(protocol or None for any, ports or () for all ports)], sorted by protocol name."""
    if not ports:
        return [(None, ())]
    groups: dict[int, list[Port] | None] = {}
    for port in ports:
        if port.port is None:
            groups[port.protocol] = None  # every port of this protocol
            continue
        if isinstance(port.port, str):
            calico_port = Port(name=port.port)
        else:
            calico_port = Port(port.port, port.end_port or port.port)
        existing = groups.setdefault(port.protocol, [])
        if existing is not None:
            existing.append(calico_port)
    ordered = sorted(groups.items(), key=lambda item: PROTOCOL_NAMES.get(item[0], str(item[0])))
    return [(proto, _merged_ports(ps) if ps else ()) for proto, ps in ordered]


def _peer_entity(peer: K8sPeer | None, ports: tuple[Port, ...]) -> EntityRule:
    if peer is None:
        return EntityRule(ports=ports)
    if peer.ip_block is not None:
        return EntityRule(nets=(peer.ip_block.cidr,), not_nets=peer.ip_block.except_,
                          ports=ports)
    return EntityRule(
        selector=label_selector_to_calico(peer.pod_selector, pods=True),
        namespace_selector=label_selector_to_calico(peer.namespace_selector, pods=False),
        ports=ports,
    )


def k8s_rule_to_calico(rule: K8sPolicyRule, *, ingress: bool) -> tuple[Rule, ...]:
    """One Allow rule per (protocol, peer); ports go in the destination either way."""
    peers: tuple[K8sPeer | None, ...] = rule.peers or (None,)
    out: list[Rule] = []
    for protocol, ports in _ports_by_protocol(rule.ports):
        for peer in peers:
            if ingress:
                out.append(Rule("Allow", protocol=protocol, source=_peer_entity(peer, ()),
                                destination=EntityRule(ports=ports)))
            else:
                out.append(Rule("Allow", protocol=protocol,
                                destination=_peer_entity(peer, ports)))
    return tuple(out)


def k8s_policy_to_calico(policy: K8sNetworkPolicy) -> NetworkPolicy:
    name = k8s_policy_name(policy.key.name)
    namespace = policy.key.namespace
    types = tuple(t for t in ("Ingress", "Egress") if t in policy.policy_types) or ("Ingress",)
    return NetworkPolicy(
        ResourceKey("NetworkPolicy", namespace, name),
        Metadata(name=name, namespace=namespace, uid=policy.meta.uid,
                 resource_version=policy.meta.resource_version),
        is_global=False,
        order=K8S_POLICY_ORDER,
        selector=label_selector_to_calico(policy.pod_selector, pods=True),
        types=types,
        ingress=tuple(r for rule in policy.ingress for r in k8s_rule_to_calico(rule, ingress=True)),
        egress=tuple(r for rule in policy.egress for r in k8s_rule_to_calico(rule, ingress=False)),
    )


# --- dispatch -------------------------------------------------------------------------------


def to_calico(resource: Resource, *, interface_prefix: str = DEFAULT_INTERFACE_PREFIX
              ) -> dict[ResourceKey, Resource]:
    """What `resource` is in Calico's model: {key: object}; empty for a pod without endpoint.

    Non-Kubernetes resources map to themselves.
    """
    if isinstance(resource, Pod):
        endpoint = pod_to_workload_endpoint(resource, interface_prefix=interface_prefix)
        return {} if endpoint is None else {endpoint.key: endpoint}
    if isinstance(resource, Namespace):
        profile = namespace_to_profile(resource)
        return {profile.key: profile}
    if isinstance(resource, ServiceAccount):
        profile = service_account_to_profile(resource)
        return {profile.key: profile}
    if isinstance(resource, K8sNetworkPolicy):
        converted = k8s_policy_to_calico(resource)
        return {converted.key: converted}
    return {resource.key: resource}


def natural_output_key(key: ResourceKey) -> ResourceKey | None:
    """The Calico key a raw key converts to when that follows from the key alone (None for
    pods, whose endpoint name depends on the node)."""
    if key.kind == "Namespace":
        return ResourceKey("Profile", "", namespace_profile_name(key.name))
    if key.kind == "ServiceAccount":
        return ResourceKey("Profile", "", service_account_profile_name(key.namespace, key.name))
    if key.kind == "KubernetesNetworkPolicy":
        return ResourceKey("NetworkPolicy", key.namespace, k8s_policy_name(key.name))
    if key.kind == "Pod":
        return None
    return key

"""Short builders for the documents conformance cases apply (Kubernetes and Calico v3).

Role: keep the case tables readable. Each builder returns a plain dict, exactly the YAML a
user would write; nothing here is interpreted or defaulted beyond what the builder names.

Inputs: names, selectors and rule dicts as the APIs spell them.
Outputs: documents with `apiVersion`, `kind`, `metadata` (and `spec`), ready for the lab
datastore. `ref_of(doc)` gives the (kind, namespace, name) identity a step deletes by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CALICO_API = "projectcalico.org/v3"
K8S_NETWORKING_API = "networking.k8s.io/v1"

Doc = dict[str, Any]


def ref_of(doc: Mapping[str, Any]) -> tuple[str, str | None, str]:
    metadata = doc["metadata"]
    return str(doc["kind"]), metadata.get("namespace"), str(metadata["name"])


# --- Kubernetes NetworkPolicy ------------------------------------------------------------

def labels(**match: str) -> dict[str, Any]:
    """A LabelSelector with matchLabels (no arguments: `{}`, which selects everything)."""
    return {"matchLabels": dict(match)} if match else {}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A LabelSelector with one matchExpressions entry."""
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return {"matchExpressions": [requirement]}


def peer(*, pods: dict[str, Any] | None = None, namespaces: dict[str, Any] | None = None,
         cidr: str | None = None, except_: Iterable[str] = ()) -> dict[str, Any]:
    """One NetworkPolicyPeer; podSelector + namespaceSelector in one peer mean AND."""
    result: dict[str, Any] = {}
    if pods is not None:
        result["podSelector"] = pods
    if namespaces is not None:
        result["namespaceSelector"] = namespaces
    if cidr is not None:
        block: dict[str, Any] = {"cidr": cidr}
        if except_:
            block["except"] = list(except_)
        result["ipBlock"] = block
    return result


def port(number: int | str, protocol: str = "TCP", end: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"port": number, "protocol": protocol}
    if end is not None:
        entry["endPort"] = end
    return entry


def any_port(protocol: str) -> dict[str, Any]:
    return {"protocol": protocol}


def k8s_rule(peers: Iterable[dict[str, Any]] | None = None,
             ports: Iterable[dict[str, Any]] | None = None, *, egress: bool = False
             ) -> dict[str, Any]:
    """An ingress (`from`) or egress (`to`) rule; None leaves the field out (= everything)."""
    rule: dict[str, Any] = {}
    if peers is not None:
        rule["to" if egress else "from"] = list(peers)
    if ports is not None:
        rule["ports"] = list(ports)
    return rule


def knp(name: str, namespace: str, pod_selector: dict[str, Any], *,
        ingress: list[dict[str, Any]] | None = None,
        egress: list[dict[str, Any]] | None = None,
        types: Iterable[str] = ("Ingress",)) -> Doc:
    """A networking.k8s.io/v1 NetworkPolicy; `ingress`/`egress` None leaves the list out."""
    spec: dict[str, Any] = {"podSelector": pod_selector, "policyTypes": list(types)}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"apiVersion": K8S_NETWORKING_API, "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


# --- Calico v3 ----------------------------------------------------------------------------

def rule(action: str, **fields: Any) -> dict[str, Any]:
    """A Calico rule: `rule("Allow", protocol="TCP", source={...}, destination={...})`.
    Python names for the two reserved/awkward ones: not_protocol, not_icmp."""
    renamed = {"not_protocol": "notProtocol", "not_icmp": "notICMP"}
    return {"action": action, **{renamed.get(k, k): v for k, v in fields.items()}}


def _calico_policy(kind: str, name: str, namespace: str | None, *, selector: str,
                   order: float | None, tier: str | None, types: Iterable[str],
                   ingress: list[dict[str, Any]] | None, egress: list[dict[str, Any]] | None,
                   extra: Mapping[str, Any]) -> Doc:
    spec: dict[str, Any] = {}
    if tier is not None:
        spec["tier"] = tier
    if order is not None:
        spec["order"] = order
    spec["selector"] = selector
    spec.update(extra)
    spec["types"] = list(types)
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": CALICO_API, "kind": kind, "metadata": metadata, "spec": spec}


def gnp(name: str, *, selector: str = "all()", order: float | None = None,
        tier: str | None = None, types: Iterable[str] = ("Ingress",),
        ingress: list[dict[str, Any]] | None = None, egress: list[dict[str, Any]] | None = None,
        namespace_selector: str | None = None, service_account_selector: str | None = None
        ) -> Doc:
    extra: dict[str, Any] = {}
    if namespace_selector is not None:
        extra["namespaceSelector"] = namespace_selector
    if service_account_selector is not None:
        extra["serviceAccountSelector"] = service_account_selector
    return _calico_policy("GlobalNetworkPolicy", name, None, selector=selector, order=order,
                          tier=tier, types=types, ingress=ingress, egress=egress, extra=extra)


def cnp(name: str, namespace: str, *, selector: str = "all()", order: float | None = None,
        tier: str | None = None, types: Iterable[str] = ("Ingress",),
        ingress: list[dict[str, Any]] | None = None, egress: list[dict[str, Any]] | None = None
        ) -> Doc:
    """A Calico (namespaced) NetworkPolicy."""
    return _calico_policy("NetworkPolicy", name, namespace, selector=selector, order=order,
                          tier=tier, types=types, ingress=ingress, egress=egress, extra={})


def tier(name: str, order: float, default_action: str | None = None) -> Doc:
    spec: dict[str, Any] = {"order": order}
    if default_action is not None:
        spec["defaultAction"] = default_action
    return {"apiVersion": CALICO_API, "kind": "Tier", "metadata": {"name": name}, "spec": spec}


def global_network_set(name: str, nets: Iterable[str], **set_labels: str) -> Doc:
    return {"apiVersion": CALICO_API, "kind": "GlobalNetworkSet",
            "metadata": {"name": name, "labels": dict(set_labels)},
            "spec": {"nets": list(nets)}}


def network_set(name: str, namespace: str, nets: Iterable[str], **set_labels: str) -> Doc:
    return {"apiVersion": CALICO_API, "kind": "NetworkSet",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(set_labels)},
            "spec": {"nets": list(nets)}}


def service_account(name: str, namespace: str, **account_labels: str) -> Doc:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(account_labels)}}

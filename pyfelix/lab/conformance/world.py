"""The conformance world: namespaces x, y, z with pods a, b, c each, as upstream's netpol e2e.

Role: the fixed cluster every conformance case runs against, and the TRUTH MODEL's view of
it. Cases may change the world (relabel a pod or a namespace, give a pod a service account,
remove a pod's document); `World.apply(change)` gives the world a case sees, and
`World.documents(base)` the Namespace/Pod documents that describe it in the datastore.

Inputs: nothing (the layout is constant); a `WorldChange` per case; the lab's own topology
documents (`base`), so a changed Pod/Namespace document differs from the lab's only in what
the case changed.
Outputs: `Pod` views (namespace, name, IP, labels, namespace labels, service account) for
the expectation functions; the scenario data (`scenario_data()`) the lab builds the pods
from; `Column`s (what one probe of a matrix cell tests).

Invariants:
- Pod IPs are fixed: namespace x/y/z -> 10.65.1/2/3.0/24, pod a/b/c -> .10/.11/.12, so a
  case can name CIDRs (ipBlock, nets, network sets) that cover exactly the pods it means.
- Every pod serves TCP 80, TCP 81 and UDP 80 under the names serve-80-tcp, serve-81-tcp and
  serve-80-udp. Pods a and b also carry `app: web` (for Exists / DoesNotExist cases).
- Nothing here knows about the agent: expectations are written against these views only.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NAMESPACES = ("x", "y", "z")
POD_NAMES = ("a", "b", "c")
NAMESPACE_SUBNETS = {
    "x": ipaddress.IPv4Network("10.65.1.0/24"),
    "y": ipaddress.IPv4Network("10.65.2.0/24"),
    "z": ipaddress.IPv4Network("10.65.3.0/24"),
}
POD_HOST_NUMBERS = {"a": 10, "b": 11, "c": 12}
BASE_POD_LABELS: dict[str, dict[str, str]] = {
    "a": {"pod": "a", "app": "web"},
    "b": {"pod": "b", "app": "web"},
    "c": {"pod": "c"},
}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
SERVED_PORTS = (
    {"port": 80, "protocol": "TCP", "name": "serve-80-tcp"},
    {"port": 81, "protocol": "TCP", "name": "serve-81-tcp"},
    {"port": 80, "protocol": "UDP", "name": "serve-80-udp"},
)


@dataclass(frozen=True, order=True)
class Column:
    """What one probe tests: a protocol and, for TCP/UDP, a port (ICMP: echo request)."""

    protocol: str  # "TCP" | "UDP" | "ICMP"
    port: int | None = None
    name: str | None = None  # the named port the pods serve it under

    def __str__(self) -> str:
        return self.protocol if self.port is None else f"{self.protocol}/{self.port}"


TCP_80 = Column("TCP", 80, "serve-80-tcp")
TCP_81 = Column("TCP", 81, "serve-81-tcp")
UDP_80 = Column("UDP", 80, "serve-80-udp")
ICMP_ECHO = Column("ICMP")
STANDARD_COLUMNS = (TCP_80, TCP_81, UDP_80)
WITH_ICMP = (*STANDARD_COLUMNS, ICMP_ECHO)


def pod_ip(namespace: str, name: str) -> ipaddress.IPv4Address:
    return NAMESPACE_SUBNETS[namespace].network_address + POD_HOST_NUMBERS[name]


ALL_POD_KEYS = tuple(f"{ns}/{name}" for ns in NAMESPACES for name in POD_NAMES)


@dataclass(frozen=True)
class Pod:
    """The truth model's view of one pod in one case's world."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str]
    service_account: str | None = None
    present: bool = True

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return pod_ip(self.namespace, self.name)

    def in_net(self, cidr: str) -> bool:
        return self.ip in ipaddress.IPv4Network(cidr)


@dataclass(frozen=True)
class WorldChange:
    """How one case's world differs from the base world (all fields optional).

    `pod_labels` REPLACES a pod's labels; `namespace_labels` replaces a namespace's own
    labels (the `kubernetes.io/metadata.name` label is always kept, as Kubernetes does);
    `absent` pods have no Pod document (their namespace, veth and servers stay).
    """

    pod_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    service_accounts: Mapping[str, str] = field(default_factory=dict)
    absent: frozenset[str] = frozenset()

    def problems(self) -> list[str]:
        found = [f"unknown pod {key!r}" for key in
                 [*self.pod_labels, *self.service_accounts, *self.absent]
                 if key not in ALL_POD_KEYS]
        found += [f"unknown namespace {ns!r}" for ns in self.namespace_labels
                  if ns not in NAMESPACES]
        return found


@dataclass(frozen=True)
class World:
    pods: Mapping[str, Pod]

    @classmethod
    def base(cls) -> World:
        return cls.with_change(WorldChange())

    @classmethod
    def with_change(cls, change: WorldChange) -> World:
        problems = change.problems()
        if problems:
            raise ValueError("bad world change: " + "; ".join(problems))
        pods: dict[str, Pod] = {}
        for ns in NAMESPACES:
            ns_labels = {NAMESPACE_NAME_LABEL: ns,
                         **change.namespace_labels.get(ns, {"ns": ns})}
            for name in POD_NAMES:
                key = f"{ns}/{name}"
                pods[key] = Pod(
                    namespace=ns,
                    name=name,
                    labels=dict(change.pod_labels.get(key, BASE_POD_LABELS[name])),
                    namespace_labels=ns_labels,
                    service_account=change.service_accounts.get(key),
                    present=key not in change.absent,
                )
        return cls(pods)

    def documents(self, base: Mapping[tuple[str, str | None, str], dict[str, Any]]
                  ) -> dict[tuple[str, str | None, str], dict[str, Any]]:
        """This world's Namespace and Pod documents, each a copy of the lab's `base`
        document with only the case's changes applied. Keys: (kind, namespace, name)."""
        docs: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        for ns in NAMESPACES:
            key = ("Namespace", None, ns)
            doc = copy.deepcopy(base[key])
            doc["metadata"]["labels"] = dict(self.pods[f"{ns}/a"].namespace_labels)
            docs[key] = doc
        for pod in self.pods.values():
            if not pod.present:
                continue
            key = ("Pod", pod.namespace, pod.name)
            doc = copy.deepcopy(base[key])
            doc["metadata"]["labels"] = dict(pod.labels)
            if pod.service_account is not None:
                doc["spec"]["serviceAccountName"] = pod.service_account
            docs[key] = doc
        return docs


def scenario_data(name: str = "conformance", nodes: int = 1) -> dict[str, Any]:
    """The lab scenario (namespaces and pods, no steps) of the base world. With several
    nodes, pods are spread round-robin (x/a node1, x/b node2, ...), so every namespace has
    pods on more than one node and policy must hold across the BGP-routed underlay."""
    if not 1 <= nodes <= len(ALL_POD_KEYS):
        raise ValueError(f"nodes must be 1-{len(ALL_POD_KEYS)}, not {nodes}")
    node_names = [f"node{i + 1}" for i in range(nodes)]
    data: dict[str, Any] = {
        "name": name,
        "namespaces": [{"name": ns, "labels": {"ns": ns}} for ns in NAMESPACES],
        "pods": [
            {"namespace": ns, "name": pod, "ip": str(pod_ip(ns, pod)),
             "labels": dict(BASE_POD_LABELS[pod]), "ports": [dict(p) for p in SERVED_PORTS],
             "node": node_names[ALL_POD_KEYS.index(f"{ns}/{pod}") % nodes]}
            for ns in NAMESPACES for pod in POD_NAMES
        ],
    }
    if nodes > 1:
        data["nodes"] = node_names
    return data

"""What the Kubernetes datastore reads, where it lives in the API, and how objects become
the documents the rest of pyfelix parses.

Role: the table of watched resource types (`RESOURCE_TYPES`) and the conversions between
API objects and pyfelix documents, shared by the Kubernetes syncer (`agent.syncer.kube`)
and client (`agent.syncer.kube_store`).

Resource types: Kubernetes' own Pods (every node's: other nodes' pods feed IP sets),
Namespaces, ServiceAccounts, Nodes and networking.k8s.io/v1 NetworkPolicies; and Calico's
CRDs (`crd.projectcalico.org/v1`, plural names) for the v3 kinds Calico keeps in CRDs in
its Kubernetes datastore mode. Profiles, WorkloadEndpoints and Calico Nodes are not CRDs
there: Calico derives them from Namespaces/ServiceAccounts, Pods and Nodes, and so does
pyfelix (in `agent.conversion`; `DERIVED_KINDS`).

RBAC: `node_rbac_rules()` is what the node's ClusterRole (deploy/base/clusterrole.yaml)
must grant, derived from these tables: `READ_VERBS` on `NODE_READ_TYPES` (the watched types
plus `SERVICE_TYPES`, Services and EndpointSlices). tests/deploy checks the manifest
against it exactly, so a type added here without its rule (or a rule left behind when a
type goes) fails the suite.

Conversions (object -> document):
- Kubernetes kinds: the object as served, with `apiVersion`/`kind` filled in (list
  responses leave them out of items) and `metadata.managedFields` dropped (large, unused);
- Calico CRDs -> `projectcalico.org/v3` documents the model parses: same kind and spec;
  metadata reduced to name, namespace, labels and annotations, where Calico's own
  bookkeeping annotation `projectcalico.org/metadata` (the v3 metadata that has no CRD
  field) is removed, as libcalico-go does when it reads a CRD.
The reverse (`to_crd_object`) is used by `apply`: apiVersion `crd.projectcalico.org/v1`,
labels and annotations kept on the object.

Invariants: `to_document` of `to_crd_object(doc)` gives back `doc` for any document whose
metadata holds only name, namespace, labels and annotations; converted documents carry the
key the object's type says (`key_of(doc).kind == rtype.kind`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from agent.syncer.api import K8S_NETWORKING_API, KIND_K8S_NETWORK_POLICY
from agent.syncer.client import CALICO_API

CRD_GROUP_VERSION = "crd.projectcalico.org/v1"
CALICO_METADATA_ANNOTATION = "projectcalico.org/metadata"
_KEPT_METADATA = ("name", "namespace", "labels", "annotations")


@dataclass(frozen=True)
class ResourceType:
    """One API resource the Kubernetes datastore lists and watches."""

    kind: str  # the ResourceKey kind its objects are keyed as
    object_kind: str  # `kind` in API objects
    group_version: str  # "v1", "networking.k8s.io/v1", "crd.projectcalico.org/v1"
    plural: str
    namespaced: bool

    @property
    def is_crd(self) -> bool:
        return self.group_version == CRD_GROUP_VERSION

    @property
    def base_path(self) -> str:
        if self.group_version == "v1":
            return "/api/v1"
        return f"/apis/{self.group_version}"

    def collection_path(self, namespace: str | None = None) -> str:
        """The list/watch path: every namespace, or one."""
        if namespace and self.namespaced:
            return f"{self.base_path}/namespaces/{namespace}/{self.plural}"
        return f"{self.base_path}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        return f"{self.collection_path(namespace if self.namespaced else None)}/{name}"

    def __str__(self) -> str:
        group = api_group(self)
        return f"{self.plural}.{group}" if group else self.plural


def _crd(kind: str, plural: str, namespaced: bool = False) -> ResourceType:
    return ResourceType(kind, kind, CRD_GROUP_VERSION, plural, namespaced)


KUBERNETES_TYPES: tuple[ResourceType, ...] = (
    ResourceType("Namespace", "Namespace", "v1", "namespaces", False),
    ResourceType("ServiceAccount", "ServiceAccount", "v1", "serviceaccounts", True),
    ResourceType("Pod", "Pod", "v1", "pods", True),
    ResourceType("Node", "Node", "v1", "nodes", False),
    ResourceType(KIND_K8S_NETWORK_POLICY, "NetworkPolicy", K8S_NETWORKING_API,
                 "networkpolicies", True),
)
CRD_TYPES: tuple[ResourceType, ...] = (
    _crd("Tier", "tiers"),
    _crd("GlobalNetworkPolicy", "globalnetworkpolicies"),
    _crd("NetworkPolicy", "networkpolicies", namespaced=True),
    _crd("GlobalNetworkSet", "globalnetworksets"),
    _crd("NetworkSet", "networksets", namespaced=True),
    _crd("HostEndpoint", "hostendpoints"),
    _crd("IPPool", "ippools"),
    _crd("BGPConfiguration", "bgpconfigurations"),
    _crd("BGPPeer", "bgppeers"),
    _crd("FelixConfiguration", "felixconfigurations"),
    _crd("ClusterInformation", "clusterinformations"),
    _crd("BlockAffinity", "blockaffinities"),
)
RESOURCE_TYPES: tuple[ResourceType, ...] = KUBERNETES_TYPES + CRD_TYPES
CRD_TYPE_BY_KIND = {rtype.kind: rtype for rtype in CRD_TYPES}
# Services and their EndpointSlices: granted to the node for the agent's service handling
# (Calico's node reads both for its BPF kube-proxy replacement and service advertisement;
# pyfelix's Typha discovery lists EndpointSlices already). Not in RESOURCE_TYPES: the
# syncer starts watching them once the model parses them (they would be counted as
# validation errors of an unknown kind until then).
SERVICE_TYPES: tuple[ResourceType, ...] = (
    ResourceType("Service", "Service", "v1", "services", True),
    ResourceType("EndpointSlice", "EndpointSlice", "discovery.k8s.io/v1", "endpointslices",
                 True),
)
# Calico kinds that have no API resource of their own in the Kubernetes datastore: pyfelix
# derives them (agent.conversion) from the objects of these kinds, as Calico's KDD mode does.
DERIVED_KINDS: dict[str, tuple[str, ...]] = {
    "WorkloadEndpoint": ("Pod",),
    "Profile": ("Namespace", "ServiceAccount"),
}
# What the node's service account (agent, confd, Typha) may do in the Kubernetes API: these
# verbs on every type of NODE_READ_TYPES, nothing else. deploy/base/clusterrole.yaml must
# grant exactly this (tests/deploy compares the two). Reads only: in the Kubernetes
# datastore pyfelix keeps no status objects (agent.status) and `pyfelix apply` writes with
# the user's own credentials.
READ_VERBS: tuple[str, ...] = ("get", "list", "watch")
NODE_READ_TYPES: tuple[ResourceType, ...] = RESOURCE_TYPES + SERVICE_TYPES


def api_group(rtype: ResourceType) -> str:
    """The RBAC apiGroup of a type: "" for core/v1, else the group of its group/version."""
    return rtype.group_version.rpartition("/")[0]


def node_rbac_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every right the node's ClusterRole must hold."""
    return {(api_group(rtype), rtype.plural, verb) for rtype in NODE_READ_TYPES
            for verb in READ_VERBS}


def crd_type(kind: str) -> ResourceType | None:
    """The CRD type storing a Calico kind, or None if Calico keeps no CRD for it."""
    return CRD_TYPE_BY_KIND.get(kind)


def _reduced_metadata(metadata: Any) -> dict[str, Any]:
    meta = metadata if isinstance(metadata, dict) else {}
    reduced: dict[str, Any] = {}
    for field in _KEPT_METADATA:
        value = meta.get(field)
        if field == "annotations" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != CALICO_METADATA_ANNOTATION}
        if value not in (None, "", {}):
            reduced[field] = copy.deepcopy(value)
    return reduced


def to_document(rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The pyfelix document for an API object of `rtype` (see module docstring)."""
    if rtype.is_crd:
        doc: dict[str, Any] = {"apiVersion": CALICO_API, "kind": rtype.kind,
                               "metadata": _reduced_metadata(obj.get("metadata"))}
        if "spec" in obj:
            doc["spec"] = copy.deepcopy(obj["spec"])
        return doc
    doc = {"apiVersion": rtype.group_version, "kind": rtype.object_kind}
    for field, value in obj.items():
        if field in ("apiVersion", "kind"):
            continue
        if field == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "managedFields"}
        doc[field] = value
    return doc


def to_crd_object(doc: dict[str, Any]) -> dict[str, Any]:
    """The crd.projectcalico.org/v1 object that stores a projectcalico.org/v3 document."""
    obj: dict[str, Any] = {"apiVersion": CRD_GROUP_VERSION, "kind": doc["kind"],
                           "metadata": _reduced_metadata(doc.get("metadata"))}
    if "spec" in doc:
        obj["spec"] = copy.deepcopy(doc["spec"])
    return obj

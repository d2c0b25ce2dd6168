"""What the Kubernetes datastore reads, where it lives in the API, and how objects become
the documents the rest of pyfelix parses.

Role: the watched resource types (`RESOURCE_TYPES`, a view of the kind catalogue in
`agent.kinds`) and the conversions between API objects and pyfelix documents, shared by
the Kubernetes syncer (`agent.syncer.kube`) and client (`agent.syncer.kube_store`).

Resource types: Kubernetes' own Pods (every node's: other nodes' pods feed IP sets),
Namespaces, ServiceAccounts, Nodes, networking.k8s.io/v1 NetworkPolicies, v1 Services and
discovery.k8s.io/v1 EndpointSlices; and Calico's
CRDs (`crd.projectcalico.org/v1`, plural names) for the v3 kinds Calico keeps in CRDs in
its Kubernetes datastore mode. Profiles, WorkloadEndpoints and Calico Nodes are not CRDs
there: Calico derives them from Namespaces/ServiceAccounts, Pods and Nodes, and so does
pyfelix (in `agent.conversion`; `DERIVED_KINDS`).

RBAC: `node_rbac_rules()` is what the node's ClusterRole (deploy/base/clusterrole.yaml)
must grant, derived from these tables: `READ_VERBS` on `NODE_READ_TYPES` (the watched
types). tests/deploy checks the manifest
against it exactly, so a type added here without its rule (or a rule left behind when a
type goes) fails the suite. Secrets (BGP passwords, confd only) are read in ONE namespace:
`namespace_rbac_rules()`, a Role there (deploy/base/role.yaml), never the ClusterRole;
`resource_types(syncer_type)` gives each syncer its types (the agent's: no Secrets;
confd's: Secrets of `agent.kinds.secret_namespace()` only).

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
import dataclasses
from typing import Any

from pyfelix.agent.kinds import (
    CALICO_API,
    CRD_GROUP_VERSION,
    KIND_BY_NAME,
    KINDS,
    ResourceType,
    secret_namespace,
)

CALICO_METADATA_ANNOTATION = "projectcalico.org/metadata"
_KEPT_METADATA = ("name", "namespace", "labels", "annotations")

# Views of the kind catalogue (agent.kinds), in its order: Kubernetes' own resources, then
# Calico's CRDs.
KUBERNETES_TYPES: tuple[ResourceType, ...] = tuple(
    info.kube for info in KINDS if info.kube is not None and not info.kube.is_crd)
CRD_TYPES: tuple[ResourceType, ...] = tuple(
    info.kube for info in KINDS if info.kube is not None and info.kube.is_crd)
RESOURCE_TYPES: tuple[ResourceType, ...] = KUBERNETES_TYPES + CRD_TYPES
CRD_TYPE_BY_KIND = {rtype.kind: rtype for rtype in CRD_TYPES}
# Calico kinds that have no API resource of their own in the Kubernetes datastore: pyfelix
# derives them (agent.conversion) from the objects of these kinds, as Calico's KDD mode does.
DERIVED_KINDS: dict[str, tuple[str, ...]] = {
    info.kind: info.derived_from for info in KINDS if info.derived_from}
# What the node's service account (agent, confd, Typha) may do in the Kubernetes API: these
# verbs on every type of NODE_READ_TYPES, nothing else. deploy/base/clusterrole.yaml must
# grant exactly this (tests/deploy compares the two). Reads only: in the Kubernetes
# datastore pyfelix keeps no status objects (agent.status) and `pyfelix apply` writes with
# the user's own credentials.
READ_VERBS: tuple[str, ...] = ("get", "list", "watch")
# Types read in one namespace only (Secrets: BGP passwords, for confd), granted by a Role in
# that namespace (deploy/base/role.yaml), never by the ClusterRole.
NAMESPACE_READ_TYPES: tuple[ResourceType, ...] = tuple(
    info.kube for info in KINDS if info.kube is not None and not info.felix)
NODE_READ_TYPES: tuple[ResourceType, ...] = tuple(
    rtype for rtype in RESOURCE_TYPES if rtype not in NAMESPACE_READ_TYPES)


def node_rbac_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every right the node's ClusterRole must hold."""
    return {(rtype.api_group, rtype.plural, verb) for rtype in NODE_READ_TYPES
            for verb in READ_VERBS}


def namespace_rbac_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the node's Role in the Secrets' namespace must hold."""
    return {(rtype.api_group, rtype.plural, verb) for rtype in NAMESPACE_READ_TYPES
            for verb in READ_VERBS}


def resource_types(syncer_type: str = "felix", *,
                   namespace: str | None = None) -> tuple[ResourceType, ...]:
    """The types a Kubernetes syncer of `syncer_type` watches: "felix" (the agent) every
    type but the confd-only Secrets; "bgp" (confd) every type, the Secrets in `namespace`
    only (default: `agent.kinds.secret_namespace()`)."""
    if syncer_type == "felix":
        return tuple(r for r in RESOURCE_TYPES if KIND_BY_NAME[r.kind].felix)
    ns = namespace or secret_namespace()
    return tuple(dataclasses.replace(r, namespace=ns) if r in NAMESPACE_READ_TYPES else r
                 for r in RESOURCE_TYPES)


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

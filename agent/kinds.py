"""The kind catalogue: every resource kind pyfelix reads, and where each one lives.

Role: the one table (`KINDS`, a `KindInfo` per kind) that every datastore backend, the
validator and the CLI read, so that a kind's facts are written once:

    KindInfo ──┬── document form (apiVersion, kind:)  -> minimal validation, `apply`/`get`
               ├── plural, namespaced                 -> CLI names, default namespace
               ├── etcd directory (+ plural)          -> agent.syncer.etcd_keys
               ├── Kubernetes API resource (or the     -> agent.syncer.kube_resources
               │   kinds it is derived from)             (watch paths, CRDs, RBAC)
               ├── bgp: read by confd                 -> BGP_KINDS (confd's view, Typha)
               ├── felix: read by the agent           -> FELIX_KINDS (not Secrets)
               └── parsed by the model                -> agent.model.resources' parser
                                                         tables (one parser per kind)

The model's parsers cannot live in this table itself: the model sits above the syncers in
the import layers (it builds typed objects from what the syncers deliver), while the
syncers need the catalogue. So the model registers its parsers by kind, and refuses to
load when their kinds and the catalogue's differ (tests/test_import_graph.py checks it too).

Invariants: `kind` is unique; (`api_version`, `document_kind`) is unique; a kind with a
`kube` resource is read from that resource in the Kubernetes datastore, one with
`derived_from` is converted from those kinds (agent.conversion) and has no resource of its
own there; `cli` is False only for bookkeeping kinds users do not write (BlockAffinity).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CALICO_API = "projectcalico.org/v3"
K8S_CORE_API = "v1"
K8S_NETWORKING_API = "networking.k8s.io/v1"
CRD_GROUP_VERSION = "crd.projectcalico.org/v1"

# Kubernetes' own NetworkPolicy shares its kind name with Calico's; inside pyfelix it is
# keyed as Calico's libcalico-go keys it.
KIND_K8S_NETWORK_POLICY = "KubernetesNetworkPolicy"

# Where documents live in etcd: ETCD_ROOT/<directory>/<plural>/[<namespace>/]<name>, the
# directory being Calico's own v3 one, or a sibling no Calico tool reads for the Kubernetes
# kinds pyfelix also accepts there (agent.syncer.etcd_keys).
ETCD_ROOT = "/calico/resources/v3/"
ETCD_CALICO_DIRECTORY = "projectcalico.org"
ETCD_KUBERNETES_DIRECTORY = "kubernetes"


@dataclass(frozen=True)
class ResourceType:
    """One API resource the Kubernetes datastore lists and watches."""

    kind: str  # the ResourceKey kind its objects are keyed as
    object_kind: str  # `kind` in API objects
    group_version: str  # "v1", "networking.k8s.io/v1", "crd.projectcalico.org/v1"
    plural: str
    namespaced: bool
    # set: the type is read in this one namespace only (Secrets: the namespace Calico's
    # node runs in), never cluster-wide; None: every namespace.
    namespace: str | None = None

    @property
    def is_crd(self) -> bool:
        return self.group_version == CRD_GROUP_VERSION

    @property
    def api_group(self) -> str:
        """The RBAC apiGroup: "" for core/v1, else the group of its group/version."""
        return self.group_version.rpartition("/")[0]

    @property
    def base_path(self) -> str:
        if self.group_version == "v1":
            return "/api/v1"
        return f"/apis/{self.group_version}"

    def collection_path(self, namespace: str | None = None) -> str:
        """The list/watch path: every namespace, or one (`namespace`, else the type's own)."""
        namespace = namespace or self.namespace
        if namespace and self.namespaced:
            return f"{self.base_path}/namespaces/{namespace}/{self.plural}"
        return f"{self.base_path}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        return f"{self.collection_path(namespace if self.namespaced else None)}/{name}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.api_group}" if self.api_group else self.plural


@dataclass(frozen=True)
class KindInfo:
    """Everything pyfelix knows about where one kind lives (see the module docstring)."""

    kind: str  # the kind as keyed inside pyfelix (ResourceKey.kind)
    api_version: str  # the apiVersion its documents carry
    document_kind: str  # the `kind:` written in documents
    plural: str  # CLI plural and etcd key directory
    namespaced: bool
    kube: ResourceType | None = None  # where the Kubernetes datastore reads it
    derived_from: tuple[str, ...] = ()  # Kubernetes datastore: converted from these kinds
    cli: bool = True  # named by `pyfelix apply/get/delete`
    bgp: bool = False  # read by confd (Typha's "bgp" syncer type carries only these)
    felix: bool = True  # read by the agent (False: Secrets, for confd only)

    @property
    def etcd_directory(self) -> str:
        return (ETCD_CALICO_DIRECTORY if self.api_version == CALICO_API
                else ETCD_KUBERNETES_DIRECTORY)

    @property
    def etcd_prefix(self) -> str:
        """Where this kind's documents live in etcd (a namespace or name follows)."""
        return f"{ETCD_ROOT}{self.etcd_directory}/{self.plural}/"


def _plural(kind: str) -> str:
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + "s"


def _calico(kind: str, *, namespaced: bool = False, crd: bool = True,
            derived_from: tuple[str, ...] = (), kube: ResourceType | None = None,
            cli: bool = True, bgp: bool = False) -> KindInfo:
    """A projectcalico.org/v3 kind; stored as a CRD of the same kind in the Kubernetes
    datastore unless `crd` is False (then `derived_from` or `kube` says where it comes from)."""
    plural = _plural(kind)
    if crd:
        kube = ResourceType(kind, kind, CRD_GROUP_VERSION, plural, namespaced)
    return KindInfo(kind, CALICO_API, kind, plural, namespaced, kube, derived_from, cli, bgp)


def _kubernetes(kind: str, group_version: str, object_kind: str, api_plural: str,
                *, namespaced: bool, plural: str | None = None, bgp: bool = False,
                felix: bool = True) -> KindInfo:
    """A Kubernetes kind pyfelix accepts as is (Pods, Namespaces...)."""
    rtype = ResourceType(kind, object_kind, group_version, api_plural, namespaced)
    return KindInfo(kind, group_version, object_kind, plural or api_plural, namespaced, rtype,
                    bgp=bgp, felix=felix)


KINDS: tuple[KindInfo, ...] = (
    # Kubernetes' own kinds first: the Kubernetes datastore lists its resources in this
    # order (Namespaces before the Pods whose profiles and labels refer to them).
    _kubernetes("Namespace", K8S_CORE_API, "Namespace", "namespaces", namespaced=False),
    _kubernetes("ServiceAccount", K8S_CORE_API, "ServiceAccount", "serviceaccounts",
                namespaced=True),
    _kubernetes("Pod", K8S_CORE_API, "Pod", "pods", namespaced=True),
    # Calico's Node: in the Kubernetes datastore it is the v1 Node itself, keyed as "Node"
    # and parsed by the model from either form.
    _calico("Node", crd=False, bgp=True,
            kube=ResourceType("Node", "Node", K8S_CORE_API, "nodes", False)),
    # Kubernetes NetworkPolicies are keyed (and stored in etcd) under their pyfelix kind, so
    # they never meet Calico's NetworkPolicy.
    _kubernetes(KIND_K8S_NETWORK_POLICY, K8S_NETWORKING_API, "NetworkPolicy",
                "networkpolicies", namespaced=True, plural="kubernetesnetworkpolicies"),
    _calico("Tier"),
    _calico("GlobalNetworkPolicy"),
    _calico("NetworkPolicy", namespaced=True),
    _calico("GlobalNetworkSet"),
    _calico("NetworkSet", namespaced=True),
    _calico("WorkloadEndpoint", namespaced=True, crd=False, derived_from=("Pod",)),
    _calico("HostEndpoint"),
    _calico("Profile", crd=False, derived_from=("Namespace", "ServiceAccount")),
    _calico("IPPool", bgp=True),
    _calico("BGPConfiguration", bgp=True),
    _calico("BGPPeer", bgp=True),
    _calico("BGPFilter", bgp=True),  # per-peer import/export rules (confd)
    _calico("FelixConfiguration"),
    # Cluster-wide facts; its datastoreReady pauses the dataplane (agent.calc.passthru).
    _calico("ClusterInformation"),
    # Written by Calico's IPAM (never by users); the route calculation reads it.
    _calico("BlockAffinity", cli=False, bgp=True),
)

# Services and their EndpointSlices (the BPF dataplane's service load balancing, as
# Calico's node reads both for its kube-proxy replacement; confd too, for the /32s of
# externalTrafficPolicy Local services); also the RBAC the node needs.
SERVICE_KINDS: tuple[KindInfo, ...] = (
    _kubernetes("Service", K8S_CORE_API, "Service", "services", namespaced=True, bgp=True),
    _kubernetes("EndpointSlice", "discovery.k8s.io/v1", "EndpointSlice", "endpointslices",
                namespaced=True, bgp=True),
)
KINDS = KINDS + SERVICE_KINDS

# v1 Secrets hold BGP passwords (BGPPeer / BGPConfiguration `secretKeyRef`). Only confd reads
# them, and only in one namespace: the one Calico's node runs in, from the downward-API
# variable NAMESPACE, else kube-system (as calico-node's confd does; operator installs set
# calico-system). The agent never receives them: not from Typha's felix stream, not from
# the Kubernetes datastore's felix syncer, and its validator drops them unparsed.
SECRET_NAMESPACE_ENV = "NAMESPACE"
DEFAULT_SECRET_NAMESPACE = "kube-system"
SECRET_KIND = _kubernetes("Secret", K8S_CORE_API, "Secret", "secrets", namespaced=True,
                          bgp=True, felix=False)
KINDS = (*KINDS, SECRET_KIND)

KIND_BY_NAME: dict[str, KindInfo] = {info.kind: info for info in KINDS}
NAMESPACED_KINDS: frozenset[str] = frozenset(info.kind for info in KINDS if info.namespaced)
CLI_KINDS: tuple[KindInfo, ...] = tuple(info for info in KINDS if info.cli)
# What confd reads: the kinds of Typha's "bgp" syncer type and of confd's own view.
BGP_KINDS: frozenset[str] = frozenset(info.kind for info in KINDS if info.bgp)
# What the agent reads (every kind but the confd-only Secrets).
FELIX_KINDS: frozenset[str] = frozenset(info.kind for info in KINDS if info.felix)
_CLI_NAMES: dict[str, KindInfo] = {
    name: info for info in CLI_KINDS for name in (info.kind.lower(), info.plural)}


def secret_namespace(environ: dict[str, str] | None = None) -> str:
    """The one namespace BGP password Secrets are read from ($NAMESPACE, else kube-system)."""
    env = os.environ if environ is None else environ
    return env.get(SECRET_NAMESPACE_ENV, "").strip() or DEFAULT_SECRET_NAMESPACE


def kind_named(text: str) -> KindInfo | None:
    """A kind users may name on the command line, from its name or plural in any case."""
    return _CLI_NAMES.get(text.strip().lower())


def api_versions_of(kind: str) -> tuple[str, ...]:
    """The apiVersions a document of pyfelix kind `kind` may carry (sorted)."""
    info = KIND_BY_NAME.get(kind)
    if info is None:
        return ()
    versions = {info.api_version}
    if info.kube is not None and not info.kube.is_crd:
        versions.add(info.kube.group_version)
    return tuple(sorted(versions))

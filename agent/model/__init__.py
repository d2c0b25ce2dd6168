"""Typed Calico v3 and Kubernetes resources, parsed and validated from raw documents.

Modules:
- `resources`: policy and endpoint dataclasses and `parse_resource(doc)`, the entry point;
- `infrastructure`, `kubernetes`: networking/configuration kinds, Kubernetes kinds;
- `base`: `Metadata`, `Resource` and the helpers every kind's parser shares;
- `rules`: policy rules (Rule, EntityRule, Port, ICMPMatch, ServiceAccountMatch);
- `policy_selectors`: what a policy and its rules select, in Calico's semantics
  (namespace and service-account prefixes), as plain selector text for the calc graph;
- `fields`: `ValidationError` and the path-tracking reader every parser uses;
- `names`, `labels`: name/label syntax checks and the label keys Calico gives a meaning to.

Invariants: every model object is a frozen dataclass holding tuples (hashable, safe to share
between threads and stages); `parse_resource` raises only `ValidationError`.
"""

from pyfelix.agent.model.base import Metadata, Resource
from pyfelix.agent.model.fields import ValidationError
from pyfelix.agent.model.infrastructure import (
    BGPConfiguration,
    BGPFilter,
    BGPFilterRule,
    BGPPeer,
    BlockAffinity,
    ClusterInformation,
    Community,
    FelixConfiguration,
    IPPool,
    Node,
    NodeBGP,
    PrefixAdvertisement,
    SecretKeyRef,
)
from pyfelix.agent.model.kubernetes import (
    ContainerPort,
    IPBlock,
    K8sNetworkPolicy,
    K8sPeer,
    K8sPolicyRule,
    K8sPort,
    LabelSelector,
    LabelSelectorRequirement,
    Namespace,
    Pod,
    ServiceAccount,
)
from pyfelix.agent.model.policy_selectors import entity_selector, inherited_labels, policy_selector
from pyfelix.agent.model.resources import (
    IPNAT,
    K8S_KINDS,
    KNOWN_KINDS,
    EndpointPort,
    HostEndpoint,
    NetworkPolicy,
    NetworkSet,
    Profile,
    Tier,
    WorkloadEndpoint,
    parse_resource,
)
from pyfelix.agent.model.rules import EntityRule, ICMPMatch, Port, Rule, ServiceAccountMatch
from pyfelix.agent.model.secrets import Secret
from pyfelix.agent.model.services import (
    EndpointSlice,
    Service,
    ServicePort,
    SliceEndpoint,
    SlicePort,
)

__all__ = [
    "IPNAT",
    "K8S_KINDS",
    "KNOWN_KINDS",
    "BGPConfiguration",
    "BGPFilter",
    "BGPFilterRule",
    "BGPPeer",
    "BlockAffinity",
    "ClusterInformation",
    "Community",
    "ContainerPort",
    "EndpointPort",
    "EndpointSlice",
    "EntityRule",
    "FelixConfiguration",
    "HostEndpoint",
    "ICMPMatch",
    "IPBlock",
    "IPPool",
    "K8sNetworkPolicy",
    "K8sPeer",
    "K8sPolicyRule",
    "K8sPort",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Metadata",
    "Namespace",
    "NetworkPolicy",
    "NetworkSet",
    "Node",
    "NodeBGP",
    "Pod",
    "Port",
    "PrefixAdvertisement",
    "Profile",
    "Resource",
    "Rule",
    "Secret",
    "SecretKeyRef",
    "Service",
    "ServiceAccount",
    "ServiceAccountMatch",
    "ServicePort",
    "SliceEndpoint",
    "SlicePort",
    "Tier",
    "ValidationError",
    "WorkloadEndpoint",
    "entity_selector",
    "inherited_labels",
    "parse_resource",
    "policy_selector",
]

"""The BGP syncer view: the datastore as confd sees it.

Role: keep the current, validated BGP-relevant resources (BGPConfiguration, Node, BGPPeer,
IPPool, BlockAffinity, BGPFilter, Services and EndpointSlices (for the routes of
`externalTrafficPolicy: Local` services), and the v1 Secrets that hold BGP passwords) from a
stream of syncer `RawUpdate`s, and hand out immutable snapshots (`BGPState`) for
`bgp_config.compute_bird_config`.

Inputs: `RawUpdate`s (any kind; kinds confd does not use are ignored; Secrets outside the
secret namespace, `agent.kinds.secret_namespace()` by default, are ignored: Calico's node
reads BGP passwords only from the namespace it runs in).
Outputs: `BGPView.apply()` says whether the BGP state changed (a newly invalid document is
counted in `pyfelix_confd_invalid_resources_total{kind}`); `snapshot()` returns a
`BGPState`; `problems()` lists the resources that failed validation, with the reason.

Invariants: a document that fails validation is treated as deleted (its last good version is
NOT kept: a broken peer must not silently keep its old session) and listed by `problems()`
until a later good version or a delete clears it. (`compute_bird_config` refuses to render
at all when the invalid one is the global BGPConfiguration or this node's Node: falling
back to defaults there could turn the mesh on or change the AS.)

Easy to get wrong: a Kubernetes v1 Node and a Calico v3 Node share the key `Node(name)`;
only a Node with a `bgp` section can take part in BGP, so the view simply stores whichever
document the datastore sent last for that key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import Counter

from pyfelix.agent.kinds import BGP_KINDS, secret_namespace
from pyfelix.agent.model import (
    BGPConfiguration,
    BGPFilter,
    BGPPeer,
    BlockAffinity,
    EndpointSlice,
    IPPool,
    Node,
    Secret,
    Service,
    ValidationError,
    parse_resource,
)
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey

log = logging.getLogger(__name__)

INVALID_RESOURCES = Counter(
    "pyfelix_confd_invalid_resources_total",
    "BGP resources confd rejected (each new reason counted once); they are left out of the "
    "BIRD configuration and named in its notes.",
    ["kind"],
)
_default_secret_namespace = secret_namespace



@dataclass(frozen=True)
class BGPState:
    """One consistent snapshot of the BGP resources, each dict keyed by resource name."""

    bgp_configurations: dict[str, BGPConfiguration] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    peers: dict[str, BGPPeer] = field(default_factory=dict)
    pools: dict[str, IPPool] = field(default_factory=dict)
    block_affinities: dict[str, BlockAffinity] = field(default_factory=dict)
    filters: dict[str, BGPFilter] = field(default_factory=dict)
    secrets: dict[str, Secret] = field(default_factory=dict)  # of the secret namespace
    secret_namespace: str = ""
    services: dict[str, Service] = field(default_factory=dict)  # "namespace/name"
    endpoint_slices: dict[str, EndpointSlice] = field(default_factory=dict)  # "ns/name"


class BGPView:
    """Applies raw updates; keeps typed resources and the validation problems."""

    def __init__(self, *, secret_namespace: str | None = None) -> None:
        self._resources: dict[ResourceKey, object] = {}
        self._problems: dict[ResourceKey, str] = {}
        self.secret_namespace = secret_namespace or _default_secret_namespace()

    def apply(self, update: RawUpdate) -> bool:
        """Apply one update; True if the BGP state (resources or problems) changed."""
        key = update.key
        if key.kind not in BGP_KINDS:
            return False
        if key.kind == "Secret" and key.namespace != self.secret_namespace:
            return False
        before = (self._resources.get(key), self._problems.get(key))
        if update.value is None:
            self._resources.pop(key, None)
            self._problems.pop(key, None)
        else:
            try:
                self._resources[key] = parse_resource(update.value)
                self._problems.pop(key, None)
            except ValidationError as exc:
                self._resources.pop(key, None)
                message = str(exc) + (f" (from {update.source})" if update.source else "")
                if self._problems.get(key) != message:
                    log.debug("invalid resource: %s", message)
                    INVALID_RESOURCES.labels(kind=key.kind).inc()
                self._problems[key] = message
        return (self._resources.get(key), self._problems.get(key)) != before

    def apply_all(self, updates: Iterable[RawUpdate]) -> bool:
        changed = False
        for update in updates:
            changed = self.apply(update) or changed
        return changed

    def problems(self) -> dict[ResourceKey, str]:
        """Resources that failed validation (and are left out), with the reason."""
        return {k: self._problems[k] for k in sorted(self._problems)}

    def snapshot(self) -> BGPState:
        state = BGPState(secret_namespace=self.secret_namespace)
        by_kind: dict[str, dict[str, object]] = {
            "BGPConfiguration": state.bgp_configurations, "Node": state.nodes,  # type: ignore[dict-item]
            "BGPPeer": state.peers, "IPPool": state.pools,  # type: ignore[dict-item]
            "BlockAffinity": state.block_affinities,  # type: ignore[dict-item]
            "BGPFilter": state.filters,  # type: ignore[dict-item]
            "Secret": state.secrets,  # type: ignore[dict-item]
            "Service": state.services,  # type: ignore[dict-item]
            "EndpointSlice": state.endpoint_slices,  # type: ignore[dict-item]
        }
        for key in sorted(self._resources):
            name = (f"{key.namespace}/{key.name}" if key.kind in ("Service", "EndpointSlice")
                    else key.name)  # Secrets: all of one namespace
            by_kind[key.kind][name] = self._resources[key]
        return state


def state_from_updates(updates: Iterable[RawUpdate], *, secret_namespace: str | None = None,
                       ) -> tuple[BGPState, dict[ResourceKey, str]]:
    """A snapshot and the validation problems from a one-shot list of updates."""
    view = BGPView(secret_namespace=secret_namespace)
    view.apply_all(updates)
    return view.snapshot(), view.problems()

"""Fan-out of validated updates by resource kind, and the local-endpoint filter.

Role: the first nodes of the calc graph (Felix's `dispatcher.Dispatcher` and its
local-endpoint dispatcher).

- `UpdateNormaliser` turns what the validator emits (anything with `.key` and `.value`)
  into `CalcUpdate(kind, key, value)` where `key` is the RESOURCE's own key (`value.key`)
  and `kind` names the resource type (`GlobalNetworkPolicy` vs `NetworkPolicy`,
  `GlobalNetworkSet` vs `NetworkSet`, otherwise the model class name). A delete arrives
  keyed by the datastore key only, so the normaliser remembers which resource each
  datastore key produced (a Kubernetes Pod key -> its WorkloadEndpoint key) and sends the
  delete under that. Nodes downstream therefore see one stable key per resource.
- `Dispatcher.on_update` calls every handler registered for the update's kind, in
  registration order; `on_status` calls the status handlers.
- `LocalEndpointFilter` forwards workload/host endpoint updates to a second dispatcher only
  for endpoints on this host; an endpoint that moves away (or is deleted) becomes a delete
  there, so local consumers never keep a stale endpoint.

Invariants: a delete is `value is None`; a delete for a key never seen is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.model import HostEndpoint, NetworkPolicy, NetworkSet, Resource, WorkloadEndpoint
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus

log = logging.getLogger(__name__)

KIND_WORKLOAD_ENDPOINT = "WorkloadEndpoint"
KIND_HOST_ENDPOINT = "HostEndpoint"
KIND_NETWORK_POLICY = "NetworkPolicy"
KIND_GLOBAL_NETWORK_POLICY = "GlobalNetworkPolicy"
KIND_PROFILE = "Profile"
KIND_TIER = "Tier"
KIND_NETWORK_SET = "NetworkSet"
KIND_GLOBAL_NETWORK_SET = "GlobalNetworkSet"
KIND_IP_POOL = "IPPool"
KIND_NODE = "Node"
KIND_FELIX_CONFIGURATION = "FelixConfiguration"
KIND_CLUSTER_INFORMATION = "ClusterInformation"
KIND_BLOCK_AFFINITY = "BlockAffinity"

POLICY_KINDS = (KIND_NETWORK_POLICY, KIND_GLOBAL_NETWORK_POLICY)
ENDPOINT_KINDS = (KIND_WORKLOAD_ENDPOINT, KIND_HOST_ENDPOINT)
NETWORK_SET_KINDS = (KIND_NETWORK_SET, KIND_GLOBAL_NETWORK_SET)


@dataclass(frozen=True, slots=True)
class CalcUpdate:
    """One update inside the graph: `key` is the resource's own key; delete if value is None."""

    kind: str
    key: ResourceKey
    value: Any


UpdateHandler = Callable[[CalcUpdate], None]
StatusHandler = Callable[[SyncStatus], None]


def kind_of(value: Resource) -> str:
    if isinstance(value, NetworkPolicy):
        return KIND_GLOBAL_NETWORK_POLICY if value.is_global else KIND_NETWORK_POLICY
    if isinstance(value, NetworkSet):
        return KIND_GLOBAL_NETWORK_SET if value.is_global else KIND_NETWORK_SET
    return type(value).__name__


class UpdateNormaliser:
    """Datastore-keyed updates -> resource-keyed `CalcUpdate`s (see module docstring)."""

    def __init__(self) -> None:
        self._produced: dict[Any, str | tuple[str, ResourceKey]] = {}

    def normalise(self, updates: Iterable[Any]) -> list[CalcUpdate]:
        out: list[CalcUpdate] = []
        produced = self._produced
        for update in updates:
            value = update.value
            previous = produced.get(update.key)
            if type(previous) is str:  # see below
                previous = (previous, update.key)
            if value is None:
                if previous is not None:
                    del produced[update.key]
                    out.append(CalcUpdate(previous[0], previous[1], None))
                continue
            if not isinstance(value, Resource):
                log.warning("calc graph: ignoring %s: not a validated resource", update.key)
                continue
            kind = kind_of(value)
            own_key = value.key
            if previous is not None and previous != (kind, own_key):
                out.append(CalcUpdate(previous[0], previous[1], None))
            # just the kind when the resource's own key is the update's (nearly always):
            # a (kind, key) tuple per resource costs 56 bytes
            produced[update.key] = kind if own_key == update.key else (kind, own_key)
            out.append(CalcUpdate(kind, own_key, value))
        return out

    def __len__(self) -> int:
        return len(self._produced)


class Dispatcher:
    """Calls the handlers registered for an update's kind, in registration order."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[UpdateHandler]] = {}
        self._status_handlers: list[StatusHandler] = []

    def register(self, kind: str, handler: UpdateHandler) -> None:
        self._handlers.setdefault(kind, []).append(handler)

    def register_status(self, handler: StatusHandler) -> None:
        self._status_handlers.append(handler)

    def on_update(self, update: CalcUpdate) -> None:
        for handler in self._handlers.get(update.kind, ()):
            handler(update)

    def on_updates(self, updates: Iterable[CalcUpdate]) -> None:
        for update in updates:
            self.on_update(update)

    def on_status(self, status: SyncStatus) -> None:
        for handler in self._status_handlers:
            handler(status)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)


class LocalEndpointFilter:
    """Forwards only this host's endpoints to `local` (moves away become deletes)."""

    def __init__(self, hostname: str, local: Dispatcher) -> None:
        self.hostname = hostname
        self._local = local
        self._local_keys: set[ResourceKey] = set()

    def register_with(self, dispatcher: Dispatcher) -> None:
        for kind in ENDPOINT_KINDS:
            dispatcher.register(kind, self.on_update)
        dispatcher.register_status(self._local.on_status)

    def on_update(self, update: CalcUpdate) -> None:
        value = update.value
        is_local = isinstance(value, WorkloadEndpoint | HostEndpoint) and (
            value.node == self.hostname)
        if is_local:
            self._local_keys.add(update.key)
            self._local.on_update(update)
        elif update.key in self._local_keys:
            self._local_keys.discard(update.key)
            self._local.on_update(CalcUpdate(update.kind, update.key, None))

    def local_keys(self) -> frozenset[ResourceKey]:
        return frozenset(self._local_keys)

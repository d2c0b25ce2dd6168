"""PolicyResolver: for each local endpoint, its tiers and their policies in evaluation order.

Role (Felix's PolicyResolver + PolicySorter). Inputs: policy metadata and Tiers (all-updates
dispatcher), local endpoints (local dispatcher), and the ActiveRulesCalculator's
`on_policy_match(policy, endpoint)` / `on_policy_match_stopped`. Output, on `flush()`, for
each endpoint whose answer may have changed:
`sink.on_endpoint_tiers(key, endpoint | None, EndpointTiers)`.

Ordering (Calico's):
- Tiers: tiers that have a Tier resource first, by `order` (a missing order sorts last),
  then by name. The `default` tier needs no resource: Calico creates it with order
  1,000,000 (`DefaultTierOrder`) and default action Deny, and so does this resolver when
  no `Tier default` is given (a `Tier default` resource overrides both). A tier named by
  policies but with no Tier resource sorts after all known tiers (Felix marks it invalid),
  by name, with default action Deny.
- Policies inside a tier: by `order` (missing = +infinity, i.e. last), then by policy id
  (`<name>` or `<namespace>/<name>`) as the tie-break.
- Per direction, only policies whose `types` include that direction are listed; a tier
  appears when at least one of its policies applies to the endpoint in that category.
- Categories (Felix's split): normal policies -> `tiers`; `doNotTrack` -> `untracked`;
  `preDNAT` -> `pre_dnat`; normal policies with `applyOnForward` also -> `forward`.
  Workload endpoints use only `tiers`; host endpoints use all four.

Invariants: the answer for an endpoint depends only on the current matches, policies and
tiers; a deleted endpoint is reported once with `endpoint=None`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import (
    ENDPOINT_KINDS,
    KIND_TIER,
    POLICY_KINDS,
    CalcUpdate,
    Dispatcher,
)
from pyfelix.agent.calc.set_index import discard_member
from pyfelix.agent.model import NetworkPolicy, Tier
from pyfelix.agent.syncer.api import ResourceKey

DEFAULT_TIER = "default"
DEFAULT_TIER_ORDER = 1_000_000.0


@dataclass(frozen=True)
class EndpointTiers:
    tiers: tuple[proto.TierInfo, ...] = ()
    untracked: tuple[proto.TierInfo, ...] = ()
    pre_dnat: tuple[proto.TierInfo, ...] = ()
    forward: tuple[proto.TierInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyMeta:
    tier: str
    order: float
    policy_id: str
    ingress: bool
    egress: bool
    untracked: bool
    pre_dnat: bool
    forward: bool

    @classmethod
    def of(cls, policy: NetworkPolicy) -> PolicyMeta:
        return cls(tier=policy.tier,
                   order=math.inf if policy.order is None else policy.order,
                   policy_id=policy.policy_id,
                   ingress="Ingress" in policy.types,
                   egress="Egress" in policy.types,
                   untracked=policy.do_not_track,
                   pre_dnat=policy.pre_dnat,
                   forward=policy.apply_on_forward)

    @property
    def sort_key(self) -> tuple[float, str]:
        return (self.order, self.policy_id)


@dataclass(frozen=True)
class TierSettings:
    known: bool
    order: float
    default_action: str  # "deny" | "pass"

    def sort_key(self, name: str) -> tuple[int, float, str]:
        return (0 if self.known else 1, self.order, name)


class EndpointTiersSink(Protocol):
    def on_endpoint_tiers(self, key: ResourceKey, endpoint: Any,
                          tiers: EndpointTiers) -> None: ...


class PolicyResolver:
    def __init__(self, sink: EndpointTiersSink) -> None:
        self._sink = sink
        self._policy_meta: dict[ResourceKey, PolicyMeta] = {}
        self._tiers: dict[str, Tier] = {}
        self._endpoints: dict[ResourceKey, Any] = {}
        self._policies_of_endpoint: dict[ResourceKey, set[ResourceKey]] = {}
        self._endpoints_of_policy: dict[ResourceKey, set[ResourceKey]] = {}
        self._dirty: set[ResourceKey] = set()

    def register_with(self, all_updates: Dispatcher, local_endpoints: Dispatcher) -> None:
        for kind in POLICY_KINDS:
            all_updates.register(kind, self.on_policy_update)
        all_updates.register(KIND_TIER, self.on_tier_update)
        for kind in ENDPOINT_KINDS:
            local_endpoints.register(kind, self.on_endpoint_update)

    # --- inputs -------------------------------------------------------------------------

    def on_policy_update(self, update: CalcUpdate) -> None:
        meta = PolicyMeta.of(update.value) if update.value is not None else None
        if meta is None:
            if self._policy_meta.pop(update.key, None) is None:
                return
        elif self._policy_meta.get(update.key) == meta:
            return
        else:
            self._policy_meta[update.key] = meta
        self._dirty.update(self._endpoints_of_policy.get(update.key, ()))

    def on_tier_update(self, update: CalcUpdate) -> None:
        if update.value is None:
            self._tiers.pop(update.key.name, None)
        else:
            self._tiers[update.key.name] = update.value
        self._dirty.update(self._endpoints)  # rare, and there are few local endpoints

    def on_endpoint_update(self, update: CalcUpdate) -> None:
        if update.value is None:
            self._endpoints.pop(update.key, None)
        else:
            self._endpoints[update.key] = update.value
        self._dirty.add(update.key)

    def on_policy_match(self, policy: ResourceKey, endpoint: ResourceKey) -> None:
        self._policies_of_endpoint.setdefault(endpoint, set()).add(policy)
        self._endpoints_of_policy.setdefault(policy, set()).add(endpoint)
        self._dirty.add(endpoint)

    def on_policy_match_stopped(self, policy: ResourceKey, endpoint: ResourceKey) -> None:
        discard_member(self._policies_of_endpoint, endpoint, policy)
        discard_member(self._endpoints_of_policy, policy, endpoint)
        self._dirty.add(endpoint)

    # --- output -------------------------------------------------------------------------

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                self._sink.on_endpoint_tiers(key, None, EndpointTiers())
            else:
                self._sink.on_endpoint_tiers(key, endpoint, self.tiers_for(key))

    def tier_settings(self, name: str) -> TierSettings:
        tier = self._tiers.get(name)
        if tier is not None:
            order = math.inf if tier.order is None else tier.order
            if tier.order is None and name == DEFAULT_TIER:
                order = DEFAULT_TIER_ORDER
            return TierSettings(True, order, tier.default_action.lower())
        if name == DEFAULT_TIER:
            return TierSettings(True, DEFAULT_TIER_ORDER, "deny")
        return TierSettings(False, math.inf, "deny")

    def tiers_for(self, endpoint: ResourceKey) -> EndpointTiers:
        metas = [self._policy_meta[p] for p in self._policies_of_endpoint.get(endpoint, ())
                 if p in self._policy_meta]
        normal = [m for m in metas if not m.untracked and not m.pre_dnat]
        return EndpointTiers(
            tiers=self._tier_infos(normal),
            untracked=self._tier_infos([m for m in metas if m.untracked]),
            pre_dnat=self._tier_infos([m for m in metas if m.pre_dnat]),
            forward=self._tier_infos([m for m in normal if m.forward]),
        )

    def _tier_infos(self, metas: list[PolicyMeta]) -> tuple[proto.TierInfo, ...]:
        grouped: dict[str, list[PolicyMeta]] = {}
        for meta in metas:
            grouped.setdefault(meta.tier, []).append(meta)
        settings = {name: self.tier_settings(name) for name in grouped}
        infos = []
        for name in sorted(grouped, key=lambda n: settings[n].sort_key(n)):
            ordered = sorted(grouped[name], key=lambda m: m.sort_key)
            infos.append(proto.TierInfo(
                name=name,
                ingress_policies=tuple(m.policy_id for m in ordered if m.ingress),
                egress_policies=tuple(m.policy_id for m in ordered if m.egress),
                default_action=settings[name].default_action,
            ))
        return tuple(infos)

"""ActiveRulesCalculator: which policies and profiles apply to this host's endpoints.

Role (Felix's ActiveRulesCalculator). Inputs:
- every (Global)NetworkPolicy and Profile (from the all-updates dispatcher);
- this host's workload and host endpoints (from the local dispatcher);
- profile labels (from the ProfileDecoder), which local endpoints inherit.

A policy applies to an endpoint when the policy's combined selector matches the endpoint's
effective labels (`selectors.policy_selector`: a namespaced policy only in its namespace, a
GlobalNetworkPolicy's `namespaceSelector` against the inherited `pcns.*` labels). Matching
uses a `SelectorIndex` over local endpoints, so a policy change evaluates only candidates.

Outputs:
- `rules.on_policy_active(key, policy)` / `on_policy_inactive(key)`: a policy matches at
  least one local endpoint / no longer does (re-sent with the new value when an active
  policy changes);
- `rules.on_profile_active(name, profile | None)` / `on_profile_inactive(name)`: a profile
  is listed by at least one local endpoint; `None` when the Profile resource does not exist
  (Felix then programs deny-all rules for it, so a missing profile fails closed);
- `matches.on_policy_match(policy_key, endpoint_key)` / `on_policy_match_stopped(...)`.

Invariants: after every `on_update`, a policy is active iff it matches a local endpoint and
a profile is active iff a local endpoint lists it; every active is paired with an inactive.
"""

from __future__ import annotations

from typing import Any, Protocol

from pyfelix.agent.calc.dispatcher import (
    ENDPOINT_KINDS,
    KIND_PROFILE,
    POLICY_KINDS,
    CalcUpdate,
    Dispatcher,
)
from pyfelix.agent.calc.labels import LabelInheritIndex, labels_and_parents
from pyfelix.agent.calc.selector_index import SelectorIndex
from pyfelix.agent.calc.selectors import applies_to
from pyfelix.agent.calc.set_index import discard_member
from pyfelix.agent.model import NetworkPolicy, Profile
from pyfelix.agent.syncer.api import ResourceKey


class RulesListener(Protocol):
    def on_policy_active(self, key: ResourceKey, policy: NetworkPolicy) -> None: ...
    def on_policy_inactive(self, key: ResourceKey) -> None: ...
    def on_profile_active(self, name: str, profile: Profile | None) -> None: ...
    def on_profile_inactive(self, name: str) -> None: ...


class PolicyMatchListener(Protocol):
    def on_policy_match(self, policy: ResourceKey, endpoint: ResourceKey) -> None: ...
    def on_policy_match_stopped(self, policy: ResourceKey, endpoint: ResourceKey) -> None: ...


class ActiveRulesCalculator:
    def __init__(self, rules: RulesListener, matches: PolicyMatchListener) -> None:
        self._rules = rules
        self._matches = matches
        self._policies: dict[ResourceKey, NetworkPolicy] = {}
        self._profiles: dict[str, Profile] = {}
        self._endpoint_profiles: dict[ResourceKey, tuple[str, ...]] = {}
        self._profile_users: dict[str, set[ResourceKey]] = {}
        self._selector_index = SelectorIndex(self._on_match_started, self._on_match_stopped)
        self._labels = LabelInheritIndex(self._on_labels)
        self._active_policies: set[ResourceKey] = set()
        self._active_profiles: set[str] = set()
        self._dirty_policies: set[ResourceKey] = set()
        self._dirty_profiles: set[str] = set()

    def register_with(self, all_updates: Dispatcher, local_endpoints: Dispatcher) -> None:
        for kind in POLICY_KINDS:
            all_updates.register(kind, self.on_policy_update)
        all_updates.register(KIND_PROFILE, self.on_profile_update)
        for kind in ENDPOINT_KINDS:
            local_endpoints.register(kind, self.on_endpoint_update)

    # --- inputs -------------------------------------------------------------------------

    def on_policy_update(self, update: CalcUpdate) -> None:
        key, policy = update.key, update.value
        if policy is None:
            if self._policies.pop(key, None) is not None:
                self._selector_index.delete_selector(key)
        else:
            self._policies[key] = policy
            self._selector_index.update_selector(key, applies_to(policy))
        self._dirty_policies.add(key)
        self._flush_dirty()

    def on_profile_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        if update.value is None:
            self._profiles.pop(name, None)
        else:
            self._profiles[name] = update.value
        self._dirty_profiles.add(name)
        self._flush_dirty()

    def on_profile_labels(self, name: str, labels: dict[str, str] | None) -> None:
        self._labels.update_parent(name, labels)
        self._flush_dirty()

    def on_endpoint_update(self, update: CalcUpdate) -> None:
        key, endpoint = update.key, update.value
        old_profiles = self._endpoint_profiles.pop(key, ())
        new_profiles: tuple[str, ...] = ()
        if endpoint is None:
            self._labels.delete_item(key)
        else:
            labels, new_profiles = labels_and_parents(endpoint)
            self._labels.update_item(key, labels, new_profiles)
            self._endpoint_profiles[key] = new_profiles
        for name in set(old_profiles) - set(new_profiles):
            discard_member(self._profile_users, name, key)
            self._dirty_profiles.add(name)
        for name in set(new_profiles) - set(old_profiles):
            self._profile_users.setdefault(name, set()).add(key)
            self._dirty_profiles.add(name)
        self._flush_dirty()

    # --- queries (debug dumps) ----------------------------------------------------------

    def active_policies(self) -> list[ResourceKey]:
        return sorted(self._active_policies)

    def active_profiles(self) -> list[str]:
        return sorted(self._active_profiles)

    # --- internals ----------------------------------------------------------------------

    def _on_labels(self, endpoint: Any, labels: dict[str, str] | None) -> None:
        if labels is None:
            self._selector_index.delete_item(endpoint)
        else:
            self._selector_index.update_item(endpoint, labels)

    def _on_match_started(self, policy: Any, endpoint: Any) -> None:
        self._dirty_policies.add(policy)
        self._matches.on_policy_match(policy, endpoint)

    def _on_match_stopped(self, policy: Any, endpoint: Any) -> None:
        self._dirty_policies.add(policy)
        self._matches.on_policy_match_stopped(policy, endpoint)

    def _flush_dirty(self) -> None:
        """Bring active policies/profiles in line with the current state."""
        for key in self._dirty_policies:
            if self._selector_index.matches_of_selector(key):
                self._active_policies.add(key)
                self._rules.on_policy_active(key, self._policies[key])
            elif key in self._active_policies:
                self._active_policies.discard(key)
                self._rules.on_policy_inactive(key)
        self._dirty_policies.clear()
        for name in self._dirty_profiles:
            if self._profile_users.get(name):
                self._active_profiles.add(name)
                self._rules.on_profile_active(name, self._profiles.get(name))
            elif name in self._active_profiles:
                self._active_profiles.discard(name)
                self._rules.on_profile_inactive(name)
        self._dirty_profiles.clear()

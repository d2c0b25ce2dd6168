"""RuleScanner: active policies/profiles -> resolved `proto` rules plus the IP sets they use.

Role (Felix's RuleScanner together with libcalico-go's rule conversion). Inputs: the
ActiveRulesCalculator's `on_policy_active/inactive`, `on_profile_active/inactive`.
Outputs:
- `ipsets.on_ip_set_active(IPSetSpec)` / `on_ip_set_inactive(id)`: an IP set is used by at
  least one active policy/profile / by none any more (reference counted per owner);
- `sink.on_policy_update(PolicyID, proto.Policy)` / `on_policy_remove(PolicyID)` and
  `sink.on_profile_update(name, proto.Profile)` / `on_profile_remove(name)`.

Rule resolution, per rule side (source / destination):
- selector fields -> ONE positive selector (namespace and service-account semantics in
  `selectors.rule_side_selectors`) -> one `net` IP set; `notSelector` -> a negated set
  (folded into the positive one when there is one, as Felix does);
- named ports -> `ip_port` IP sets keyed by (positive selector or `all()`, protocol, port
  name); when a side has only named ports, the plain selector set is left out because the
  named-port sets are already filtered by it (Felix's optimisation; `proto.Rule` documents
  the OR-of-ports semantics that makes this exact);
- numeric ports / ranges -> `proto.PortRange`; nets stay inline; protocol numbers as the
  model parsed them; `Pass` -> "pass".
- `rule_id`: a hash of the owner, direction, position and the resolved rule.

IP-set ids: `Selector.unique_id` (`s:...`) for selector sets; `n:` + a hash of (selector id,
protocol, port name) for named-port sets. Stable across runs and hosts.

A profile that does not exist (an endpoint lists it but no Profile resource is known)
resolves to deny-all in both directions.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.selectors import ALL, rule_side_selectors
from pyfelix.agent.model import NetworkPolicy, Profile
from pyfelix.agent.model.rules import Port, Rule
from pyfelix.agent.selector import Selector, parse
from pyfelix.agent.syncer.api import ResourceKey

PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp", 136: "udplite"}
IPSET_TYPE_NET = "net"
IPSET_TYPE_IP_PORT = "ip_port"

DENY_ALL = proto.Profile(inbound_rules=(proto.Rule(action="deny"),),
                         outbound_rules=(proto.Rule(action="deny"),))


@dataclass(frozen=True)
class NamedPort:
    protocol: int
    name: str

    @property
    def protocol_name(self) -> str:
        return PROTOCOL_NAMES.get(self.protocol, str(self.protocol))


@dataclass(frozen=True)
class IPSetSpec:
    """What an IP set contains: endpoints matching `selector`; with `named_port`, only
    (address, protocol, port) entries of endpoints that have that named port."""

    id: str
    selector: Selector
    named_port: NamedPort | None = None

    @property
    def type(self) -> str:
        return IPSET_TYPE_NET if self.named_port is None else IPSET_TYPE_IP_PORT


@functools.lru_cache(maxsize=8192)
def selector_ip_set(text: str) -> IPSetSpec:
    selector = parse(text)
    return IPSetSpec(selector.unique_id, selector)


@functools.lru_cache(maxsize=8192)
def named_port_ip_set(text: str, protocol: int, name: str) -> IPSetSpec:
    selector = parse(text or ALL)
    named = NamedPort(protocol, name)
    return IPSetSpec(_hash_id("n:", f"{selector.unique_id},{named.protocol_name},{name}"),
                     selector, named)


def _hash_id(prefix: str, text: str, chars: int = 28) -> str:
    digest = hashlib.sha224(text.encode("utf-8")).digest()
    return prefix + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")[:chars]


def policy_id(policy: NetworkPolicy) -> proto.PolicyID:
    return proto.PolicyID(tier=policy.tier, name=policy.policy_id)


class IPSetListener(Protocol):
    def on_ip_set_active(self, spec: IPSetSpec) -> None: ...
    def on_ip_set_inactive(self, ip_set_id: str) -> None: ...


class RulesSink(Protocol):
    def on_policy_update(self, policy_id: proto.PolicyID, policy: proto.Policy) -> None: ...
    def on_policy_remove(self, policy_id: proto.PolicyID) -> None: ...
    def on_profile_update(self, name: str, profile: proto.Profile) -> None: ...
    def on_profile_remove(self, name: str) -> None: ...


# --- rule conversion -------------------------------------------------------------------


class _RuleBuilder:
    """Converts the rules of one owner, collecting the IP sets they use."""

    def __init__(self, owner: str, namespace: str) -> None:
        self.owner = owner
        self.namespace = namespace
        self.ip_sets: dict[str, IPSetSpec] = {}

    def rules(self, rules: tuple[Rule, ...], direction: str) -> tuple[proto.Rule, ...]:
        return tuple(self.rule(r, direction, i) for i, r in enumerate(rules))

    def rule(self, rule: Rule, direction: str, index: int) -> proto.Rule:
        named_protocol = rule.protocol if rule.protocol in PROTOCOL_NAMES else 6
        fields: dict[str, object] = {}
        for side, entity in (("src", rule.source), ("dst", rule.destination)):
            positive, negative = rule_side_selectors(entity, self.namespace)
            numeric, named = _split_ports(entity.ports)
            not_numeric, not_named = _split_ports(entity.not_ports)
            fields[f"{side}_nets"] = entity.nets
            fields[f"not_{side}_nets"] = entity.not_nets
            fields[f"{side}_ports"] = numeric
            fields[f"not_{side}_ports"] = not_numeric
            fields[f"{side}_named_port_ip_set_ids"] = self._named(positive, named_protocol, named)
            fields[f"not_{side}_named_port_ip_set_ids"] = self._named(
                positive, named_protocol, not_named)
            if positive and (numeric or not named):
                fields[f"{side}_ip_set_ids"] = (self._add(selector_ip_set(positive)),)
            if negative:
                fields[f"not_{side}_ip_set_ids"] = (self._add(selector_ip_set(negative)),)
        resolved = proto.Rule(
            action=rule.action.lower(),
            ip_version=rule.ip_version,
            protocol=rule.protocol,
            not_protocol=rule.not_protocol,
            icmp_type=rule.icmp.type if rule.icmp else None,
            icmp_code=rule.icmp.code if rule.icmp else None,
            not_icmp_type=rule.not_icmp.type if rule.not_icmp else None,
            not_icmp_code=rule.not_icmp.code if rule.not_icmp else None,
            **fields,  # type: ignore[arg-type]
        )
        rule_id = _hash_id("", f"{self.owner}|{direction}|{index}|{resolved!r}", 16)
        return dataclasses.replace(resolved, rule_id=rule_id)

    def _named(self, positive: str, protocol: int, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self._add(named_port_ip_set(positive, protocol, n)) for n in names)

    def _add(self, spec: IPSetSpec) -> str:
        self.ip_sets[spec.id] = spec
        return spec.id


def _split_ports(ports: tuple[Port, ...]) -> tuple[tuple[proto.PortRange, ...], tuple[str, ...]]:
    numeric = tuple(proto.PortRange(p.first, p.last) for p in ports if not p.name)
    named = tuple(dict.fromkeys(p.name for p in ports if p.name))
    return numeric, named


def convert_policy(policy: NetworkPolicy) -> tuple[proto.Policy, dict[str, IPSetSpec]]:
    namespace = "" if policy.is_global else policy.key.namespace
    builder = _RuleBuilder(f"policy/{policy.tier}/{policy.policy_id}", namespace)
    resolved = proto.Policy(
        namespace=namespace,
        inbound_rules=builder.rules(policy.ingress, "inbound"),
        outbound_rules=builder.rules(policy.egress, "outbound"),
        untracked=policy.do_not_track,
        pre_dnat=policy.pre_dnat,
        apply_on_forward=policy.apply_on_forward,
    )
    return resolved, builder.ip_sets


def convert_profile(name: str,
                    profile: Profile | None) -> tuple[proto.Profile, dict[str, IPSetSpec]]:
    if profile is None:
        return DENY_ALL, {}
    builder = _RuleBuilder(f"profile/{name}", "")
    resolved = proto.Profile(inbound_rules=builder.rules(profile.ingress, "inbound"),
                             outbound_rules=builder.rules(profile.egress, "outbound"))
    return resolved, builder.ip_sets


# --- the node --------------------------------------------------------------------------


class RuleScanner:
    def __init__(self, ipsets: IPSetListener, sink: RulesSink) -> None:
        self._ipsets = ipsets
        self._sink = sink
        self._sources: dict[object, object] = {}  # owner -> last converted source object
        self._policy_ids: dict[ResourceKey, proto.PolicyID] = {}
        self._sets_of_owner: dict[object, frozenset[str]] = {}
        self._owners_of_set: dict[str, set[object]] = {}
        self._specs: dict[str, IPSetSpec] = {}

    def ip_set_specs(self) -> dict[str, IPSetSpec]:
        """The IP sets the active rules use: id -> spec (selector, named port); a copy."""
        return dict(self._specs)

    def on_policy_active(self, key: ResourceKey, policy: NetworkPolicy) -> None:
        owner = ("policy", key)
        if self._sources.get(owner) is policy:
            return
        self._sources[owner] = policy
        new_id = policy_id(policy)
        old_id = self._policy_ids.get(key)
        resolved, ip_sets = convert_policy(policy)
        self._update_owner(owner, ip_sets)
        self._policy_ids[key] = new_id
        self._sink.on_policy_update(new_id, resolved)
        if old_id is not None and old_id != new_id:
            self._sink.on_policy_remove(old_id)

    def on_policy_inactive(self, key: ResourceKey) -> None:
        owner = ("policy", key)
        self._sources.pop(owner, None)
        old_id = self._policy_ids.pop(key, None)
        if old_id is not None:
            self._sink.on_policy_remove(old_id)
        self._update_owner(owner, {})

    def on_profile_active(self, name: str, profile: Profile | None) -> None:
        owner = ("profile", name)
        if owner in self._sources and self._sources[owner] is profile:
            return
        self._sources[owner] = profile
        resolved, ip_sets = convert_profile(name, profile)
        self._update_owner(owner, ip_sets)
        self._sink.on_profile_update(name, resolved)

    def on_profile_inactive(self, name: str) -> None:
        owner = ("profile", name)
        if owner not in self._sources:
            return
        del self._sources[owner]
        self._sink.on_profile_remove(name)
        self._update_owner(owner, {})

    def _update_owner(self, owner: object, ip_sets: dict[str, IPSetSpec]) -> None:
        old = self._sets_of_owner.get(owner, frozenset())
        new = frozenset(ip_sets)
        if new:
            self._sets_of_owner[owner] = new
        else:
            self._sets_of_owner.pop(owner, None)
        for set_id in new - old:
            owners = self._owners_of_set.get(set_id)
            if owners is None:
                self._owners_of_set[set_id] = {owner}
                self._specs[set_id] = ip_sets[set_id]
                self._ipsets.on_ip_set_active(ip_sets[set_id])
            else:
                owners.add(owner)
        for set_id in old - new:
            owners = self._owners_of_set[set_id]
            owners.discard(owner)
            if not owners:
                del self._owners_of_set[set_id]
                del self._specs[set_id]
                self._ipsets.on_ip_set_inactive(set_id)

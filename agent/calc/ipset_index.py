"""IPSetMemberIndex: the members of every ACTIVE IP set, from all endpoints and network sets.

Role (Felix's SelectorAndNamedPortIndex). Inputs:
- workload and host endpoints of EVERY node, and (global) network sets (all-updates
  dispatcher); profile labels (ProfileDecoder) for label inheritance;
- `on_ip_set_active(IPSetSpec)` / `on_ip_set_inactive(id)` from the RuleScanner.

Outputs to `sink`: `on_ip_set_added(id, type)`, `on_ip_set_member_added(id, member)`,
`on_ip_set_member_removed(id, member)`, `on_ip_set_removed(id)`.

Membership: an item belongs to an IP set when the set's selector matches the item's
effective labels (own + inherited profile labels; `labels.labels_and_parents`):
- `net` sets get the item's addresses: a workload's `ipNetworks`, a host endpoint's
  `expectedIPs` (as /32 or /128), a network set's `nets`;
- `ip_port` (named-port) sets get `<cidr>,<proto>:<port>` for each address of each
  ENDPOINT having a port of that name and protocol (network sets have no ports).
Global network sets have no namespace label, so namespaced rule selectors (which carry
`projectcalico.org/namespace == ...`) never see them unless a rule says
`namespaceSelector: global()`; namespaced network sets carry their namespace label and the
`kns.<ns>` profile's labels, exactly as Calico presents them.

Members are reference counted: two items contributing the same member (two network sets
listing one CIDR, an address moving between pods) yield one member, removed only when the
last contributor goes. Matching goes through a `SelectorIndex` keyed by selector id, so one
selector used by several sets (plain and named-port) is evaluated once.

Invariants: a set's members are a function of the current items and the set's spec; an
inactive set holds nothing and is forgotten; deleting an item withdraws all it contributed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from pyfelix.agent.calc.dispatcher import (
    ENDPOINT_KINDS,
    NETWORK_SET_KINDS,
    CalcUpdate,
    Dispatcher,
)
from pyfelix.agent.calc.labels import LabelInheritIndex, labels_and_parents
from pyfelix.agent.calc.rule_scanner import IPSetSpec
from pyfelix.agent.calc.selector_index import SelectorIndex
from pyfelix.agent.model import HostEndpoint, NetworkSet, WorkloadEndpoint


class IPSetSink(Protocol):
    def on_ip_set_added(self, ip_set_id: str, ip_set_type: str) -> None: ...
    def on_ip_set_removed(self, ip_set_id: str) -> None: ...
    def on_ip_set_member_added(self, ip_set_id: str, member: str) -> None: ...
    def on_ip_set_member_removed(self, ip_set_id: str, member: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ItemData:
    """What an item can contribute: its CIDRs and its named ports (name, protocol, port)."""

    nets: tuple[str, ...]
    ports: tuple[tuple[str, int, int], ...] = ()


def item_data(value: Any) -> ItemData:
    if isinstance(value, WorkloadEndpoint):
        return ItemData(value.ip_networks,
                        tuple((p.name, p.protocol, p.port) for p in value.ports))
    if isinstance(value, HostEndpoint):
        nets = tuple(str(ipaddress.ip_network(ip)) for ip in value.expected_ips)
        return ItemData(nets, tuple((p.name, p.protocol, p.port) for p in value.ports))
    if isinstance(value, NetworkSet):
        return ItemData(value.nets)
    raise TypeError(f"{type(value).__name__} cannot be an IP set member")


def members_of(spec: IPSetSpec, data: ItemData) -> list[str]:
    named = spec.named_port
    if named is None:
        return list(data.nets)
    ports = [port for name, protocol, port in data.ports
             if name == named.name and protocol == named.protocol]
    if not ports:
        return []
    proto_name = named.protocol_name
    return [f"{net},{proto_name}:{port}" for net in data.nets for port in ports]


class IPSetMemberIndex:
    def __init__(self, sink: IPSetSink, *, naive: bool = False) -> None:
        self._sink = sink
        self._specs: dict[str, IPSetSpec] = {}
        self._sets_of_selector: dict[str, set[str]] = {}
        self._members: dict[str, dict[str, int]] = {}
        self._data: dict[Hashable, ItemData] = {}
        self._selector_index = SelectorIndex(self._on_match_started, self._on_match_stopped,
                                             naive=naive)
        self._labels = LabelInheritIndex(self._on_labels)

    def register_with(self, dispatcher: Dispatcher) -> None:
        for kind in ENDPOINT_KINDS + NETWORK_SET_KINDS:
            dispatcher.register(kind, self.on_update)

    # --- inputs -------------------------------------------------------------------------

    def on_update(self, update: CalcUpdate) -> None:
        key, value = update.key, update.value
        if value is None:
            self._labels.delete_item(key)
            self._data.pop(key, None)
            return
        data = item_data(value)
        old = self._data.get(key)
        if old != data:
            if old is not None:
                self._recontribute(key, old, data)
            self._data[key] = data
        labels, parents = labels_and_parents(value)
        self._labels.update_item(key, labels, parents)

    def on_profile_labels(self, name: str, labels: dict[str, str] | None) -> None:
        self._labels.update_parent(name, labels)

    def on_ip_set_active(self, spec: IPSetSpec) -> None:
        if spec.id in self._specs:
            return
        self._specs[spec.id] = spec
        self._members[spec.id] = {}
        self._sink.on_ip_set_added(spec.id, spec.type)
        selector_id = spec.selector.unique_id
        sets = self._sets_of_selector.get(selector_id)
        if sets is None:
            self._sets_of_selector[selector_id] = {spec.id}
            self._selector_index.update_selector(selector_id, spec.selector)
        else:
            sets.add(spec.id)
            for item in self._selector_index.matches_of_selector(selector_id):
                for member in members_of(spec, self._data[item]):
                    self._add_member(spec.id, member)

    def on_ip_set_inactive(self, ip_set_id: str) -> None:
        spec = self._specs.pop(ip_set_id, None)
        if spec is None:
            return
        del self._members[ip_set_id]
        self._sink.on_ip_set_removed(ip_set_id)
        selector_id = spec.selector.unique_id
        sets = self._sets_of_selector[selector_id]
        sets.discard(ip_set_id)
        if not sets:
            del self._sets_of_selector[selector_id]
            self._selector_index.delete_selector(selector_id)

    # --- queries ------------------------------------------------------------------------

    def members(self, ip_set_id: str) -> frozenset[str]:
        return frozenset(self._members.get(ip_set_id, ()))

    def active_ids(self) -> list[str]:
        return sorted(self._specs)

    @property
    def evaluations(self) -> int:
        return self._selector_index.evaluations

    # --- internals ----------------------------------------------------------------------

    def _on_labels(self, item: Hashable, labels: dict[str, str] | None) -> None:
        if labels is None:
            self._selector_index.delete_item(item)
        else:
            self._selector_index.update_item(item, labels)

    def _on_match_started(self, selector_id: Any, item: Hashable) -> None:
        data = self._data[item]
        for set_id in self._sets_of_selector.get(selector_id, ()):
            for member in members_of(self._specs[set_id], data):
                self._add_member(set_id, member)

    def _on_match_stopped(self, selector_id: Any, item: Hashable) -> None:
        data = self._data[item]
        for set_id in self._sets_of_selector.get(selector_id, ()):
            for member in members_of(self._specs[set_id], data):
                self._remove_member(set_id, member)

    def _recontribute(self, item: Hashable, old: ItemData, new: ItemData) -> None:
        for selector_id in self._selector_index.matches_of_item(item):
            for set_id in self._sets_of_selector.get(selector_id, ()):
                spec = self._specs[set_id]
                before = members_of(spec, old)
                after = members_of(spec, new)
                for member in after:
                    self._add_member(set_id, member)
                for member in before:
                    self._remove_member(set_id, member)

    def _add_member(self, set_id: str, member: str) -> None:
        counts = self._members[set_id]
        count = counts.get(member, 0)
        counts[member] = count + 1
        if not count:
            self._sink.on_ip_set_member_added(set_id, member)

    def _remove_member(self, set_id: str, member: str) -> None:
        counts = self._members[set_id]
        count = counts[member]
        if count == 1:
            del counts[member]
            self._sink.on_ip_set_member_removed(set_id, member)
        else:
            counts[member] = count - 1

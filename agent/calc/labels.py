"""Effective labels of endpoints and network sets: own labels plus inherited profile labels.

Role: the label half of Felix's `labelindex.InheritIndex`. Two pieces:
- `labels_and_parents(resource)`: the labels Calico gives an endpoint / network set before
  inheritance, and the profiles it inherits from. Workload endpoints get
  `projectcalico.org/namespace`, `projectcalico.org/orchestrator` and (with a service
  account) `projectcalico.org/serviceaccount`; their own `pcns.*` / `pcsa.*` labels are
  DROPPED (as libcalico-go does: a workload must not pretend to be in another namespace).
  Namespaced network sets get `projectcalico.org/namespace` and inherit from `kns.<ns>`.
- `LabelInheritIndex`: items (endpoint / network-set keys) with own labels and an ordered
  parent list; parents (profiles) with labels. It calls `on_labels(item, labels | None)`
  whenever an item's effective labels change (own labels win over inherited ones; an
  earlier parent wins over a later one).

Invariants: every `update_item` is matched by a `delete_item` (the index forgets the item,
its parent links and its effective labels); `on_labels` is never called with labels equal
to the last ones sent for that item.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from pyfelix.agent.calc.selectors import (
    LABEL_NAMESPACE,
    LABEL_ORCHESTRATOR,
    LABEL_SERVICE_ACCOUNT,
    NAMESPACE_LABEL_PREFIX,
    NAMESPACE_PROFILE_PREFIX,
    SERVICE_ACCOUNT_LABEL_PREFIX,
)
from pyfelix.agent.model import HostEndpoint, NetworkSet, WorkloadEndpoint

Labels = dict[str, str]
MAX_SHARED_KEY_TUPLES = 4096  # distinct label-key sets shared per index (then: unshared)
LabelsCallback = Callable[[Hashable, Labels | None], None]


def labels_and_parents(resource: Any) -> tuple[Labels, tuple[str, ...]]:
    """Own labels (as Calico presents them to Felix) and parent profile names."""
    own = dict(resource.meta.labels)
    if isinstance(resource, WorkloadEndpoint):
        labels = {k: v for k, v in own.items()
                  if not k.startswith((NAMESPACE_LABEL_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX))}
        labels[LABEL_NAMESPACE] = resource.key.namespace
        labels[LABEL_ORCHESTRATOR] = resource.orchestrator
        if resource.service_account_name:
            labels[LABEL_SERVICE_ACCOUNT] = resource.service_account_name
        return labels, tuple(resource.profiles)
    if isinstance(resource, HostEndpoint):
        return own, tuple(resource.profiles)
    if isinstance(resource, NetworkSet):
        if resource.is_global:
            return own, ()
        own[LABEL_NAMESPACE] = resource.key.namespace
        return own, (NAMESPACE_PROFILE_PREFIX + resource.key.namespace,)
    raise TypeError(f"no labels for {type(resource).__name__}")


class LabelInheritIndex:
    """Own labels + parent labels -> effective labels, with change notifications."""

    def __init__(self, on_labels: LabelsCallback) -> None:
        self._on_labels = on_labels
        # An item's own labels are not kept apart from its effective labels: only the keys
        # of its effective labels that came from its parents (a tuple shared by every item
        # with the same inherited keys, e.g. a namespace's pods). Own labels = effective
        # labels less those keys. (An own-labels dict per endpoint cost ~270 bytes.)
        self._inherited: dict[Hashable, tuple[str, ...]] = {}
        self._key_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._parents_of: dict[Hashable, tuple[str, ...]] = {}
        self._items_of_parent: dict[str, set[Hashable]] = {}
        self._parent_labels: dict[str, Labels] = {}
        self._effective: dict[Hashable, Labels] = {}

    def update_item(self, item: Hashable, own: Labels, parents: tuple[str, ...]) -> None:
        old_parents = self._parents_of.get(item, ())
        if old_parents != parents:
            for parent in old_parents:
                self._unlink(parent, item)
            for parent in parents:
                self._items_of_parent.setdefault(parent, set()).add(item)
            self._parents_of[item] = parents
        self._recalculate(item, own)

    def delete_item(self, item: Hashable) -> None:
        if item not in self._inherited:
            return
        for parent in self._parents_of.pop(item, ()):
            self._unlink(parent, item)
        del self._inherited[item]
        if self._effective.pop(item, None) is not None:
            self._on_labels(item, None)

    def update_parent(self, parent: str, labels: Labels | None) -> None:
        if labels:
            if self._parent_labels.get(parent) == labels:
                return
            self._parent_labels[parent] = labels
        elif self._parent_labels.pop(parent, None) is None:
            return
        for item in list(self._items_of_parent.get(parent, ())):
            self._recalculate(item)

    def items(self) -> dict[Hashable, Labels]:
        return dict(self._effective)

    def __len__(self) -> int:
        return len(self._inherited)

    def _unlink(self, parent: str, item: Hashable) -> None:
        items = self._items_of_parent.get(parent)
        if items is not None:
            items.discard(item)
            if not items:
                del self._items_of_parent[parent]

    def _own_labels(self, item: Hashable) -> Labels:
        inherited = self._inherited.get(item, ())
        current = self._effective.get(item) or {}
        return {k: v for k, v in current.items() if k not in inherited}

    def _recalculate(self, item: Hashable, own: Labels | None = None) -> None:
        effective = dict(self._own_labels(item) if own is None else own)
        added: list[str] = []
        for parent in self._parents_of.get(item, ()):
            inherited = self._parent_labels.get(parent)
            if inherited:
                for key, value in inherited.items():
                    if key not in effective:
                        effective[key] = value
                        added.append(key)
        keys = tuple(added)
        if len(self._key_tuples) < MAX_SHARED_KEY_TUPLES:
            keys = self._key_tuples.setdefault(keys, keys)
        self._inherited[item] = keys
        if self._effective.get(item) != effective:
            self._effective[item] = effective
            self._on_labels(item, effective)

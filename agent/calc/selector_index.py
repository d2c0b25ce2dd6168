"""Which selectors match which labelled items, without evaluating every pair.

Role: the matching core shared by the ActiveRulesCalculator (policy selectors x local
endpoints) and the IPSetMemberIndex (IP-set selectors x all endpoints and network sets).
Inputs: `update_selector(id, Selector)` / `delete_selector(id)` and
`update_item(id, labels)` / `delete_item(id)`. Outputs: `on_match_started(sel, item)` and
`on_match_stopped(sel, item)` callbacks, exactly once per change of the (sel, item) pair.

How candidates are found (the point of this class): each selector is filed under ONE
"anchor", a label requirement that every item it matches must meet (from
`Selector.required_labels()`): a (key, value) pair, a (key, any value) pair, or nothing
(selectors such as `!has(x)` that labels cannot rule out). Items are filed under each of
their (key, value) pairs and keys. When an item changes, only selectors anchored on one of
its labels (plus the unanchored ones) are evaluated; when a selector changes, only items in
its anchor's buckets are. The anchor is the requirement with the fewest items at the time
the selector arrives (namespace / profile-derived keys lose ties: they are shared widely).
Items are filed only under label keys some selector has required (the first selector to
require a key pays one scan of the items), so labels nobody selects on cost nothing.

`naive=True` keeps the all-pairs behaviour (every selector against every item) for the
benchmark's comparison and for tests that check both modes agree.

Invariants: matches are a pure function of the current selectors and items; deleting a
selector or an item stops all its matches before it is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from pyfelix.agent.calc.selectors import NAMESPACE_LABEL_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX
from pyfelix.agent.calc.set_index import discard_member
from pyfelix.agent.selector import Selector

MatchCallback = Callable[[Hashable, Hashable], None]

_WIDE_KEY_PREFIXES = ("projectcalico.org/", NAMESPACE_LABEL_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX)

# Anchor kinds: ("value", key, values) | ("key", key) | ("none",) | ("never",)
Anchor = tuple


class SelectorIndex:
    """Selectors x labelled items -> match start/stop callbacks (see module docstring)."""

    def __init__(self, on_match_started: MatchCallback, on_match_stopped: MatchCallback,
                 *, naive: bool = False) -> None:
        self._started = on_match_started
        self._stopped = on_match_stopped
        self.naive = naive
        self._selectors: dict[Hashable, Selector] = {}
        self._anchors: dict[Hashable, Anchor] = {}
        self._sels_by_value: dict[tuple[str, str], set[Hashable]] = {}
        self._sels_by_key: dict[str, set[Hashable]] = {}
        self._sels_unanchored: set[Hashable] = set()
        self._items: dict[Hashable, Mapping[str, str]] = {}
        self._items_by_value: dict[tuple[str, str], set[Hashable]] = {}
        self._items_by_key: dict[str, set[Hashable]] = {}
        # label keys some selector has required: only these are filed (see _index_key)
        self._indexed_keys: set[str] = set()
        self._matches_of_item: dict[Hashable, set[Hashable]] = {}
        self._matches_of_sel: dict[Hashable, set[Hashable]] = {}
        self.evaluations = 0  # selector evaluations performed (for benchmarks and tests)

    # --- selectors ----------------------------------------------------------------------

    def update_selector(self, sel_id: Hashable, selector: Selector) -> None:
        old = self._selectors.get(sel_id)
        if old is not None and old.canonical == selector.canonical:
            return
        if old is not None:
            self._unfile_selector(sel_id)
        self._selectors[sel_id] = selector
        self._file_selector(sel_id, selector)
        evaluate = selector.evaluate
        items = self._items
        candidates = self._candidate_items(sel_id)
        self.evaluations += len(candidates)
        new = {i for i in candidates if evaluate(items[i])}
        old_matches = self._matches_of_sel.get(sel_id, set())
        for item in old_matches - new:
            self._stop(sel_id, item)
        for item in new - old_matches:
            self._start(sel_id, item)

    def delete_selector(self, sel_id: Hashable) -> None:
        if sel_id not in self._selectors:
            return
        for item in list(self._matches_of_sel.get(sel_id, ())):
            self._stop(sel_id, item)
        self._unfile_selector(sel_id)
        del self._selectors[sel_id]

    # --- items --------------------------------------------------------------------------

    def update_item(self, item: Hashable, labels: Mapping[str, str]) -> None:
        old = self._items.get(item)
        if old is not None:
            if old == labels:
                return
            self._refile_item(item, old, labels)
        else:
            self._file_item(item, labels)
        self._items[item] = labels
        selectors = self._selectors
        candidates = self._candidate_selectors(labels)
        self.evaluations += len(candidates)
        new = {s for s in candidates if selectors[s].evaluate(labels)}
        old_matches = self._matches_of_item.get(item, set())
        for sel_id in old_matches - new:
            self._stop(sel_id, item)
        for sel_id in new - old_matches:
            self._start(sel_id, item)

    def delete_item(self, item: Hashable) -> None:
        old = self._items.pop(item, None)
        if old is None:
            return
        for sel_id in list(self._matches_of_item.get(item, ())):
            self._stop(sel_id, item)
        self._unfile_item(item, old)

    # --- queries ------------------------------------------------------------------------

    def matches_of_selector(self, sel_id: Hashable) -> frozenset:
        return frozenset(self._matches_of_sel.get(sel_id, ()))

    def matches_of_item(self, item: Hashable) -> frozenset:
        return frozenset(self._matches_of_item.get(item, ()))

    def __len__(self) -> int:
        return len(self._items)

    # --- internals ----------------------------------------------------------------------

    def _start(self, sel_id: Hashable, item: Hashable) -> None:
        self._matches_of_sel.setdefault(sel_id, set()).add(item)
        self._matches_of_item.setdefault(item, set()).add(sel_id)
        self._started(sel_id, item)

    def _stop(self, sel_id: Hashable, item: Hashable) -> None:
        discard_member(self._matches_of_sel, sel_id, item)
        discard_member(self._matches_of_item, item, sel_id)
        self._stopped(sel_id, item)

    def _choose_anchor(self, selector: Selector) -> Anchor:
        if self.naive:
            return ("none",)
        best: tuple | None = None
        for key, values in selector.required_labels().items():
            if values is not None and not values:
                return ("never",)
            self._index_key(key)
            if values is None:
                size = len(self._items_by_key.get(key, ()))
                anchor: Anchor = ("key", key)
            else:
                size = sum(len(self._items_by_value.get((key, v), ())) for v in values)
                anchor = ("value", key, values)
            rank = (size, key.startswith(_WIDE_KEY_PREFIXES), values is None,
                    len(values or ()), key)
            if best is None or rank < best[0]:
                best = (rank, anchor)
        return best[1] if best is not None else ("none",)

    def _file_selector(self, sel_id: Hashable, selector: Selector) -> None:
        anchor = self._choose_anchor(selector)
        self._anchors[sel_id] = anchor
        kind = anchor[0]
        if kind == "value":
            for value in anchor[2]:
                self._sels_by_value.setdefault((anchor[1], value), set()).add(sel_id)
        elif kind == "key":
            self._sels_by_key.setdefault(anchor[1], set()).add(sel_id)
        elif kind == "none":
            self._sels_unanchored.add(sel_id)

    def _unfile_selector(self, sel_id: Hashable) -> None:
        anchor = self._anchors.pop(sel_id)
        kind = anchor[0]
        if kind == "value":
            for value in anchor[2]:
                discard_member(self._sels_by_value, (anchor[1], value), sel_id)
        elif kind == "key":
            discard_member(self._sels_by_key, anchor[1], sel_id)
        elif kind == "none":
            self._sels_unanchored.discard(sel_id)

    def _index_key(self, key: str) -> None:
        """Start filing items under `key` (once per key: a scan of the items)."""
        if key in self._indexed_keys:
            return
        self._indexed_keys.add(key)
        for item, labels in self._items.items():
            value = labels.get(key)
            if value is not None:
                self._items_by_value.setdefault((key, value), set()).add(item)
                self._items_by_key.setdefault(key, set()).add(item)

    def _file_item(self, item: Hashable, labels: Mapping[str, str]) -> None:
        indexed = self._indexed_keys
        by_value = self._items_by_value
        by_key = self._items_by_key
        for key, value in labels.items():
            if key not in indexed:
                continue
            bucket = by_value.get((key, value))
            if bucket is None:
                by_value[(key, value)] = {item}
            else:
                bucket.add(item)
            bucket = by_key.get(key)
            if bucket is None:
                by_key[key] = {item}
            else:
                bucket.add(item)

    def _refile_item(self, item: Hashable, old: Mapping[str, str],
                     new: Mapping[str, str]) -> None:
        """Move `item` between buckets for the indexed labels that changed only."""
        indexed = self._indexed_keys
        for key, value in old.items():
            if key in indexed and new.get(key) != value:
                discard_member(self._items_by_value, (key, value), item)
                if key not in new:
                    discard_member(self._items_by_key, key, item)
        for key, value in new.items():
            if key in indexed and old.get(key) != value:
                self._items_by_value.setdefault((key, value), set()).add(item)
                if key not in old:
                    self._items_by_key.setdefault(key, set()).add(item)

    def _unfile_item(self, item: Hashable, labels: Mapping[str, str]) -> None:
        indexed = self._indexed_keys
        for key, value in labels.items():
            if key in indexed:
                discard_member(self._items_by_value, (key, value), item)
                discard_member(self._items_by_key, key, item)

    def _candidate_items(self, sel_id: Hashable) -> set[Hashable] | dict:
        anchor = self._anchors[sel_id]
        kind = anchor[0]
        if kind == "none":
            return self._items.keys()  # type: ignore[return-value]
        if kind == "never":
            return set()
        if kind == "key":
            return set(self._items_by_key.get(anchor[1], ()))
        out: set[Hashable] = set()
        key = anchor[1]
        for value in anchor[2]:
            out.update(self._items_by_value.get((key, value), ()))
        return out

    def _candidate_selectors(self, labels: Mapping[str, str]) -> set[Hashable]:
        if self.naive:
            return set(self._selectors)
        out = set(self._sels_unanchored)
        by_value = self._sels_by_value
        by_key = self._sels_by_key
        for pair in labels.items():
            found = by_value.get(pair)
            if found:
                out |= found
            found = by_key.get(pair[0])
            if found:
                out |= found
        return out

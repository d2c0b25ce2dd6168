"""What a selector demands of every label set it matches: input for the calc graph's index.

Role: `required_labels(node)` answers "which labels must a label set have, and with which
values, for this selector to possibly match it?" so a label index can look only at
candidates instead of evaluating every selector against every endpoint.
`referenced_keys(node)` lists every label key the selector reads.

Output of `required_labels`: `dict[str, frozenset[str] | None]`. Meaning, for EVERY label
mapping `L` that the selector matches, and every `key -> values` in the result:
- `key in L`, and
- if `values` is a frozenset, `L[key] in values` (`None` means: any value).
So it is a NECESSARY condition, never sufficient: candidates still have to be evaluated.
An empty dict means "nothing can be ruled out by labels alone" (e.g. `all()`, `!has(a)`,
`a != "x"`, `a == "x" || b == "y"`). An empty frozenset for a key means the selector cannot
match anything (`a == "x" && a == "y"`); that is still a true statement.

Derivation (negation tracked with a flag, i.e. De Morgan applied during the walk):
- `k == v` -> {k: {v}}; `k in S` -> {k: S}; `has(k)`, `contains`, `starts with`,
  `ends with` -> {k: None}; `!=`, `not in`, `all()`, `global()` -> {}.
- negated: `!(k != v)` -> {k: {v}}; `!(k not in S)` -> {k: S}; `!global()` ->
  {projectcalico.org/namespace: None}; other negated leaves -> {}.
- `a && b`: every key required by either; a key required by both keeps the intersection
  of the value sets (None acts as "any").
- `a || b`: only keys required by every operand; values are the union (None if any is None).
"""

from __future__ import annotations

from pyfelix.agent.selector.nodes import (
    NAMESPACE_LABEL,
    All,
    And,
    Compare,
    Global,
    Has,
    InSet,
    Node,
    Not,
    Op,
    Or,
)

Requirements = dict[str, frozenset[str] | None]


def required_labels(node: Node) -> Requirements:
    """Labels (and, where pinned, values) that every label set matched by `node` has."""
    return _required(node, negated=False)


def _required(node: Node, negated: bool) -> Requirements:
    match node:
        case Not(operand):
            return _required(operand, not negated)
        case And(operands):
            parts = [_required(o, negated) for o in operands]
            return _union(parts) if not negated else _common(parts)
        case Or(operands):
            parts = [_required(o, negated) for o in operands]
            return _common(parts) if not negated else _union(parts)
        case _:
            return _negated_leaf(node) if negated else _leaf(node)


def _leaf(node: Node) -> Requirements:
    match node:
        case Has(key):
            return {key: None}
        case Compare(key, Op.EQ, value):
            return {key: frozenset((value,))}
        case Compare(key, Op.NE, _):
            return {}
        case Compare(key, _, _):
            return {key: None}  # contains / starts with / ends with: absent never matches
        case InSet(key, values, negated=False):
            return {key: values}
    return {}  # all(), global(), not in


def _negated_leaf(node: Node) -> Requirements:
    match node:
        case Compare(key, Op.NE, value):
            return {key: frozenset((value,))}
        case InSet(key, values, negated=True):
            return {key: values}
        case Global():
            return {NAMESPACE_LABEL: None}
    return {}  # !has, !==, !contains..., !in, !all() (matches nothing: {} is still true)


def _union(parts: list[Requirements]) -> Requirements:
    """Requirements of a conjunction: all keys; shared keys intersect their value sets."""
    merged: Requirements = {}
    for part in parts:
        for key, values in part.items():
            if key not in merged:
                merged[key] = values
            elif values is not None:
                known = merged[key]
                merged[key] = values if known is None else known & values
    return merged


def _common(parts: list[Requirements]) -> Requirements:
    """Requirements of a disjunction: keys every part requires; value sets are unioned."""
    if not parts:
        return {}
    common: Requirements = dict(parts[0])
    for part in parts[1:]:
        for key in list(common):
            if key not in part:
                del common[key]
                continue
            known, values = common[key], part[key]
            common[key] = None if known is None or values is None else known | values
    return common


def referenced_keys(node: Node) -> frozenset[str]:
    """Every label key `node` reads (global() reads projectcalico.org/namespace)."""
    match node:
        case Has(key) | Compare(key, _, _) | InSet(key, _, _):
            return frozenset((key,))
        case Global():
            return frozenset((NAMESPACE_LABEL,))
        case All():
            return frozenset()
        case Not(operand):
            return referenced_keys(operand)
        case And(operands) | Or(operands):
            return frozenset().union(*(referenced_keys(o) for o in operands))
    raise TypeError(f"not a selector node: {node!r}")

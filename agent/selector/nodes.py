"""The selector syntax tree: small immutable nodes, one per construct of Calico's language.

Role: the shared vocabulary of the parser (which builds trees), `canonical` (which normalises
and renders them), `compiler` (which turns them into a Python function) and `analysis`
(which derives label requirements). Nothing here evaluates or parses anything.

Invariants: nodes are frozen and hashable; `And`/`Or` hold their operands as tuples; `InSet`
holds its values as a frozenset (set order and duplicates never matter). Label keys and
values are plain `str`.

Semantics (Calico's), for a label mapping `labels`:
- `Has(k)`: `k in labels`.
- `Compare(k, EQ, v)`: the label is present and equals `v`.
- `Compare(k, NE, v)`: the label is absent or differs from `v` (absent labels MATCH).
- `Compare(k, CONTAINS|STARTS_WITH|ENDS_WITH, v)`: the label is present and its value
  contains / starts with / ends with `v` (absent labels never match).
- `InSet(k, vs, negated=False)`: present with a value in `vs`; `negated=True` (`not in`):
  absent, or present with a value outside `vs`.
- `All()`: everything. `Global()`: labels without `projectcalico.org/namespace`.
- `Not`, `And`, `Or`: boolean negation, conjunction, disjunction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The label that namespaced resources carry; `global()` matches label sets without it.
NAMESPACE_LABEL = "projectcalico.org/namespace"


class Op(enum.Enum):
    """A binary label/value comparison; the value is its spelling in selector text."""

    EQ = "=="
    NE = "!="
    CONTAINS = "contains"
    STARTS_WITH = "starts with"
    ENDS_WITH = "ends with"


@dataclass(frozen=True, slots=True)
class All:
    """`all()`: matches every label set (also what the empty selector means)."""


@dataclass(frozen=True, slots=True)
class Global:
    """`global()`: matches label sets of non-namespaced things (no NAMESPACE_LABEL)."""


@dataclass(frozen=True, slots=True)
class Has:
    """`has(key)`."""

    key: str


@dataclass(frozen=True, slots=True)
class Compare:
    """`key <op> "value"` for ==, !=, contains, starts with, ends with."""

    key: str
    op: Op
    value: str


@dataclass(frozen=True, slots=True)
class InSet:
    """`key in {..}` or, with `negated`, `key not in {..}`."""

    key: str
    values: frozenset[str]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Not:
    """`!operand`."""

    operand: Node


@dataclass(frozen=True, slots=True)
class And:
    """`a && b && ...` (two or more operands once normalised)."""

    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """`a || b || ...` (two or more operands once normalised)."""

    operands: tuple[Node, ...]


Node = All | Global | Has | Compare | InSet | Not | And | Or

"""Normal form and canonical text of selector trees: equal selectors, equal strings.

Role: `normalise(node)` rewrites a parsed tree into a semantically equivalent normal form;
`render(node)` prints a normal-form tree as canonical text. The canonical text is the
identity of a selector (IP sets are keyed by it through `Selector.unique_id`).

Normal form (each rewrite keeps the meaning for every label set):
- `&&` and `||` are flattened (`a && (b && c)` -> `a && b && c`), duplicates dropped and
  operands sorted by their canonical text; a single operand stands alone.
- `all()` is dropped from `&&`; `all()` inside `||` makes the whole `||` `all()`.
- "matches nothing" (spelled `!all()`) makes an `&&` `!all()` and is dropped from `||`.
- `!!x` -> `x`; `!(k == v)` -> `k != v` and back; `!(k in S)` -> `k not in S` and back
  (exact because `!=`/`not in` match absent labels).
- `k in {v}` -> `k == v`, `k not in {v}` -> `k != v`; `k in {}` -> `!all()`;
  `k not in {}` -> `all()`.
- `contains ""`, `starts with ""`, `ends with ""` -> `has(k)` (absent never matches).
`!` is NOT pushed into `&&`/`||` (no De Morgan): it would make the text longer, not clearer.

Canonical text: single spaces around binary operators, values in double quotes (single
quotes when the value contains a double quote; a value can never contain both), set
values sorted and separated by ", ", parentheses only where precedence needs them, and
`!` written `!has(k)`, `!all()`, `!global()` for functions and `!(...)` otherwise.

Invariants (property-tested): `normalise(normalise(t)) == normalise(t)`, and parsing
`render(normalise(t))` then normalising gives back the same tree, so canonical text
round-trips. Semantically equal selectors that differ beyond these rewrites (for example
by De Morgan) may still get different texts: equal text implies equal meaning, not the
reverse.
"""

from __future__ import annotations

from pyfelix.agent.selector.nodes import All, And, Compare, Global, Has, InSet, Node, Not, Op, Or

_NOTHING = Not(All())
_VALUE_TESTS = (Op.CONTAINS, Op.STARTS_WITH, Op.ENDS_WITH)


def normalise(node: Node) -> Node:
    """The normal form of `node` (see module docstring)."""
    match node:
        case InSet(key, values, negated):
            return _normalise_set(key, values, negated)
        case Compare(key, op, "") if op in _VALUE_TESTS:
            return Has(key)
        case Not(operand):
            return _negate(normalise(operand))
        case And(operands):
            return _normalise_flat(And, operands)
        case Or(operands):
            return _normalise_flat(Or, operands)
        case _:
            return node


def _normalise_set(key: str, values: frozenset[str], negated: bool) -> Node:
    if not values:
        return All() if negated else _NOTHING
    if len(values) == 1:
        (value,) = values
        return Compare(key, Op.NE if negated else Op.EQ, value)
    return InSet(key, values, negated)


def _negate(operand: Node) -> Node:
    """`!operand` in normal form, given a normal-form operand."""
    match operand:
        case Not(inner):
            return inner
        case Compare(key, Op.EQ, value):
            return Compare(key, Op.NE, value)
        case Compare(key, Op.NE, value):
            return Compare(key, Op.EQ, value)
        case InSet(key, values, negated):
            return InSet(key, values, not negated)
        case _:
            return Not(operand)


def _normalise_flat(kind: type[And] | type[Or], operands: tuple[Node, ...]) -> Node:
    """`&&` or `||` in normal form: operands normalised and flattened, duplicates dropped.
    `all()` is the identity of `&&` and absorbs `||`; `!all()` absorbs `&&` and is the
    identity of `||`."""
    is_and = kind is And
    flat: dict[str, Node] = {}
    for operand in operands:
        normal = normalise(operand)
        parts = normal.operands if isinstance(normal, kind) else (normal,)
        for part in parts:
            if isinstance(part, All):
                if is_and:
                    continue
                return All()
            if part == _NOTHING:
                if is_and:
                    return _NOTHING
                continue
            flat.setdefault(render(part), part)
    return _join(kind, flat, empty=All() if is_and else _NOTHING)


def _join(kind: type[And] | type[Or], by_text: dict[str, Node], empty: Node) -> Node:
    if not by_text:
        return empty
    if len(by_text) == 1:
        return next(iter(by_text.values()))
    return kind(tuple(by_text[text] for text in sorted(by_text)))


def quote(value: str) -> str:
    """`value` as a selector string literal: double quotes unless it contains one."""
    return f"'{value}'" if '"' in value else f'"{value}"'


def render(node: Node) -> str:
    """Canonical text of a normal-form tree (any tree renders; only normal forms are canonical)."""
    match node:
        case All():
            return "all()"
        case Global():
            return "global()"
        case Has(key):
            return f"has({key})"
        case Compare(key, op, value):
            return f"{key} {op.value} {quote(value)}"
        case InSet(key, values, negated):
            listed = ", ".join(quote(v) for v in sorted(values))
            return f"{key} {'not in' if negated else 'in'} {{{listed}}}"
        case Not(operand):
            if isinstance(operand, All | Global | Has):
                return "!" + render(operand)
            return f"!({render(operand)})"
        case And(operands):
            return " && ".join(
                f"({render(o)})" if isinstance(o, Or) else render(o) for o in operands
            )
        case Or(operands):
            return " || ".join(
                f"({render(o)})" if isinstance(o, Or) else render(o) for o in operands
            )
    raise TypeError(f"not a selector node: {node!r}")

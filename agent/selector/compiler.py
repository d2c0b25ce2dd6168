"""Selector tree -> one Python function `evaluate(labels) -> bool`, compiled once.

Role: turn a (normalised) tree into a single Python function whose body is one boolean
expression, built as source text and compiled with `compile()`. Evaluating a selector is
then one Python call with no tree walk and no per-node function calls, which is what makes
millions of evaluations per second possible.

Input: a `Node`. Output: `Callable[[Mapping[str, str]], bool]`.

Safety: keys and values enter the generated source only through `repr()` of a `str` (always
a valid, inert literal); value sets are passed in as named frozenset constants; the code
runs with empty builtins. Depth is bounded by the parser (MAX_NESTING) so the generated
expression stays within the Python compiler's nesting limits.

Generated code per node (`L` is the label mapping, `g` its bound `.get`):
- `k == v` -> `g(k) == v` (absent gives None, never equal to a str);
- `k != v` -> `g(k) != v` (absent matches, as Calico requires);
- `k in S` / `k not in S` -> `g(k) in S` / `g(k) not in S` (None is in no set of strings);
- `has(k)` -> `k in L`; `global()` -> `NAMESPACE_LABEL not in L`; `all()` -> `True`;
- `contains v` -> `v in g(k, "")`, `starts with v` -> `g(k, "").startswith(v)`, same for
  ends with; for `v == ""` all three become `k in L` so absent labels never match.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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

Evaluator = Callable[[Mapping[str, str]], bool]


def compile_evaluator(node: Node) -> Evaluator:
    """A function equivalent to `node` over label mappings (built with `compile()`)."""
    constants: dict[str, object] = {}
    body = _emit(node, constants)
    source = f"def evaluate(L):\n    g = L.get\n    return {body}\n"
    namespace: dict[str, object] = {"__builtins__": {}, **constants}
    exec(compile(source, "<selector>", "exec"), namespace)
    function: Evaluator = namespace["evaluate"]  # type: ignore[assignment]
    return function


def _emit(node: Node, constants: dict[str, object]) -> str:
    match node:
        case All():
            return "True"
        case Global():
            return f"{NAMESPACE_LABEL!r} not in L"
        case Has(key):
            return f"{key!r} in L"
        case Compare(key, op, value):
            return _emit_compare(key, op, value)
        case InSet(key, values, negated):
            name = f"S{len(constants)}"
            constants[name] = frozenset(values)
            return f"g({key!r}) {'not in' if negated else 'in'} {name}"
        case Not(operand):
            return f"not ({_emit(operand, constants)})"
        case And(operands):
            return " and ".join(f"({_emit(o, constants)})" for o in operands)
        case Or(operands):
            return " or ".join(f"({_emit(o, constants)})" for o in operands)
    raise TypeError(f"not a selector node: {node!r}")


def _emit_compare(key: str, op: Op, value: str) -> str:
    if op is Op.EQ:
        return f"g({key!r}) == {value!r}"
    if op is Op.NE:
        return f"g({key!r}) != {value!r}"
    if value == "":
        return f"{key!r} in L"
    if op is Op.CONTAINS:
        return f"{value!r} in g({key!r}, '')"
    if op is Op.STARTS_WITH:
        return f"g({key!r}, '').startswith({value!r})"
    return f"g({key!r}, '').endswith({value!r})"

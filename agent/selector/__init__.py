"""Calico's label selector language: parse once, evaluate millions of times.

Role: a leaf used by every stage (model validation, calc graph, CLI). Imports nothing from
the rest of the agent.

API:
- `parse(text) -> Selector`; raises `SelectorError` (a `ValueError`) naming the column and
  what was expected. Results are cached (LRU) by text, and texts with the same canonical
  form share one `Selector` object (and one compiled evaluator).
- `Selector.evaluate(labels: Mapping[str, str]) -> bool`: a function compiled from the
  selector when it was first parsed (`compiler`); never re-parses.
- `Selector.canonical: str`: normal-form text (`canonical`); equal selectors -> equal text,
  and `parse(s.canonical).canonical == s.canonical`.
- `Selector.unique_id: str`: `"s:"` + the first 28 characters of the unpadded base64url
  SHA-224 of the canonical text (168 bits; 30 characters in all). Stable across runs and
  hosts; used as the identity of the selector's IP set.
- `Selector.required_labels() -> dict[str, frozenset[str] | None]`: labels every matching
  label set must carry, with the allowed values where the selector pins them (`analysis`
  states the exact contract).
- `Selector.referenced_keys: frozenset[str]`: every label key the selector reads.

Language: `k == "v"`, `k != "v"`, `k in {"a", "b"}`, `k not in {..}`, `k contains "s"`,
`k starts with "s"`, `k ends with "s"`, `has(k)`, `!`, `&&`, `||`, parentheses, `all()`,
`global()`; single or double quotes; the empty selector means `all()`. Precedence:
`!` > `&&` > `||`. `!=` and `not in` match label sets WITHOUT the label (Calico's rule).

`global()`: in Calico it appears in a `namespaceSelector` and means "not namespaced". Here a
selector is evaluated against one label mapping, so `global()` is true exactly when the
mapping has no `projectcalico.org/namespace` label (`nodes.NAMESPACE_LABEL`), the label
Calico gives every namespaced endpoint and network set. Callers evaluating namespace
selectors must therefore include that label for namespaced things.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Mapping

from pyfelix.agent.selector.analysis import Requirements, referenced_keys, required_labels
from pyfelix.agent.selector.canonical import normalise, render
from pyfelix.agent.selector.compiler import Evaluator, compile_evaluator
from pyfelix.agent.selector.errors import SelectorError
from pyfelix.agent.selector.nodes import NAMESPACE_LABEL, Node
from pyfelix.agent.selector.parser import MAX_NESTING, parse_tree

__all__ = [
    "MAX_NESTING",
    "NAMESPACE_LABEL",
    "Selector",
    "SelectorError",
    "matches",
    "parse",
    "parse_uncached",
    "unique_id_of",
]

_CACHE_SIZE = 8192
_ID_PREFIX = "s:"
_ID_HASH_CHARS = 28


def unique_id_of(canonical: str) -> str:
    """The IP-set identity of a canonical selector text (see module docstring)."""
    digest = hashlib.sha224(canonical.encode("utf-8")).digest()
    encoded = base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")
    return _ID_PREFIX + encoded[:_ID_HASH_CHARS]


class Selector:
    """A parsed, normalised and compiled selector. Immutable; compare by canonical text."""

    __slots__ = ("_required", "canonical", "evaluate", "referenced_keys", "root", "unique_id")

    canonical: str
    unique_id: str
    root: Node
    evaluate: Evaluator
    referenced_keys: frozenset[str]

    def __init__(self, root: Node, canonical: str) -> None:
        """Build from a normal-form tree and its rendering (use `parse`, not this)."""
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "canonical", canonical)
        object.__setattr__(self, "unique_id", unique_id_of(canonical))
        # the compiled function itself, not a wrapper: `sel.evaluate(labels)` is one call
        object.__setattr__(self, "evaluate", compile_evaluator(root))
        object.__setattr__(self, "referenced_keys", referenced_keys(root))
        object.__setattr__(self, "_required", required_labels(root))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Selector is immutable")

    def required_labels(self) -> Requirements:
        """Labels every matching label set has: {key: allowed values, or None for any}.

        A necessary condition only: `{}` when labels alone rule nothing out. Example:
        `a == 'x' && has(b) && (c == '1' || d == '2')` -> `{"a": frozenset({"x"}), "b": None}`.
        Returns a fresh dict each call.
        """
        return dict(self._required)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.canonical == self.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __str__(self) -> str:
        return self.canonical

    def __repr__(self) -> str:
        return f"Selector({self.canonical!r})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (parse, (self.canonical,))


class _CanonicalKey:
    """Cache key for `_interned`: hashes and compares by canonical text, carries the tree."""

    __slots__ = ("canonical", "root")

    def __init__(self, root: Node, canonical: str) -> None:
        self.root = root
        self.canonical = canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CanonicalKey) and other.canonical == self.canonical


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _interned(key: _CanonicalKey) -> Selector:
    return Selector(key.root, key.canonical)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _parse_cached(text: str) -> Selector:
    root = normalise(parse_tree(text))
    return _interned(_CanonicalKey(root, render(root)))


def parse(text: str) -> Selector:
    """Parse Calico selector `text` (cached by text). Raises SelectorError if invalid."""
    if not isinstance(text, str):
        raise SelectorError(
            repr(text), 0, "a selector string", f"a value of type {type(text).__name__}"
        )
    return _parse_cached(text)


def parse_uncached(text: str) -> Selector:
    """Parse, normalise and compile without touching the caches (benchmarks, tests)."""
    root = normalise(parse_tree(text))
    return Selector(root, render(root))


def matches(text: str, labels: Mapping[str, str]) -> bool:
    """Convenience: `parse(text).evaluate(labels)`."""
    return parse(text).evaluate(labels)

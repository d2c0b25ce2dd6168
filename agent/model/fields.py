"""Typed field access over a raw document, with the field path kept for error messages.

Every parser in `agent.model` reads documents through `Fields`, so every error names the
resource (kind, namespace/name) and the exact field path, e.g.::

    GlobalNetworkPolicy(allow-dns): spec.egress[1].destination.ports[0]: port 70000 is out of range

Inputs: whatever a YAML or JSON loader produced (dicts, lists, str, int, float, bool, None,
and from YAML also dates and non-string keys). Output: checked Python values, or a
`ValidationError`.

Invariants:
- parsers never index raw dicts directly; every read goes through a typed accessor here;
- an unknown field is an error when the caller passes `allowed` (a typo in a security
  policy must not be silently ignored);
- nothing here raises anything but `ValidationError` for any input value: no TypeError on
  mixed-type keys, no OverflowError on huge numbers, no ValueError from `int()` on exotic
  digit strings (easy to get wrong: `"²".isdigit()` is True but `int("²")` fails), no
  RecursionError or huge string from describing a deeply nested or huge value;
- no list or mapping read here holds more than `max_set_members` entries
  (`agent.inputs.LIMITS`; decoding checks every one, this covers documents built in code).
"""

from __future__ import annotations

import math
import reprlib
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from pyfelix.agent.inputs.limits import LIMITS, too_many_members
from pyfelix.agent.model.names import is_decimal, label_value_problem, qualified_name_problem

# More digits than any field we read can hold (uint32 AS numbers have 10); also keeps
# Python's int() far below its 4300-digit conversion limit.
_MAX_DIGITS = 20


class ValidationError(ValueError):
    """A resource failed validation.

    `resource` names it (`Kind(namespace/name)`), `field` is the dotted path inside the
    document ("" when the document as a whole is wrong), `message` says what is wrong.
    """

    def __init__(self, resource: str, field: str, message: str) -> None:
        self.resource = resource
        self.field = field
        self.message = message
        where = f"{resource}: {field}: " if field else f"{resource}: "
        super().__init__(where + message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValidationError, (self.resource, self.field, self.message))


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlong = 40


def describe_value(value: Any) -> str:
    """A short repr, bounded in depth and length whatever `value` is."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int beyond Python's 4,300-digit str() limit
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(
        type(value), type(value).__name__)


class Fields:
    """A mapping being parsed: `resource` names the document, `path` this mapping's place."""

    def __init__(self, data: Any, resource: str, path: str = "", *,
                 allowed: set[str] | frozenset[str] | None = None) -> None:
        self.resource = resource
        self.path = path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail("", f"expected a mapping, got {_type_name(data)}")
        # Keys are only looked up by (string) name; `only()` and `field_names()` reject others.
        self.data: dict[str, Any] = data
        if allowed is not None:
            self.only(allowed)

    # --- structure -----------------------------------------------------------------------

    def at(self, key: str) -> str:
        if not key:
            return self.path
        if key.startswith("["):
            return f"{self.path}{key}"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> NoReturn:
        raise ValidationError(self.resource, self.at(key), message)

    def only(self, allowed: set[str] | frozenset[str]) -> None:
        """Reject fields not in `allowed` (the first one, alphabetically, is named)."""
        if not allowed.issuperset(self.data):  # (KeysView <= set is pure Python: slow)
            unknown = self.data.keys() - allowed
            for key in unknown:
                if not isinstance(key, str):
                    self.fail("", f"field name {describe_value(key)} is not a string")
            self.fail(sorted(unknown)[0], "unknown field")

    def field_names(self) -> list[str]:
        """The mapping's field names (all checked to be strings)."""
        for key in self.data:
            if not isinstance(key, str):
                self.fail("", f"field name {describe_value(key)} is not a string")
        return list(self.data)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.data.get(key)

    def sub(self, key: str, *, allowed: set[str] | frozenset[str] | None = None) -> Fields:
        return Fields(self.data.get(key), self.resource, self.at(key), allowed=allowed)

    def list(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {_type_name(value)}")
        if len(value) > LIMITS.max_set_members:
            self.fail(key, too_many_members(LIMITS, len(value)))
        return value

    def items(self, key: str, *, allowed: set[str] | frozenset[str] | None = None
              ) -> Iterator[Fields]:
        for i, item in enumerate(self.list(key)):
            yield Fields(item, self.resource, f"{self.at(key)}[{i}]", allowed=allowed)

    # --- scalars -------------------------------------------------------------------------

    def str(self, key: str, default: str = "", *, required: bool = False) -> str:
        value = self.data.get(key)
        if value is None:
            if required:
                self.fail(key, "required field is missing")
            return default
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_type_name(value)} {describe_value(value)}")
        if required and not value:
            self.fail(key, "must not be empty")
        return value

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {describe_value(value)}")
        return value

    def int(self, key: str, default: int | None = None, *, lo: int | None = None,
            hi: int | None = None) -> int | None:
        return checked_int(self.data.get(key), self, key, default, lo=lo, hi=hi)

    def float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"expected a number, got {describe_value(value)}")
        try:
            number = float(value)
        except OverflowError:
            self.fail(key, "number is too large")
        if not math.isfinite(number):
            self.fail(key, f"expected a finite number, got {value!r}")
        return number

    def one_of(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.str(key, default)
        if value not in choices:
            self.fail(key, f"{describe_value(value)} is not one of {', '.join(choices)}")
        return value

    # --- collections of scalars -------------------------------------------------------------

    def str_list(self, key: str) -> tuple[str, ...]:
        items = self.list(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", f"expected a string, got {describe_value(item)}")
        return tuple(items)

    def str_map(self, key: str) -> dict[str, str]:
        """A mapping of strings to strings (numbers are accepted as values and stringified)."""
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"expected a mapping of strings, got {_type_name(value)}")
        if len(value) > LIMITS.max_set_members:
            self.fail(key, too_many_members(LIMITS, len(value)))
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                self.fail(key, f"key {describe_value(k)} is not a string")
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                self.fail(f"{key}.{k}", f"expected a string value, got {describe_value(v)}")
            out[k] = v if isinstance(v, str) else str(v)
        return out

    def labels(self, key: str) -> dict[str, str]:
        """A label mapping, keys and values checked as Kubernetes (and Calico) check them.
        Keys are interned (sys.intern): the same few repeat across thousands of resources.
        (Values are not: many are unique, and an endpoint's label pairs are shared by
        `conversion.k8s.shared_label_pairs`.)"""
        labels = {sys.intern(k): v for k, v in self.str_map(key).items()}
        for k, v in labels.items():
            problem = qualified_name_problem(k)
            if problem:
                self.fail(f"{key}.{k}", f"invalid label key: {problem}")
            problem = label_value_problem(v)
            if problem:
                self.fail(f"{key}.{k}", f"invalid label value {describe_value(v)}: {problem}")
        return labels


def checked_int(value: Any, fields: Fields, key: str, default: int | None = None, *,
                lo: int | None = None, hi: int | None = None) -> int | None:
    """`value` as an int within [lo, hi]; decimal strings are accepted (YAML quoting)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        fields.fail(key, f"expected an integer, got {describe_value(value)}")
    if isinstance(value, str):
        text = value.strip()
        if not is_decimal(text) or len(text) > _MAX_DIGITS:
            fields.fail(key, f"expected an integer, got {describe_value(value)}")
        value = int(text)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{'' if lo is None else lo}, {'' if hi is None else hi}]"
        shown = value if abs(value) < 10**_MAX_DIGITS else "number"
        fields.fail(key, f"{shown} is out of range {bounds}")
    return value

"""The structural check of a decoded document: depth, size, members, and marked problems.

Role: the last step of every decode (`yaml_docs`, `json_docs`) and the check a transport
that decodes a batch (a Kubernetes list page, a watch event) runs on each object of it.

Decoders do not stop at a problem inside one document (that would take the documents
around it down too): they put an `InputProblem` where the problem is (a duplicate key's
value, an over-long integer, a subtree too deep to decode) and `check_document` rejects the
document that holds it, with the field path.

Invariants: `check_document` walks iteratively (no recursion, whatever the depth), touches
each value once, and raises only `InputError`. Sizes are estimated from the decoded values
as a lower bound of their compact JSON encoding, so a document that was within
max_document_bytes as text is never rejected by the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyfelix.agent.inputs.limits import (
    LIMITS,
    InputError,
    InputLimits,
    too_big,
    too_deep,
    too_many_members,
)


class InputProblem:
    """A marker a decoder leaves in place of a value it could not accept."""

    __slots__ = ("limit", "message")

    def __init__(self, message: str, limit: str | None = None) -> None:
        self.message = message
        self.limit = limit

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, InputProblem) and other.message == self.message
                and other.limit == self.limit)

    def __hash__(self) -> int:
        return hash((self.message, self.limit))

    def __repr__(self) -> str:
        return f"InputProblem({self.message!r})"


@dataclass(frozen=True)
class Document:
    """One document of a text: `value` (None when rejected or empty) or `error`."""

    index: int  # 1-based position in the text
    line: int | None  # 1-based line where it starts
    value: Any = None
    error: InputError | None = None
    item_lines: tuple[int, ...] | None = None  # YAML: start line of each `items:` entry


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    value = value[:limit]
    return value if value.isprintable() else repr(value)[1:-1]


def describe(doc: Any, *, kind: str | None = None) -> str:
    """`Kind(namespace/name)` of a raw document as far as it can be read, `?` for the rest;
    never raises, whatever `doc` is. `kind` overrides the document's own (list items)."""
    if not isinstance(doc, dict):
        return f"{kind or 'document'}(?)"
    kind_text = kind or _text(doc.get("kind"), 60) or "?"
    meta = doc.get("metadata")
    name = namespace = None
    if isinstance(meta, dict):
        name = _text(meta.get("name"), 120)
        namespace = _text(meta.get("namespace"), 63)
    where = f"{namespace}/" if namespace else ""
    return f"{kind_text}({where}{name or '?'})"


# A link of the path to a value: (parent link, key or index); None is the document itself.
_Link = tuple[Any, Any] | None


def field_path(link: _Link) -> str:
    """The dotted path (`spec.ingress[0].action`) a link chain names."""
    parts: list[str] = []
    while link is not None:
        link, step = link
        if isinstance(step, int) and not isinstance(step, bool):
            parts.append(f"[{step}]")
        else:
            text = str(step) if isinstance(step, str) else repr(step)
            parts.append("." + (text if len(text) <= 80 else text[:77] + "..."))
    path = "".join(reversed(parts)).lstrip(".")
    return path if len(path) <= 160 else f"{path[:100]}...{path[-50:]}"


def check_document(doc: Any, limits: InputLimits = LIMITS, *, resource: str | None = None,
                   kind: str | None = None) -> None:
    """Raise InputError if `doc` breaks a limit or holds an `InputProblem` (module docstring).

    `resource` names the document in the error (default: `describe(doc, kind=kind)`).
    """
    max_depth = limits.max_nesting_depth
    max_members = limits.max_set_members
    max_bytes = limits.max_document_bytes
    size = 0
    stack: list[tuple[Any, int, _Link]] = [(doc, 1, None)]
    pop = stack.pop
    push = stack.append

    def fail(link: _Link, message: str, limit: str | None) -> InputError:
        return InputError(resource or describe(doc, kind=kind), field_path(link), message,
                          limit)

    while stack:
        value, depth, link = pop()
        kind_of = type(value)
        if kind_of is str:
            size += len(value) + 2
            continue
        if kind_of is dict or kind_of is list or isinstance(value, dict | list | tuple | set
                                                           | frozenset):
            if depth > max_depth:
                raise fail(link, too_deep(limits), "max_nesting_depth")
            count = len(value)
            if count > max_members:
                raise fail(link, too_many_members(limits, count), "max_set_members")
            size += 2 + count
            if size > max_bytes:
                raise fail(None, too_big(limits, size) + " (at least)", "max_document_bytes")
            child_depth = depth + 1
            # pushed last to first, so problems are found in document order
            if isinstance(value, dict):
                for key, child in reversed(value.items()):
                    size += len(key) + 3 if type(key) is str else 2
                    push((child, child_depth, (link, key)))
            elif isinstance(value, list | tuple):
                for index in range(count - 1, -1, -1):
                    push((value[index], child_depth, (link, index)))
            else:
                for index, child in enumerate(value):
                    push((child, child_depth, (link, index)))
            continue
        if kind_of is InputProblem:
            raise fail(link, value.message, value.limit)
        size += 1  # numbers, booleans, null, dates, bytes: at least one character
    if size > max_bytes:
        raise fail(None, too_big(limits, size) + " (at least)", "max_document_bytes")

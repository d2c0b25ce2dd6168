"""YAML text -> documents, with the input limits, one document at a time.

Role: the only YAML loader for datastore input (the file datastore, `pyfelix apply`, the
file datastore client's own re-reads). `decode_yaml_documents(text)` yields one `Document`
per YAML document: its value, or the `InputError` that rejected it.

What is rejected, per document (the others in the text are read as usual):
- more than max_document_bytes of text: not parsed at all (the text is cut into documents
  at `---` lines first; YAML forbids such a line inside any scalar);
- aliases: more than max_yaml_aliases, an alias inside its own anchor (a recursive
  document), or a document that would exceed max_document_bytes or max_nesting_depth once
  its aliases are expanded (the "billion laughs" shape, also through `<<` merges). Checked
  on the composed node graph BEFORE anything is constructed;
- a key twice in one mapping (keys given by a `<<` merge may be overridden, as YAML says);
- an integer of more than max_integer_digits digits, an impossible date;
- anything else the constructor refuses (an unknown tag, an unhashable key);
- then `structure.check_document` (depth, members, size, the problems above).
A syntax error ends the text: `InputSyntaxError` is raised once the documents before it
have been yielded (what the caller does with those is its business: the file datastore
keeps the file's last good contents). libyaml itself refuses more than 1,000 nested levels
as a syntax error.

Easy to get wrong: PyYAML's constructor caches objects per node, so an alias bomb costs
nothing until something walks the result - which every consumer does - and merges copy
pairs eagerly; that is why the node graph is measured first. A constructor error leaves
the loader's per-document state behind, which must be reset before the next document.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from pyfelix.agent.inputs.limits import (
    DUPLICATE_KEY,
    LIMITS,
    InputError,
    InputLimits,
    InputSyntaxError,
    too_big,
    too_deep,
    too_many_digits,
)
from pyfelix.agent.inputs.structure import Document, InputProblem, check_document, field_path

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"

# A document-start marker line; YAML forbids such a line inside any scalar (c-forbidden).
_DOCUMENT_START = re.compile(r"^---(?=[ \t\r\n]|\Z)", re.MULTILINE)
# A piece of text without a document of its own: blank lines, comments, directives.
_NO_CONTENT = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\r?\n|%[^\n]*\n)*(?:[ \t]*(?:#[^\n]*)?|%[^\n]*)")


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """The safe loader, with duplicate keys and bad scalars turned into InputProblems."""

    limits: InputLimits = LIMITS

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        duplicates: list[Any] = []
        if isinstance(node, MappingNode) and not _distinct_string_keys(node):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        duplicates.append(key)
                    seen.add(key)
                except TypeError:
                    continue  # unhashable: the constructor below refuses it
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        for key in duplicates:
            mapping[key] = InputProblem(DUPLICATE_KEY)
        return mapping

    def construct_yaml_int(self, node: ScalarNode) -> Any:
        text = str(node.value)
        if sum(c.isdigit() for c in text[: self.limits.max_integer_digits * 2 + 8]
               ) > self.limits.max_integer_digits:
            return InputProblem(too_many_digits(self.limits), "max_integer_digits")
        try:
            return super().construct_yaml_int(node)
        except (ValueError, OverflowError, IndexError):  # IndexError: `!!int ""`
            return InputProblem(f"{text[:40]!r} is not a usable integer")

    def construct_yaml_timestamp(self, node: ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError):
            return InputProblem(f"{str(node.value)[:40]!r} is not a valid timestamp")


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def _distinct_string_keys(node: MappingNode) -> bool:
    """The fast answer for the usual mapping: every key a plain string, no two alike.
    (Other keys are compared as constructed values: `1` and `0x1` are one key.)"""
    texts = [k.value for k, _ in node.value if k.tag == _STR_TAG]
    return len(texts) == len(node.value) and len(set(texts)) == len(texts)


def _reset(loader: Any) -> None:
    """Forget a failed document's construction state (BaseConstructor has no finally)."""
    loader.constructed_objects = {}
    loader.recursive_objects = {}
    loader.state_generators = []
    loader.deep_construct = False


# --- identity and the node-graph check -------------------------------------------------------


def _scalar(node: Node | None) -> str | None:
    if isinstance(node, ScalarNode) and isinstance(node.value, str) and node.value:
        return node.value
    return None


def _child(node: Node, key: str) -> Node | None:
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if _scalar(key_node) == key:
                return value_node
    return None


def node_identity(node: Node) -> str:
    """`Kind(namespace/name)` from a composed (not constructed) document."""
    kind = (_scalar(_child(node, "kind")) or "?")[:60]
    meta = _child(node, "metadata")
    name = _scalar(_child(meta, "name")) if meta is not None else None
    namespace = _scalar(_child(meta, "namespace")) if meta is not None else None
    where = f"{namespace[:63]}/" if namespace else ""
    return f"{kind}({where}{(name or '?')[:120]})"


def _children(node: Node) -> list[tuple[Any, Node]]:
    if isinstance(node, MappingNode):
        out: list[tuple[Any, Node]] = []
        for key_node, value_node in node.value:
            out.append(("<key>", key_node))
            out.append((_scalar(key_node) or "<key>", value_node))
        return out
    if isinstance(node, SequenceNode):
        return list(enumerate(node.value))
    return []


def check_aliases(root: Node, limits: InputLimits = LIMITS) -> tuple[str, str, str] | None:
    """(field, message, limit) if the node graph's aliases are unacceptable, else None.

    A node reached a second time is an alias use. Sizes and depths are those of the
    document with every alias expanded, computed once per node (iteratively).
    """
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, expanded depth)
    active: set[int] = set()
    aliases = 0
    stack: list[tuple[Node, bool, Any]] = [(root, False, None)]
    while stack:
        node, leaving, link = stack.pop()
        ident = id(node)
        if not leaving:
            if ident in done:
                aliases += 1
                if aliases > limits.max_yaml_aliases:
                    return (field_path(link), f"more than max_yaml_aliases "
                            f"({limits.max_yaml_aliases}) aliases", "max_yaml_aliases")
                continue
            if ident in active:
                return (field_path(link), "an alias refers to a node that contains it "
                        "(recursive documents are rejected)", "max_yaml_aliases")
            active.add(ident)
            stack.append((node, True, link))
            for step, child in reversed(_children(node)):
                stack.append((child, False, (link, step)))
            continue
        active.discard(ident)
        if isinstance(node, ScalarNode):
            done[ident] = (len(node.value) + 2, 0)
            continue
        measured = [done[id(child)] for _, child in _children(node)]
        size = 2 + sum(m[0] + 1 for m in measured)
        depth = 1 + max((m[1] for m in measured), default=0)
        if depth > limits.max_nesting_depth:
            return (field_path(link), too_deep(limits) + " (aliases expanded)",
                    "max_nesting_depth")
        if size > limits.max_document_bytes:
            return (field_path(link), too_big(limits, size) + " (aliases expanded, at least)",
                    "max_document_bytes")
        done[ident] = (size, depth)
    return None


# --- cutting the text into documents ---------------------------------------------------------


def _byte_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _sniff_identity(text: str) -> str:
    """`Kind(name)` read off the first lines of a document that will not be parsed."""
    head = text[:8192]
    kind = re.search(r"^kind:[ \t]*['\"]?([A-Za-z0-9]{1,60})", head, re.MULTILINE)
    name = re.search(r"^[ \t]+name:[ \t]*['\"]?([a-z0-9.-]{1,120})", head, re.MULTILINE)
    return f"{kind.group(1) if kind else '?'}({name.group(1) if name else '?'})"


def _marker_lines(head: str) -> int:
    """Lines before a piece's content: its `---` line when nothing follows the marker (as
    for parsed documents, whose line is where their content starts)."""
    return 1 if re.match(r"---[ \t]*(?:#[^\n]*)?\r?\n", head) else 0


def _pieces(text: str, limits: InputLimits) -> list[tuple[int, int, int | None]]:
    """(start, end, oversized size or None) runs of `text`: consecutive small documents
    form one run (usually the whole text is one); each oversized document is its own."""
    starts = [m.start() for m in _DOCUMENT_START.finditer(text)]
    if len(text) <= limits.max_document_bytes and (
            len(text) * 4 <= limits.max_document_bytes or _byte_size(text)
            <= limits.max_document_bytes):
        return [(0, len(text), None)]
    bounds = [0, *(s for s in starts if s > 0), len(text)]
    chunks = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    # Directives and comments before a `---` travel with the document they precede.
    merged: list[tuple[int, int]] = []
    carry: int | None = None
    for start, end in chunks:
        if carry is not None:
            start, carry = carry, None
        if _NO_CONTENT.fullmatch(text, start, end) and end != len(text):
            carry = start
            continue
        merged.append((start, end))
    if carry is not None:
        merged.append((carry, len(text)))
    runs: list[tuple[int, int, int | None]] = []
    for start, end in merged:
        size = _byte_size(text[start:end]) if end - start > limits.max_document_bytes // 4 else 0
        if size > limits.max_document_bytes:
            runs.append((start, end, size))
        elif runs and runs[-1][2] is None:
            runs[-1] = (runs[-1][0], end, None)
        else:
            runs.append((start, end, None))
    return runs


# --- the decoder -----------------------------------------------------------------------------


def _item_lines(node: Node, offset: int) -> tuple[int, ...] | None:
    items = _child(node, "items")
    if isinstance(items, SequenceNode):
        return tuple(child.start_mark.line + 1 + offset for child in items.value)
    return None


def _syntax_error(exc: yaml.YAMLError, index: int, offset: int) -> InputSyntaxError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        context = f"{context} started at line {context_mark.line + 1 + offset}"
    detail = f"{context}: {problem}" if context else str(problem)
    if mark is None:
        return InputSyntaxError(index, None, None, detail)
    return InputSyntaxError(index, mark.line + 1 + offset, mark.column + 1, detail)


def _constructor_message(exc: Exception) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = [p for p in (exc.context, exc.problem) if p]
        return ": ".join(str(p) for p in parts) or str(exc)
    return str(exc) or type(exc).__name__


def decode_yaml_documents(text: str, limits: InputLimits = LIMITS) -> Iterator[Document]:
    """Every document of a YAML text, in order (module docstring); raises InputSyntaxError
    at a syntax error, after yielding the documents before it."""
    count = [0]  # documents numbered so far
    for start, end, oversized in _pieces(text, limits):
        offset = text.count("\n", 0, start)
        if oversized is not None:
            count[0] += 1
            head = text[start:start + 8192]
            error = InputError(_sniff_identity(head), "", too_big(limits, oversized),
                               "max_document_bytes")
            yield Document(count[0], offset + 1 + _marker_lines(head), error=error)
            continue
        piece = text if (start, end) == (0, len(text)) else text[start:end]
        yield from _decode_piece(piece, count, offset, limits)


def _decode_piece(piece: str, count: list[int], offset: int, limits: InputLimits
                  ) -> Iterator[Document]:
    loader = _Loader(piece)
    loader.limits = limits
    may_alias = "*" in piece
    try:
        while True:
            index = count[0] + 1
            try:
                if not loader.check_node():
                    return
                node = loader.get_node()
            except yaml.YAMLError as exc:
                raise _syntax_error(exc, index, offset) from None
            except RecursionError:  # the pure-Python composer, without libyaml's own cap
                raise InputSyntaxError(index, None, None, too_deep(limits)) from None
            count[0] = index
            line = node.start_mark.line + 1 + offset
            if may_alias:
                problem = check_aliases(node, limits)
                if problem is not None:
                    field, message, limit = problem
                    yield Document(index, line,
                                   error=InputError(node_identity(node), field, message, limit))
                    continue
            try:
                value = loader.construct_document(node)
            except Exception as exc:  # PyYAML's constructors over hostile input: any error
                # (ConstructorError, ValueError, IndexError...) rejects this document only
                _reset(loader)
                yield Document(index, line, error=InputError(
                    node_identity(node), "", f"cannot be constructed: "
                    f"{_constructor_message(exc)}"))
                continue
            try:
                check_document(value, limits)
            except InputError as exc:
                yield Document(index, line, error=exc)
                continue
            yield Document(index, line, value=value, item_lines=_item_lines(node, offset))
    finally:
        loader.dispose()


__all__ = ["ConstructorError", "Document", "check_aliases", "decode_yaml_documents",
           "node_identity"]

"""JSON text -> documents, with the input limits, never a RecursionError.

Role: the only JSON decoder for datastore input: files of the file datastore (one or more
concatenated values: `decode_json_documents`), one stored document (an etcd value, later a
Typha message's payload: `decode_json_document`), and transports that carry many documents
in one value (a Kubernetes list page or watch event: `decode_json`, then
`structure.check_document` on each object).

How problems stay inside their document: the decoder does not stop at a duplicate key or an
over-long integer; it leaves an `InputProblem` in its place, which `check_document` turns
into the rejection of the document holding it. Python's decoder recurses once per level
and fails with RecursionError somewhere near 1,000 levels, which would take the whole text
down: when that happens, every subtree deeper than the limit (plus `wrapper_depth`, the
levels a transport adds around its documents) is cut out of the text and replaced by a
marker object that decodes to an InputProblem, and the text is decoded again. The marker's
key carries a random token, so input cannot forge one. Lines are kept (the cut text's line
breaks are put back), so later error positions still point at the right line.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

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
from pyfelix.agent.inputs.structure import Document, InputProblem, check_document, describe

_DEEP_KEY = f"\x00pyfelix-cut-{secrets.token_hex(12)}"
_DEEP_MARKER = json.dumps({_DEEP_KEY: 0})
# A JSON string (with escapes) or a bracket; anything else cannot change the depth.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class _Decoder:
    """A json.JSONDecoder whose hooks leave InputProblems instead of failing."""

    def __init__(self, limits: InputLimits) -> None:
        self.limits = limits
        self._json = json.JSONDecoder(object_pairs_hook=self._object, parse_int=self._int)

    def _object(self, pairs: list[tuple[str, Any]]) -> Any:
        mapping = dict(pairs)
        if len(mapping) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    mapping[key] = InputProblem(DUPLICATE_KEY)
                seen.add(key)
        if len(pairs) == 1 and pairs[0][0] == _DEEP_KEY:
            return InputProblem(too_deep(self.limits), "max_nesting_depth")
        return mapping

    def _int(self, text: str) -> Any:
        if len(text) > self.limits.max_integer_digits + 1:  # + a minus sign
            return InputProblem(too_many_digits(self.limits), "max_integer_digits")
        return int(text)

    def value_at(self, text: str, position: int, wrapper_depth: int) -> tuple[Any, int, str]:
        """(value, end, text) of the JSON value at `position`; `text` is returned because
        a value too deep to decode is decoded from a copy with its deep subtrees cut."""
        try:
            value, end = self._json.raw_decode(text, position)
            return value, end, text
        except RecursionError:
            pass
        cut = _cut_deep(text, position, self.limits.max_nesting_depth + wrapper_depth)
        try:
            value, end = self._json.raw_decode(cut, position)
        except RecursionError:
            raise json.JSONDecodeError(too_deep(self.limits), cut, position) from None
        return value, end, cut


def _cut_deep(text: str, position: int, keep: int) -> str:
    """`text` with every container of the value at `position` that lies deeper than `keep`
    levels replaced by the marker object (line breaks kept)."""
    out: list[str] = [text[:position]]
    depth = 0
    last = position
    cut_from: int | None = None
    for match in _TOKEN.finditer(text, position):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth == keep + 1 and cut_from is None:
                cut_from = match.start()
        elif token in "]}":
            depth -= 1
            if depth == keep and cut_from is not None:
                out.append(text[last:cut_from])
                out.append(_DEEP_MARKER + "\n" * text.count("\n", cut_from, match.end()))
                last, cut_from = match.end(), None
            if depth <= 0:
                break
        elif depth == 0:
            break  # the value was a string
    if cut_from is not None:  # unbalanced to the end of the text: cut it all
        out.append(text[last:cut_from])
        out.append(_DEEP_MARKER + "\n" * text.count("\n", cut_from))
        return "".join(out)
    out.append(text[last:])
    return "".join(out)


def decode_json(data: bytes | str, limits: InputLimits = LIMITS, *,
                wrapper_depth: int = 0) -> Any:
    """One JSON value (a whole text) as a transport carries it; problems inside it are left
    as InputProblems for `check_document` to find per document. Raises ValueError
    (`json.JSONDecodeError`, `UnicodeDecodeError`) when the text is not one JSON value."""
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    decoder = _Decoder(limits)
    start = len(text) - len(text.lstrip())
    value, end, text = decoder.value_at(text, start, wrapper_depth)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end + len(text[end:]) - len(
            text[end:].lstrip()))
    return value


def decode_json_document(data: bytes | str, limits: InputLimits = LIMITS, *,
                         resource: str | None = None) -> dict[str, Any]:
    """One stored document (an etcd value; a Typha payload): a JSON object within every
    limit. Raises InputError (a ValueError) naming `resource` (default: as far as the
    document names itself) and the field; the raw size is checked before decoding."""
    size = len(data) if isinstance(data, bytes | bytearray) else len(data.encode("utf-8",
                                                                                "replace"))
    label = resource or "document(?)"
    if size > limits.max_document_bytes:
        raise InputError(label, "", too_big(limits, size), "max_document_bytes")
    try:
        doc = decode_json(data, limits)
    except UnicodeDecodeError as exc:
        raise InputError(label, "", f"not UTF-8 JSON (byte {exc.start} is not UTF-8)"
                         ) from None
    except json.JSONDecodeError as exc:
        raise InputError(label, "", f"not UTF-8 JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError(label, "", f"a JSON {type(doc).__name__}, not an object")
    check_document(doc, limits, resource=resource)
    return doc


def decode_json_documents(text: str, limits: InputLimits = LIMITS) -> Iterator[Document]:
    """Every value of a text of concatenated JSON values (a file), as `Document`s; raises
    InputSyntaxError at a syntax error, after yielding the values before it."""
    decoder = _Decoder(limits)
    position = 0
    index = 0
    line, counted = 1, 0  # the line at offset `counted`, advanced as documents are read
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return
        index += 1
        line += text.count("\n", counted, position)
        counted = position
        try:
            value, end, text = decoder.value_at(text, position, 0)
        except json.JSONDecodeError as exc:
            raise InputSyntaxError(index, exc.lineno, exc.colno, exc.msg) from None
        size = end - position
        if size * 4 > limits.max_document_bytes and not text.isascii():
            size = len(text[position:end].encode("utf-8", "replace"))
        position = end
        if size > limits.max_document_bytes:
            error = InputError(describe(value), "", too_big(limits, size),
                               "max_document_bytes")
            yield Document(index, line, error=error)
            continue
        try:
            check_document(value, limits)
        except InputError as exc:
            yield Document(index, line, error=exc)
            continue
        yield Document(index, line, value=value)


__all__ = ["decode_json", "decode_json_document", "decode_json_documents"]

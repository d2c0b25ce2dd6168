"""`SelectorError`: what `agent.selector.parse` raises for text that is not a valid selector.

Role: one exception type (a `ValueError`, so resource validation can catch it with the
other value errors) that carries enough to point at the mistake: the selector text, the
0-based offset of the offending character or token, what the parser expected there and
what it found. `str(err)` reads e.g.::

    at column 6: expected a quoted string after '==', found 'x' (selector: "a == x")

`caret_lines()` renders the text with a `^` under the position, for the CLI.
Columns are 1-based (human counting); `position` is the 0-based offset into `text`.
"""

from __future__ import annotations

_MAX_TEXT_IN_MESSAGE = 200


class SelectorError(ValueError):
    """An invalid selector: `text`, `position` (0-based), `expected` and `found` describe it."""

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        self.found = found
        shown = text if len(text) <= _MAX_TEXT_IN_MESSAGE else text[:_MAX_TEXT_IN_MESSAGE] + "..."
        super().__init__(
            f"at column {self.column}: expected {expected}, found {found} (selector: {shown!r})"
        )

    @property
    def column(self) -> int:
        """1-based column of the error (one past the end for 'end of selector')."""
        return self.position + 1

    def caret_lines(self, indent: str = "  ") -> str:
        """The selector on one line and a caret under the error position beneath it."""
        flat = "".join(" " if ch in "\t\r\n\v\f" else ch for ch in self.text)
        return f"{indent}{flat}\n{indent}{' ' * self.position}^"

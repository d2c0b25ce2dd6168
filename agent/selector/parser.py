"""Selector text -> syntax tree (`agent.selector.nodes`), with errors that name the position.

Role: tokenise and parse Calico's selector language. Input: a `str`. Output: a `Node`
(not yet normalised: `canonical.normalise` does that). Errors: `SelectorError`.

Grammar (precedence `!` > `&&` > `||`; a comparison binds tighter than `!`, so `!a == "x"`
means `!(a == "x")`)::

    selector   := <empty> | or_expr
    or_expr    := and_expr ( "||" and_expr )*
    and_expr   := unary ( "&&" unary )*
    unary      := "!" unary | "(" or_expr ")" | function | KEY operator
    function   := "has" "(" KEY ")" | "all" "(" ")" | "global" "(" ")"
    operator   := "==" STRING | "!=" STRING | "contains" STRING
                | "starts" "with" STRING | "ends" "with" STRING
                | "in" set | "not" "in" set
    set        := "{" [ STRING ( "," STRING )* ] "}"

Lexical rules: KEY is `[A-Za-z0-9_./-]+` (so `projectcalico.org/namespace`, `app.kubernetes.io
/name`, `x-y_z` are keys). STRING is `'...'` or `"..."` with no escapes (as in Calico): a
value may contain the other quote character but not its own. Whitespace is free between
tokens. Words are keywords only where the grammar expects one, so a label may be called
`in`, `has` or `all` (`has` is a function only when followed by `(`).

Easy to get wrong: a lone `&`, `|` or `=` is an error naming the intended `&&`, `||`, `==`;
nesting is capped at MAX_NESTING levels of `(`/`!` so hostile input cannot exhaust the
stack or the Python compiler used by `compiler`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from pyfelix.agent.selector.errors import SelectorError
from pyfelix.agent.selector.nodes import All, And, Compare, Global, Has, InSet, Node, Not, Op, Or

#: Maximum depth of nested parentheses and negations.
MAX_NESTING = 64

_WORD, _STRING, _PUNCT, _EOF = "word", "string", "punct", "eof"

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<word>[A-Za-z0-9_./-]+)
  | (?P<string>"[^"]*"|'[^']*')
  | (?P<punct>==|!=|&&|\|\||[!(){},])
    """,
    re.VERBOSE,
)

_LONE_CHAR_HINTS = {"&": "'&&'", "|": "'||'", "=": "'=='"}

_OPERATOR_EXPECTED = "an operator (==, !=, in, not in, contains, starts with, ends with)"
_TERM_EXPECTED = "a label key, '!', '(', has(), all() or global()"


class Token(NamedTuple):
    """One lexical token: `kind` is word/string/punct/eof; `text` is the raw spelling
    (strings include their quotes); `pos` is the 0-based offset in the selector."""

    kind: str
    text: str
    pos: int

    def describe(self) -> str:
        if self.kind == _EOF:
            return "end of selector"
        if self.kind == _STRING:
            return f"string {self.text}"
        return repr(self.text)


def tokenize(text: str) -> list[Token]:
    """Split `text` into tokens ending with an EOF token; raise SelectorError on a bad char."""
    tokens: list[Token] = []
    pos, end = 0, len(text)
    match_at = _TOKEN_RE.match
    while pos < end:
        m = match_at(text, pos)
        if m is None:
            raise _bad_character(text, pos)
        kind = m.lastgroup
        if kind != "ws":
            tokens.append(Token(str(kind), m.group(), pos))
        pos = m.end()
    tokens.append(Token(_EOF, "", end))
    return tokens


def _bad_character(text: str, pos: int) -> SelectorError:
    char = text[pos]
    if char in "'\"":
        return SelectorError(
            text, pos, f"a closing {char} for the string that starts here", "end of selector"
        )
    hint = _LONE_CHAR_HINTS.get(char)
    if hint is not None and text[pos : pos + 2] != char * 2:
        return SelectorError(text, pos, hint, repr(char))
    return SelectorError(
        text, pos, "a label key, a quoted string, an operator or a parenthesis", repr(char)
    )


def parse_tree(text: str) -> Node:
    """Parse selector `text` into a syntax tree; whitespace-only text means `All()`."""
    return _Parser(text).parse()


class _Parser:
    """Recursive descent over the token list; one instance per parse."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._tokens = tokenize(text)
        self._index = 0

    # --- token helpers -------------------------------------------------------------------

    def _peek(self, ahead: int = 0) -> Token:
        return self._tokens[min(self._index + ahead, len(self._tokens) - 1)]

    def _advance(self) -> Token:
        tok = self._tokens[self._index]
        if tok.kind != _EOF:
            self._index += 1
        return tok

    def _fail(self, tok: Token, expected: str) -> SelectorError:
        return SelectorError(self._text, tok.pos, expected, tok.describe())

    def _expect_punct(self, punct: str, expected: str) -> Token:
        tok = self._advance()
        if tok.kind != _PUNCT or tok.text != punct:
            raise self._fail(tok, expected)
        return tok

    def _expect_string(self, after: str) -> str:
        tok = self._advance()
        if tok.kind != _STRING:
            raise self._fail(tok, f"a quoted string after {after}")
        return tok.text[1:-1]

    def _is_punct(self, tok: Token, punct: str) -> bool:
        return tok.kind == _PUNCT and tok.text == punct

    def _is_word(self, tok: Token, word: str) -> bool:
        return tok.kind == _WORD and tok.text == word

    # --- grammar -------------------------------------------------------------------------

    def parse(self) -> Node:
        if self._peek().kind == _EOF:
            return All()
        node = self._or_expr(0)
        tok = self._peek()
        if tok.kind != _EOF:
            if self._is_punct(tok, ")"):
                raise self._fail(tok, "'&&', '||' or end of selector (this ')' has no '(')")
            raise self._fail(tok, "'&&', '||' or end of selector")
        return node

    def _or_expr(self, depth: int) -> Node:
        operands = [self._and_expr(depth)]
        while self._is_punct(self._peek(), "||"):
            self._advance()
            operands.append(self._and_expr(depth))
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def _and_expr(self, depth: int) -> Node:
        operands = [self._unary(depth)]
        while self._is_punct(self._peek(), "&&"):
            self._advance()
            operands.append(self._unary(depth))
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def _unary(self, depth: int) -> Node:
        tok = self._peek()
        nests = self._is_punct(tok, "!") or self._is_punct(tok, "(")
        if nests and depth >= MAX_NESTING:
            raise self._fail(tok, f"at most {MAX_NESTING} nested '(' or '!'")
        if self._is_punct(tok, "!"):
            self._advance()
            return Not(self._unary(depth + 1))
        if self._is_punct(tok, "("):
            return self._parenthesised(depth)
        if tok.kind == _WORD:
            if self._is_punct(self._peek(1), "("):
                function = self._function(tok)
                if function is not None:
                    return function
            self._advance()
            return self._operator(tok.text)
        raise self._fail(tok, _TERM_EXPECTED)

    def _parenthesised(self, depth: int) -> Node:
        opening = self._advance()
        inner = self._or_expr(depth + 1)
        tok = self._peek()
        if not self._is_punct(tok, ")"):
            column = opening.pos + 1
            raise self._fail(tok, f"')' to close the '(' at column {column}, '&&' or '||'")
        self._advance()
        return inner

    def _function(self, name: Token) -> Node | None:
        """has(k), all(), global(); None when `name` is not a function (then it is a key)."""
        if name.text == "has":
            self._advance()
            self._advance()  # '('
            key = self._advance()
            if key.kind != _WORD:
                raise self._fail(key, "a label key inside has()")
            self._expect_punct(")", "')' to close has(")
            return Has(key.text)
        if name.text in ("all", "global"):
            self._advance()
            self._advance()  # '('
            self._expect_punct(")", f"')': {name.text}() takes no arguments")
            return All() if name.text == "all" else Global()
        return None

    def _operator(self, key: str) -> Node:
        tok = self._advance()
        if tok.kind == _PUNCT and tok.text in ("==", "!="):
            op = Op.EQ if tok.text == "==" else Op.NE
            return Compare(key, op, self._expect_string(repr(tok.text)))
        if tok.kind == _WORD:
            word = tok.text
            if word == "in":
                return InSet(key, self._value_set("'in'"), negated=False)
            if word == "not":
                self._expect_word("in", "'in' after 'not'")
                return InSet(key, self._value_set("'not in'"), negated=True)
            if word == "contains":
                return Compare(key, Op.CONTAINS, self._expect_string("'contains'"))
            if word in ("starts", "ends"):
                self._expect_word("with", f"'with' after '{word}'")
                op = Op.STARTS_WITH if word == "starts" else Op.ENDS_WITH
                return Compare(key, op, self._expect_string(f"'{word} with'"))
        raise self._fail(tok, f"{_OPERATOR_EXPECTED} after label key {key!r}")

    def _expect_word(self, word: str, expected: str) -> None:
        tok = self._advance()
        if not self._is_word(tok, word):
            raise self._fail(tok, expected)

    def _value_set(self, after: str) -> frozenset[str]:
        self._expect_punct("{", f"'{{' after {after}")
        values: list[str] = []
        tok = self._advance()
        if self._is_punct(tok, "}"):
            return frozenset()
        while True:
            if tok.kind != _STRING:
                raise self._fail(tok, "a quoted string in the set")
            values.append(tok.text[1:-1])
            tok = self._advance()
            if self._is_punct(tok, "}"):
                return frozenset(values)
            if not self._is_punct(tok, ","):
                raise self._fail(tok, "',' or '}' in the set")
            tok = self._advance()

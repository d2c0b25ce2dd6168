"""Invalid selectors: SelectorError (a ValueError) names the column and what was expected."""

from __future__ import annotations

import pytest

from pyfelix.agent.selector import MAX_NESTING, SelectorError, parse

# text, 0-based position of the error, a fragment of "expected", a fragment of "found"
ERRORS: list[tuple[str, int, str, str]] = [
    # bad tokens
    ("a == 'x' & b == 'y'", 9, "'&&'", "'&'"),
    ("a == 'x' | b == 'y'", 9, "'||'", "'|'"),
    ("a = 'x'", 2, "'=='", "'='"),
    ("a == 'x' # comment", 9, "a label key", "'#'"),
    ("a == x", 5, "quoted string after '=='", "'x'"),
    ("a == 1", 5, "quoted string", "'1'"),
    # unterminated strings: the error points at the opening quote
    ("a == 'x", 5, "closing '", "end of selector"),
    ('a in {"x", "y}', 11, 'closing "', "end of selector"),
    # missing operands / operators
    ("a", 1, "an operator", "end of selector"),
    ("a b", 2, "an operator", "'b'"),
    ("a ==", 4, "quoted string", "end of selector"),
    ("a starts 'x'", 9, "'with' after 'starts'", "string 'x'"),
    ("a ends with", 11, "quoted string after 'ends with'", "end of selector"),
    ("a not 'x'", 6, "'in' after 'not'", "string 'x'"),
    ("a in 'x'", 5, "'{' after 'in'", "string 'x'"),
    ("a in {'x' 'y'}", 10, "',' or '}'", "string 'y'"),
    ("a in {'x',}", 10, "quoted string in the set", "'}'"),
    ("a in {'x'", 9, "',' or '}'", "end of selector"),
    ("&& a == 'x'", 0, "a label key", "'&&'"),
    ("a == 'x' &&", 11, "a label key", "end of selector"),
    ("a == 'x' || || b == 'y'", 12, "a label key", "'||'"),
    ("!", 1, "a label key", "end of selector"),
    ("'x' == a", 0, "a label key", "string 'x'"),
    # functions
    ("has(", 4, "label key inside has()", "end of selector"),
    ("has('a')", 4, "label key inside has()", "string 'a'"),
    ("has(a", 5, "')' to close has(", "end of selector"),
    ("has(a b)", 6, "')' to close has(", "'b'"),
    ("all(x)", 4, "all() takes no arguments", "'x'"),
    ("global(", 7, "global() takes no arguments", "end of selector"),
    # parentheses
    ("(a == 'x'", 9, "')' to close the '(' at column 1", "end of selector"),
    ("(a == 'x' && (b == 'y')", 23, "')' to close the '(' at column 1", "end of selector"),
    ("()", 1, "a label key", "')'"),
    ("a == 'x')", 8, "this ')' has no '('", "')'"),
    # trailing garbage
    ("a == 'x' b == 'y'", 9, "'&&', '||' or end of selector", "'b'"),
    ("has(a) has(b)", 7, "'&&', '||' or end of selector", "'has'"),
    ("all() 'x'", 6, "'&&', '||' or end of selector", "string 'x'"),
]


@pytest.mark.parametrize(("text", "position", "expected", "found"), ERRORS)
def test_error_names_position_and_expectation(
    text: str, position: int, expected: str, found: str
) -> None:
    with pytest.raises(SelectorError) as info:
        parse(text)
    error = info.value
    assert isinstance(error, ValueError)
    assert (error.position, error.column) == (position, position + 1)
    assert expected in error.expected
    assert found in error.found
    message = str(error)
    assert f"column {position + 1}" in message and expected in message and found in message


def test_caret_points_at_the_error() -> None:
    with pytest.raises(SelectorError) as info:
        parse("a == 'x' && b ==\t7")
    lines = info.value.caret_lines(indent="").splitlines()
    assert lines[0] == "a == 'x' && b == 7"  # tab flattened so the caret lines up
    assert lines[1].index("^") == lines[0].index("7")


def test_long_selector_is_shortened_in_the_message() -> None:
    text = "a == 'x' && " * 100 + "b =="
    with pytest.raises(SelectorError) as info:
        parse(text)
    assert info.value.position == len(text)
    assert len(str(info.value)) < 400
    assert info.value.text == text  # the full text stays available


def test_nesting_up_to_the_limit_parses_and_beyond_is_an_error() -> None:
    deepest = "(" * MAX_NESTING + "a == 'x'" + ")" * MAX_NESTING
    assert parse(deepest).evaluate({"a": "x"}) is True
    with pytest.raises(SelectorError, match="nested"):
        parse("(" + deepest + ")")
    negations = "!" * MAX_NESTING + "has(a)"
    assert parse(negations).evaluate({"a": "x"}) is True  # an even number of '!'
    with pytest.raises(SelectorError, match="nested"):
        parse("!" + negations)


def test_deepest_alternating_nesting_still_compiles() -> None:
    # '!(' per level (2 nesting levels), && and || alternating so nothing flattens: the
    # generated Python is about as deep as a valid selector can make it. With the labels
    # below every level's own comparison is true under && and false under ||, so each level
    # just negates: an even number of levels gives back `a == 'x'`.
    levels = MAX_NESTING // 2
    text = "a == 'x'"
    for level in range(levels):
        text = f"!(k{level} == 'v' {'&&' if level % 2 else '||'} {text})"
    labels = {f"k{level}": "v" for level in range(1, levels, 2)}
    assert levels % 2 == 0
    assert parse(text).evaluate({**labels, "a": "x"}) is True
    assert parse(text).evaluate({**labels, "a": "y"}) is False


def test_error_is_not_cached_as_a_result() -> None:
    for _ in range(2):
        with pytest.raises(SelectorError):
            parse("a ==")

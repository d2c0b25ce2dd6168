"""Canonical text, unique ids, required_labels and referenced_keys on worked examples."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from pyfelix.agent.selector import NAMESPACE_LABEL, parse, unique_id_of

# groups of texts that must share one canonical form; the first is that form
EQUIVALENT: list[list[str]] = [
    [
        'a == "x"',
        "a=='x'",
        "  a ==  'x' ",
        "(a == 'x')",
        '((a == "x"))',
        "a in {'x'}",
        "!a != 'x'",
        "!(a != 'x')",
        "!!a == 'x'",
    ],
    ['a != "x"', "!a == 'x'", "a not in {'x'}", "!(a in {'x'})"],
    ['a in {"x", "y"}', "a in {'y', 'x'}", "a in {'x', 'y', 'x'}", "!a not in {'y','x'}"],
    ['a not in {"x", "y"}', "a not in {'y', 'x'}", "!(a in {'x', 'y'})"],
    [
        'a == "x" && b == "y"',
        "b == 'y' && a == 'x'",
        "a == 'x' && (b == 'y' && a == 'x')",
        "all() && b == 'y' && a == 'x'",
        "(a == 'x' && b == 'y') && all()",
    ],
    [
        'a == "x" || b == "y"',
        "b == 'y' || a == 'x'",
        "(a == 'x' || b == 'y') || a == 'x'",
        "a == 'x' || b == 'y' || !all()",
        "a == 'x' || b == 'y' || k in {}",
    ],
    ['a == "x" && (b == "y" || c == "z")', "(c == 'z' || b == 'y') && a == 'x'"],
    [
        'a == "x" && b == "y" || c == "z"',
        "c == 'z' || (b == 'y' && a == 'x')",
        "(a == 'x' && b == 'y') || c == 'z'",
    ],
    ["all()", "", "   ", "all()", "a not in {}", "has(a) || all()", "all() && all()"],
    ["!all()", "a in {}", "has(a) && !all()", "!all() || !all()"],
    ["has(a)", "a contains ''", 'a starts with ""', "a ends with ''", "has( a )", "!!has(a)"],
    ["!has(a)", "!(has(a))", "! has(a)"],
    ["!global()", "!(global())"],
    ['!(a contains "x")', "!a contains 'x'", '!(a contains "x")'],
    ['!(a == "x" && b == "y")', "!(b == 'y' && a == 'x')"],
    ["q == 'say \"hi\"'", "q=='say \"hi\"'", "q in {'say \"hi\"'}"],
    ['q == "it\'s"', 'q=="it\'s"', 'q in {"it\'s"}'],
]


@pytest.mark.parametrize("group", EQUIVALENT, ids=lambda g: g[0])
def test_equivalent_spellings_share_one_canonical_form(group: list[str]) -> None:
    canonical = group[0]
    for text in group:
        assert parse(text).canonical == canonical, text
    assert parse(canonical).canonical == canonical


def test_different_selectors_get_different_forms_and_ids() -> None:
    texts = [
        "a == 'x'",
        "a == 'y'",
        "b == 'x'",
        "a != 'x'",
        "has(a)",
        "a contains 'x'",
        "a starts with 'x'",
        "a ends with 'x'",
        "a in {'x', 'y'}",
        "global()",
        "all()",
    ]
    selectors = [parse(t) for t in texts]
    assert len({s.canonical for s in selectors}) == len(texts)
    assert len({s.unique_id for s in selectors}) == len(texts)


def test_unique_id_is_s_colon_and_28_chars_of_base64url_sha224_of_canonical() -> None:
    selector = parse("role == 'db'")
    digest = hashlib.sha224(b'role == "db"').digest()
    expected = "s:" + base64.urlsafe_b64encode(digest).decode().rstrip("=")[:28]
    assert selector.unique_id == expected == unique_id_of('role == "db"')
    assert re.fullmatch(r"s:[A-Za-z0-9_-]{28}", selector.unique_id)


REQUIRED: list[tuple[str, dict[str, frozenset[str] | None]]] = [
    ("a == 'x' && has(b) && (c == '1' || d == '2')", {"a": frozenset({"x"}), "b": None}),
    ("a in {'x', 'y'}", {"a": frozenset({"x", "y"})}),
    ("a contains 'x' && b starts with 'y' && c ends with 'z'", {"a": None, "b": None, "c": None}),
    ("a == 'x' || a == 'y'", {"a": frozenset({"x", "y"})}),
    ("a == 'x' || has(a)", {"a": None}),
    ("(a == 'x' && b == '1') || (a == 'y' && c == '2')", {"a": frozenset({"x", "y"})}),
    ("a in {'x', 'y'} && a in {'y', 'z'}", {"a": frozenset({"y"})}),
    ("a == 'x' && a == 'y'", {"a": frozenset()}),  # matches nothing: still a true statement
    ("has(a) && a == 'x'", {"a": frozenset({"x"})}),
    # negation is followed through (De Morgan)
    ("!(a != 'x')", {"a": frozenset({"x"})}),
    ("!(a not in {'x', 'y'})", {"a": frozenset({"x", "y"})}),
    ("!(!has(a) || b != 'y')", {"a": None, "b": frozenset({"y"})}),
    ("!(!has(a) && !has(b))", {}),
    ("!global()", {NAMESPACE_LABEL: None}),
    # nothing required
    ("!has(a)", {}),
    ("all()", {}),
    ("", {}),
    ("global()", {}),
    ("a != 'x'", {}),
    ("a not in {'x'}", {}),
    ("!(a == 'x')", {}),
    ("!(a contains 'x')", {}),
    ("a == 'x' || b == 'y'", {}),
]


@pytest.mark.parametrize(("text", "expected"), REQUIRED)
def test_required_labels(text: str, expected: dict[str, frozenset[str] | None]) -> None:
    assert parse(text).required_labels() == expected


def test_required_labels_returns_a_fresh_dict() -> None:
    selector = parse("a == 'x'")
    selector.required_labels().clear()
    assert selector.required_labels() == {"a": frozenset({"x"})}


def test_referenced_keys() -> None:
    selector = parse("a == 'x' && !(has(b) || c in {'1', '2'}) || d contains 'q' || global()")
    assert selector.referenced_keys == {"a", "b", "c", "d", NAMESPACE_LABEL}
    assert parse("all()").referenced_keys == frozenset()


def test_pickles_by_canonical_text() -> None:
    import pickle

    selector = parse("b == 'y' && a == 'x'")
    restored = pickle.loads(pickle.dumps(selector))
    assert restored == selector
    assert restored.evaluate({"a": "x", "b": "y"}) is True

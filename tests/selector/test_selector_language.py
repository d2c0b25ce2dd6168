"""Table tests of Calico's selector language: every operator, absent labels, precedence,
quotes, keys, functions. Each row: selector text, labels, expected match."""

from __future__ import annotations

import pytest

from pyfelix.agent.selector import NAMESPACE_LABEL, Selector, SelectorError, parse

WEB = {"app": "web", "tier": "frontend", "app.kubernetes.io/name": "shop", "x-y_z": "1"}

CASES: list[tuple[str, dict[str, str], bool]] = [
    # ==
    ("app == 'web'", WEB, True),
    ("app == 'db'", WEB, False),
    ("missing == 'web'", WEB, False),
    ("app == ''", {"app": ""}, True),
    ("app == ''", {}, False),
    # != matches absent labels
    ("app != 'db'", WEB, True),
    ("app != 'web'", WEB, False),
    ("missing != 'web'", WEB, True),
    ("app != ''", {}, True),
    # in / not in (not in matches absent labels)
    ("tier in {'frontend', 'backend'}", WEB, True),
    ("tier in {'backend'}", WEB, False),
    ("missing in {'a', 'b'}", WEB, False),
    ("tier in {}", WEB, False),
    ("tier not in {'backend', 'db'}", WEB, True),
    ("tier not in {'frontend'}", WEB, False),
    ("missing not in {'a'}", WEB, True),
    ("tier not in {}", WEB, True),
    ("missing not in {}", {}, True),
    # contains / starts with / ends with (absent never matches)
    ("tier contains 'ont'", WEB, True),
    ("tier contains 'back'", WEB, False),
    ("missing contains 'a'", WEB, False),
    ("tier contains ''", WEB, True),
    ("missing contains ''", WEB, False),
    ("tier starts with 'front'", WEB, True),
    ("tier starts with 'end'", WEB, False),
    ("missing starts with ''", WEB, False),
    ("tier ends with 'end'", WEB, True),
    ("tier ends with 'front'", WEB, False),
    ("missing ends with 'x'", WEB, False),
    # has, !has
    ("has(app)", WEB, True),
    ("has(missing)", WEB, False),
    ("!has(app)", WEB, False),
    ("!has(missing)", WEB, True),
    ("has( app )", WEB, True),
    # all(), empty selector, global()
    ("all()", {}, True),
    ("all()", WEB, True),
    ("", WEB, True),
    ("   ", {}, True),
    ("!all()", WEB, False),
    ("global()", WEB, True),
    ("global()", {NAMESPACE_LABEL: "default"}, False),
    ("!global()", {NAMESPACE_LABEL: "default"}, True),
    # negation of comparisons (binds to the whole comparison)
    ("!app == 'web'", WEB, False),
    ("!app == 'db'", WEB, True),
    ("!missing == 'x'", WEB, True),
    ("!tier in {'frontend'}", WEB, False),
    ("!!has(app)", WEB, True),
    # && and ||
    ("app == 'web' && tier == 'frontend'", WEB, True),
    ("app == 'web' && tier == 'backend'", WEB, False),
    ("app == 'db' || tier == 'frontend'", WEB, True),
    ("app == 'db' || tier == 'backend'", WEB, False),
    # precedence: ! > && > ||
    ("app == 'db' && tier == 'x' || has(app)", WEB, True),  # (F && F) || T
    ("has(app) || app == 'db' && tier == 'x'", WEB, True),  # T || (F && F)
    ("app == 'db' && (tier == 'x' || has(app))", WEB, False),
    ("!has(app) || has(tier)", WEB, True),  # (!T) || T
    ("!(has(app) || has(tier))", WEB, False),
    ("!has(app) && has(tier) || has(missing)", WEB, False),
    ("((app == 'web'))", WEB, True),
    # quotes
    ('app == "web"', WEB, True),
    ("""q == "it's" """, {"q": "it's"}, True),
    ("""q == 'say "hi"'""", {"q": 'say "hi"'}, True),
    ("""q in {"a'b", 'c"d'}""", {"q": 'c"d'}, True),
    ("q == 'a b'", {"q": "a b"}, True),
    # keys with prefixes and / . - _ ; digits
    ("app.kubernetes.io/name == 'shop'", WEB, True),
    ("projectcalico.org/namespace == 'ns1'", {NAMESPACE_LABEL: "ns1"}, True),
    ("x-y_z == '1'", WEB, True),
    ("8080 == 'open'", {"8080": "open"}, True),
    # keywords are keys where a key is expected
    ("in == 'x'", {"in": "x"}, True),
    ("has == 'x'", {"has": "x"}, True),
    ("not in {'x', 'y'}", {"not": "y"}, True),
    ("all == 'x' && has(all)", {"all": "x"}, True),
    # whitespace is free between tokens
    ("app=='web'&&tier!='x'", WEB, True),
    ("\tapp\n==\n'web'  ", WEB, True),
]


@pytest.mark.parametrize(("text", "labels", "expected"), CASES)
def test_selector_matches_as_calico_does(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse(text).evaluate(labels) is expected


@pytest.mark.parametrize(("text", "labels", "expected"), CASES)
def test_canonical_form_means_the_same(text: str, labels: dict[str, str], expected: bool) -> None:
    canonical = parse(text).canonical
    assert parse(canonical).evaluate(labels) is expected
    assert parse(canonical).canonical == canonical


def test_evaluate_accepts_any_mapping() -> None:
    from types import MappingProxyType

    selector = parse("a == 'x' && b starts with 'y' && c in {'1', '2'}")
    assert selector.evaluate(MappingProxyType({"a": "x", "b": "yz", "c": "2"})) is True
    assert selector.evaluate(MappingProxyType({"a": "x", "b": "zy", "c": "2"})) is False


def test_parse_is_cached_and_interned_by_canonical_form() -> None:
    first = parse("role == 'db' && has(x)")
    assert parse("role == 'db' && has(x)") is first
    same_meaning = parse('has(x)&&role=="db"')
    assert same_meaning is first  # one Selector (and one compiled evaluator) per canonical text
    assert same_meaning == first and hash(same_meaning) == hash(first)
    assert parse("role == 'web'") != first


def test_selector_is_immutable() -> None:
    selector = parse("has(a)")
    with pytest.raises(AttributeError):
        selector.canonical = "all()"  # type: ignore[misc]
    assert isinstance(selector, Selector) and selector.canonical == "has(a)"


def test_non_string_input_is_a_selector_error() -> None:
    with pytest.raises(SelectorError, match="type list"):
        parse(["a == 'x'"])  # type: ignore[arg-type]
    with pytest.raises(SelectorError, match="type NoneType"):
        parse(None)  # type: ignore[arg-type]


def test_evaluation_never_goes_back_to_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyfelix.agent.selector import parser

    selector = parse("tier in {'frontend', 'db'} && !has(quarantine) && app starts with 'w'")

    def no_parsing(text: str) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(parser, "tokenize", no_parsing)
    monkeypatch.setattr(parser, "parse_tree", no_parsing)
    assert [selector.evaluate(WEB) for _ in range(3)] == [True, True, True]
    assert selector.evaluate({**WEB, "quarantine": "1"}) is False
    assert (
        parse("tier in {'frontend', 'db'} && !has(quarantine) && app starts with 'w'") is selector
    )

"""`pyfelix selector parse|eval`: output, JSON, exit statuses, error carets."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pyfelix.agent.selector import parse
from pyfelix.cli.main import cli


def run(*args: str):
    return CliRunner().invoke(cli, ["selector", *args])


def test_parse_prints_canonical_form_id_and_requirements() -> None:
    result = run("parse", "b == 'x' && a in {'2', '1'}")
    assert result.exit_code == 0, result.output
    expected_id = parse('a in {"1", "2"} && b == "x"').unique_id
    assert result.stdout.splitlines() == [
        'canonical: a in {"1", "2"} && b == "x"',
        f"id:        {expected_id}",
        'requires:  a in {"1", "2"} && b in {"x"}',
    ]


def test_parse_json() -> None:
    result = run("parse", "a == 'x' && has(b) && (c == '1' || d == '2')", "-o", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    selector = parse("a == 'x' && has(b) && (c == '1' || d == '2')")
    assert document == {
        "canonical": selector.canonical,
        "unique_id": selector.unique_id,
        "required_labels": {"a": ["x"], "b": None},
        "referenced_keys": ["a", "b", "c", "d"],
    }


def test_parse_of_bad_selector_exits_2_with_column_and_caret() -> None:
    result = run("parse", "a == x")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert "column 6" in lines[0] and "quoted string" in lines[0]
    assert lines[1].strip() == "a == x"
    assert lines[2].index("^") == lines[1].index("x")


def test_parse_nothing_required() -> None:
    result = run("parse", "!has(a)")
    assert result.exit_code == 0
    assert "requires:  (nothing)" in result.stdout


def test_eval_true_exits_0_false_exits_1() -> None:
    matched = run("eval", "role == 'api' && env != 'dev'", "role=api")
    assert (matched.exit_code, matched.stdout.strip()) == (0, "true")
    unmatched = run("eval", "role == 'api'", "role=db", "env=prod")
    assert (unmatched.exit_code, unmatched.stdout.strip()) == (1, "false")


def test_eval_labels_with_empty_values_and_prefixes() -> None:
    result = run(
        "eval",
        "a == '' && projectcalico.org/namespace == 'x=y'",
        "a=",
        "projectcalico.org/namespace=x=y",
    )
    assert (result.exit_code, result.stdout.strip()) == (0, "true")


def test_eval_json() -> None:
    result = run("eval", "has(a)", "b=1", "-o", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"match": False, "canonical": "has(a)"}


def test_eval_bad_label_argument_exits_2() -> None:
    result = run("eval", "has(a)", "novalue")
    assert result.exit_code == 2
    assert "'novalue' is not KEY=VALUE" in result.stderr


def test_eval_bad_selector_exits_2() -> None:
    result = run("eval", "(has(a)", "a=1")
    assert result.exit_code == 2
    assert "')' to close the '(' at column 1" in result.stderr


def test_help_has_examples() -> None:
    for args in (["--help"], ["parse", "--help"], ["eval", "--help"]):
        result = run(*args)
        assert result.exit_code == 0
        assert "Examples:" in result.stdout

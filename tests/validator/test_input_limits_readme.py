"""README's "Input limits" table names every limit of `agent.inputs.InputLimits` with its
default, and the tests' written-out defaults agree."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pyfelix.agent.inputs import LIMITS
from pyfelix.agent.inputs.limits import MAX_SELECTOR_NESTING
from tests.model import test_model_limits

README = Path(__file__).resolve().parents[2] / "README.md"


def _table() -> dict[str, str]:
    text = README.read_text()
    section = text[text.index("### Input limits"):]
    section = section[: section.index("\n## ")]
    rows = re.findall(r"^\| `([a-z_.A-Z]+)`[^|]*\| ([^|]+) \|", section, re.MULTILINE)
    return {name: default.strip() for name, default in rows}


def test_every_limit_is_in_the_readme_with_its_default() -> None:
    table = _table()
    for field in dataclasses.fields(LIMITS):
        assert field.name in table, field.name
        value = getattr(LIMITS, field.name)
        digits = re.sub(r"[^0-9]", "", table[field.name].split("(")[-1]
                        if "MiB" in table[field.name] else table[field.name])
        assert int(digits) == value, (field.name, table[field.name], value)
    assert f"`agent.selector.MAX_NESTING`) | {MAX_SELECTOR_NESTING} |" in README.read_text()


def test_the_tests_use_the_documented_defaults() -> None:
    assert LIMITS.max_rules_per_policy == test_model_limits.MAX_RULES_PER_POLICY
    assert LIMITS.max_selector_length == test_model_limits.MAX_SELECTOR_LENGTH
    assert LIMITS.max_set_members == test_model_limits.MAX_SET_MEMBERS

"""`pyfelix lab run --sync-timeout` (PYFELIX_LAB_SYNC_TIMEOUT): validated, and what the lab
runner gets. The lab itself is not built here (`_run_lab` is replaced)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from pyfelix.cli.commands import lab as lab_cli
from pyfelix.cli.main import cli
from pyfelix.lab.runner import DEFAULT_SYNC_TIMEOUT_SECONDS

SCENARIO = "tests/lab/scenarios/two-node-policy.yaml"


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def fake_run_lab(scenario: Any, **options: Any) -> None:
        seen.append(options)
        raise SystemExit(0)  # stop before the report

    monkeypatch.setattr(lab_cli, "_run_lab", fake_run_lab)
    monkeypatch.setattr(lab_cli, "_require_root", lambda: None)
    return seen


def test_default_matches_the_runner() -> None:
    assert lab_cli.DEFAULT_SYNC_TIMEOUT_SECONDS == DEFAULT_SYNC_TIMEOUT_SECONDS


@pytest.mark.parametrize(("args", "env", "want"), [
    ([], {}, DEFAULT_SYNC_TIMEOUT_SECONDS),
    (["--sync-timeout", "900"], {}, 900.0),
    ([], {"PYFELIX_LAB_SYNC_TIMEOUT": "600"}, 600.0),
])
def test_sync_timeout_reaches_the_runner(runs: list[dict[str, Any]], args: list[str],
                                         env: dict[str, str], want: float) -> None:
    result = CliRunner().invoke(cli, ["lab", "run", SCENARIO, "--no-agent", *args], env=env)
    assert result.exit_code == 0, result.output
    assert runs[-1]["sync_timeout"] == want


def test_a_bad_sync_timeout_names_the_option(runs: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(cli, ["lab", "run", SCENARIO, "--sync-timeout", "0.5"])
    assert result.exit_code == 2 and "--sync-timeout" in result.output
    assert not runs

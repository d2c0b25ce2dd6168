"""Golden-file tests: each case under tests/confd/cases/<case>/ is a file datastore (its YAML
files) plus `nodes.txt` naming the nodes to render; the expected bird.conf of each node is
tests/confd/golden/<case>/<node>.conf. Every golden file is also parsed by the real `bird -p`.

Regenerate on purpose only (then review the diff):
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/confd/test_confd_golden.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.confd.datastore import read_once
from pyfelix.confd.render import render_from_updates

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "confd" / "cases"
GOLDEN = REPO / "tests" / "confd" / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
REQUIRED_CASES = {"mesh", "mesh-disabled", "per-node-as", "global-peer", "node-specific-peer",
                  "route-reflector", "disabled-pool", "passwords", "custom-port"}


def _case_nodes() -> list[tuple[str, str]]:
    pairs = []
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        for node in (case / "nodes.txt").read_text().split():
            pairs.append((case.name, node))
    return pairs


CASE_NODES = _case_nodes()


def _render(case: str, node: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(REPO)  # sources in notes are then repo-relative, as in the goldens
    monkeypatch.delenv("NAMESPACE", raising=False)  # Secrets from kube-system
    updates, errors = read_once(DatastoreLocation.file(Path("tests/confd/cases") / case))
    assert errors == []
    text, _config = render_from_updates(updates, node)
    return text


def test_cases_cover_the_required_configurations() -> None:
    assert {case for case, _node in CASE_NODES} >= REQUIRED_CASES


@pytest.mark.parametrize(("case", "node"), CASE_NODES, ids=[f"{c}/{n}" for c, n in CASE_NODES])
def test_render_matches_golden(case: str, node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _render(case, node, monkeypatch)
    golden = GOLDEN / case / f"{node}.conf"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; run with UPDATE_GOLDEN=1 and review"
    assert text == golden.read_text()


@pytest.mark.skipif(shutil.which("bird") is None, reason="BIRD 2 (`bird`) is not installed")
@pytest.mark.parametrize(("case", "node"), CASE_NODES, ids=[f"{c}/{n}" for c, n in CASE_NODES])
def test_golden_parses_with_bird(case: str, node: str) -> None:
    golden = GOLDEN / case / f"{node}.conf"
    result = subprocess.run(["bird", "-p", "-c", str(golden)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def test_no_stale_golden_files() -> None:
    expected = {GOLDEN / case / f"{node}.conf" for case, node in CASE_NODES}
    assert set(GOLDEN.glob("*/*.conf")) == expected

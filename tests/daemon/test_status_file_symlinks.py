"""Files the agent and confd replace through a temporary file (the agent's status file,
confd's staged bird.conf) are never written through a symlink someone planted: not at the
temporary name, not at the final name (agent/atomic_file.py).

Each test plants symlinks to a "victim" file and checks the victim is untouched, the
destination is a regular file with the new content, and no temporary file is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.agent import atomic_file
from pyfelix.agent.atomic_file import StagedFile, write_atomically
from pyfelix.agent.daemon import StatusWriter
from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.confd.watcher import ConfdReconciler, Outcome

VICTIM_TEXT = "precious: must not change\n"


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    path = outside / "victim"
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


def _write_status(path: Path, **fields: object) -> StatusWriter:
    writer = StatusWriter(str(path), "node1")
    writer.write(calc_in_sync=True, dataplane_in_sync=True, **fields)
    return writer


def _leftovers(directory: Path, planted: set[Path]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")
                  and p not in planted)


def _fixed_names(monkeypatch: pytest.MonkeyPatch, names: list[str]) -> list[str]:
    """Make the random temporary names predictable: `names` in turn (then fail loudly)."""
    handed_out: list[str] = []
    queue: Iterator[str] = iter(names)

    def next_name(final_name: str) -> str:
        name = next(queue)
        handed_out.append(name)
        return name

    monkeypatch.setattr(atomic_file, "temporary_name", next_name)
    return handed_out


def test_status_file_ignores_a_symlink_at_the_old_temporary_name(run_dir: Path,
                                                                 victim: Path) -> None:
    """The pre-fix writer opened `<status>.tmp` with O_TRUNC and followed a link there."""
    status = run_dir / "status.json"
    planted = run_dir / "status.json.tmp"
    planted.symlink_to(victim)
    _write_status(status, endpoints=3)
    assert victim.read_text() == VICTIM_TEXT
    assert planted.is_symlink() and os.readlink(planted) == str(victim)  # left alone
    assert not status.is_symlink()
    assert json.loads(status.read_text())["endpoints"] == 3
    assert _leftovers(run_dir, {planted}) == []


def test_status_file_replaces_a_symlink_at_its_own_name(run_dir: Path, victim: Path) -> None:
    status = run_dir / "status.json"
    status.symlink_to(victim)
    _write_status(status, endpoints=1)
    assert victim.read_text() == VICTIM_TEXT
    assert not status.is_symlink() and stat.S_ISREG(status.lstat().st_mode)
    assert json.loads(status.read_text())["hostname"] == "node1"
    assert stat.S_IMODE(status.stat().st_mode) == 0o644


def test_a_symlink_at_the_random_temporary_name_is_skipped(
        run_dir: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone who guessed (or raced to) the next temporary name: O_EXCL|O_NOFOLLOW refuses
    the entry and the next random name is used."""
    names = _fixed_names(monkeypatch, [".status.json.guessed.tmp", ".status.json.fresh.tmp"])
    planted = run_dir / ".status.json.guessed.tmp"
    planted.symlink_to(victim)
    _write_status(run_dir / "status.json", endpoints=2)
    assert names == [".status.json.guessed.tmp", ".status.json.fresh.tmp"]
    assert victim.read_text() == VICTIM_TEXT
    assert planted.is_symlink()
    assert json.loads((run_dir / "status.json").read_text())["endpoints"] == 2
    assert _leftovers(run_dir, {planted}) == []


def test_a_dangling_symlink_at_the_temporary_name_creates_nothing_through_it(
        run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link to a file that does not exist yet: following it would CREATE the target."""
    target = tmp_path / "elsewhere-new-file"
    _fixed_names(monkeypatch, [".status.json.a.tmp", ".status.json.b.tmp"])
    (run_dir / ".status.json.a.tmp").symlink_to(target)
    _write_status(run_dir / "status.json")
    assert not target.exists()


def test_every_name_taken_fails_the_write_without_stopping_the_agent(
        run_dir: Path, victim: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    names = [f".status.json.taken{i}.tmp" for i in range(atomic_file._NAME_ATTEMPTS)]
    for name in names:
        (run_dir / name).symlink_to(victim)
    _fixed_names(monkeypatch, names)
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.daemon"):
        writer = _write_status(run_dir / "status.json")  # does not raise
    assert victim.read_text() == VICTIM_TEXT
    assert not (run_dir / "status.json").exists()
    assert any("cannot write the status file" in r.getMessage() for r in caplog.records)
    # the next write (names free again) succeeds: the failure was not remembered as written
    monkeypatch.setattr(atomic_file, "temporary_name", lambda final: ".status.json.ok.tmp")
    writer.write(calc_in_sync=True, dataplane_in_sync=True)
    assert (run_dir / "status.json").exists()


def test_a_directory_at_the_status_path_is_reported_not_fatal(
        run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    (run_dir / "status.json").mkdir()
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.daemon"):
        _write_status(run_dir / "status.json")
    assert (run_dir / "status.json").is_dir()
    assert _leftovers(run_dir, set()) == []
    assert sum("cannot write the status file" in r.getMessage() for r in caplog.records) == 1


def test_write_atomically_sets_the_mode_whatever_the_umask(run_dir: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomically(run_dir / "f", b"x", mode=0o644, sync=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE((run_dir / "f").stat().st_mode) == 0o644


def test_staged_file_discarded_on_error_leaves_nothing(run_dir: Path) -> None:
    (run_dir / "f").write_text("old")
    with pytest.raises(RuntimeError), StagedFile(run_dir / "f") as staged:
        staged.write(b"new")
        assert staged.path.exists()
        raise RuntimeError("boom")
    assert (run_dir / "f").read_text() == "old"
    assert sorted(p.name for p in run_dir.iterdir()) == ["f"]


# --- confd's staged bird.conf ------------------------------------------------------------------

class _AcceptingBird:
    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, path: object) -> object:
        from pyfelix.confd.bird import BirdResult

        self.checked.append(Path(str(path)).read_text())
        return BirdResult(True, "")

    def configure(self, socket_path: object) -> object:
        from pyfelix.confd.bird import BirdResult

        return BirdResult(True, "Reconfigured")


def _node(name: str, address: str) -> dict[str, object]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "Node", "metadata": {"name": name},
            "spec": {"bgp": {"ipv4Address": address}}}


def _reconciled(run_dir: Path) -> tuple[ConfdReconciler, Path]:
    from pyfelix.agent.syncer.api import RawUpdate, key_of

    config = run_dir / "bird.conf"
    reconciler = ConfdReconciler("node1", config, run_dir / "bird.ctl",
                                 tools=_AcceptingBird())  # type: ignore[arg-type]
    docs = [_node("node1", "198.18.0.1/15"), _node("node2", "198.18.0.2/15")]
    reconciler.on_updates([RawUpdate(key_of(d), d, "test", "1") for d in docs])
    reconciler.on_status(SyncStatus.IN_SYNC)
    assert reconciler.reconcile() is Outcome.RELOADED
    return reconciler, config


def test_confd_ignores_a_symlink_at_the_old_staged_name(run_dir: Path, victim: Path) -> None:
    """The pre-fix confd opened `.bird.conf.staged` with O_CREAT|O_TRUNC, following links."""
    planted = run_dir / ".bird.conf.staged"
    planted.symlink_to(victim)
    _, config = _reconciled(run_dir)
    assert victim.read_text() == VICTIM_TEXT
    assert "neighbor 198.18.0.2" in config.read_text()
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert planted.is_symlink()


def test_confd_replaces_a_symlink_at_the_config_name(run_dir: Path, victim: Path) -> None:
    (run_dir / "bird.conf").symlink_to(victim)
    _, config = _reconciled(run_dir)
    assert victim.read_text() == VICTIM_TEXT
    assert not config.is_symlink() and "neighbor 198.18.0.2" in config.read_text()
    assert sorted(p.name for p in run_dir.iterdir()) == ["bird.conf"]

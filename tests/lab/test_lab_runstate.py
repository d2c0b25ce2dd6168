"""Run directories and their locks: what the sweep treats as alive, stale or not ours.

No namespaces here (see tests/privileged/lab for those): the run ids used are fresh, so no
namespace in /run/netns can belong to them, and the state roots are temporary directories.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pyfelix.lab import naming
from pyfelix.lab.runstate import RunState, run_is_alive, sweep_stale_runs


def test_a_held_run_is_alive_and_release_removes_its_directory(tmp_path: Path) -> None:
    state = RunState(naming.new_run_id(), tmp_path)
    state.acquire()
    assert state.path.is_dir() and state.datastore_dir.is_dir()
    assert (state.path / "pid").read_text().strip() == str(os.getpid())
    assert run_is_alive(state.path)
    report = sweep_stale_runs(tmp_path, tmp_path / "bpffs")
    assert state.run_id in report.live_runs
    assert state.path.is_dir()
    state.release()
    assert not state.path.exists()
    assert not run_is_alive(state.path)


def test_the_same_run_id_cannot_be_acquired_twice(tmp_path: Path) -> None:
    run_id = naming.new_run_id()
    first = RunState(run_id, tmp_path)
    first.acquire()
    with pytest.raises(FileExistsError):
        RunState(run_id, tmp_path).acquire()
    assert run_is_alive(first.path)
    first.release()


def test_sweep_removes_dead_runs_and_their_bpffs_dirs(tmp_path: Path) -> None:
    bpffs = tmp_path / "bpffs"
    dead = naming.new_run_id()
    (tmp_path / dead).mkdir()
    (tmp_path / dead / "lock").touch()  # nobody holds it: the run died
    (bpffs / dead / "maps").mkdir(parents=True)
    (bpffs / "not-ours").mkdir()
    report = sweep_stale_runs(tmp_path, bpffs)
    assert report.removed_runs == [dead]
    assert not (tmp_path / dead).exists()
    assert not (bpffs / dead).exists()
    assert (bpffs / "not-ours").is_dir()
    assert report.errors == []


def test_sweep_removes_only_old_unlocked_staging_dirs(tmp_path: Path) -> None:
    old, fresh = tmp_path / f".{naming.new_run_id()}", tmp_path / f".{naming.new_run_id()}"
    for path in (old, fresh):
        path.mkdir()
        (path / "lock").touch()
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))
    other = tmp_path / "unrelated"
    other.mkdir()
    sweep_stale_runs(tmp_path, tmp_path / "bpffs")
    assert not old.exists()
    assert fresh.is_dir() and other.is_dir()

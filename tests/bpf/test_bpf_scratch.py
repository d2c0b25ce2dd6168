"""agent.bpf.scratch on plain directories (remove_pin_dir removes regular files and
directories alike): a killed owner's directory is swept by the next user, a live one never
is, and nothing outside the scratch names is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyfelix.agent.bpf.scratch import PREFIX, scratch_pin_dir, sweep_stale_scratch


def roots(tmp_path: Path) -> tuple[Path, Path]:
    bpffs, locks = tmp_path / "bpffs", tmp_path / "locks"
    bpffs.mkdir()
    return bpffs, locks


def test_removed_on_exit_and_on_exception(tmp_path: Path) -> None:
    bpffs, locks = roots(tmp_path)
    with scratch_pin_dir("t", bpffs_root=bpffs, lock_root=locks) as path:
        os.mkdir(path)
        Path(path, "pin").write_text("x")
    assert list(bpffs.iterdir()) == [] and list(locks.iterdir()) == []
    with pytest.raises(RuntimeError), \
            scratch_pin_dir("t", bpffs_root=bpffs, lock_root=locks) as path:
        os.mkdir(path)
        raise RuntimeError("boom")
    assert list(bpffs.iterdir()) == [] and list(locks.iterdir()) == []


def test_a_live_owner_is_left_alone_and_a_killed_one_is_swept(tmp_path: Path) -> None:
    bpffs, locks = roots(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from pyfelix.agent.bpf.scratch import scratch_pin_dir
        with scratch_pin_dir("owner", bpffs_root=Path({str(bpffs)!r}),
                             lock_root=Path({str(locks)!r})) as path:
            os.mkdir(path)
            print(path, flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        path = Path(owner.stdout.readline().strip())
        assert path.is_dir() and path.name.startswith(PREFIX + "owner-")
        (bpffs / "not-ours").mkdir()
        assert sweep_stale_scratch(bpffs, locks) == []  # alive: its lock is held
        owner.send_signal(signal.SIGKILL)  # no finally runs
        owner.wait(timeout=30)
        assert path.is_dir()
        with scratch_pin_dir("next", bpffs_root=bpffs, lock_root=locks):
            assert not path.exists()  # the next user swept it
        assert [p.name for p in bpffs.iterdir()] == ["not-ours"]
        assert list(locks.iterdir()) == []
    finally:
        owner.kill()
        owner.wait(timeout=30)


def test_a_directory_without_its_lock_file_is_stale(tmp_path: Path) -> None:
    bpffs, locks = roots(tmp_path)
    (bpffs / f"{PREFIX}orphan-0000").mkdir()
    assert sweep_stale_scratch(bpffs, locks) == [f"{PREFIX}orphan-0000"]
    escape = scratch_pin_dir("../escape", bpffs_root=bpffs, lock_root=locks)
    with pytest.raises(ValueError, match="tag"):
        escape.__enter__()

"""How long the inotify watcher waits before reading a burst: `settle` after atomic writes
(files renamed into place), `debounce` for anything that may be half a change (in-place
writes, even closed ones, included).

The unit tests feed `WriteTracker` event sequences as the kernel reports them for common
writers; the watcher tests use a long debounce (3 s) so the two waits cannot be confused:
the assertions are about which wait applied, not about speed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from syncer_testlib import Recorder, gnp, gnp_key, write, yaml_docs

from pyfelix.agent.syncer.file import FileSyncer, WriteTracker, is_resource_file_name
from pyfelix.agent.syncer.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    InotifyEvent,
)

LONG_DEBOUNCE = 3.0


def ev(mask: int, name: str, wd: int = 1) -> InotifyEvent:
    return InotifyEvent(wd, mask, 0, name)


def tracker(*events: InotifyEvent) -> WriteTracker:
    t = WriteTracker(lambda e: is_resource_file_name(e.name) and not e.name.startswith("."))
    t.add(events)
    return t


@pytest.mark.parametrize("events", [
    # pyfelix apply / the lab: write a hidden temporary, rename it into place
    [ev(IN_CREATE, ".a.yaml.tmp"), ev(IN_MODIFY, ".a.yaml.tmp"),
     ev(IN_CLOSE_WRITE, ".a.yaml.tmp"), ev(IN_MOVED_FROM, ".a.yaml.tmp"),
     ev(IN_MOVED_TO, "a.yaml")],
    # the same file replaced twice, and two files renamed back to back
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_MOVED_TO, "a.yaml")],
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_MOVED_TO, "b.json", wd=2)],
    # renamed into place, then chmod
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_ATTRIB, "a.yaml")],
    # chmod only
    [ev(IN_ATTRIB, "a.yaml")],
], ids=["atomic-rename", "replaced-twice", "two-files", "rename-then-chmod", "chmod"])
def test_atomic_writes_settle_quickly(events: list[InotifyEvent]) -> None:
    assert tracker(*events).complete


@pytest.mark.parametrize("events", [
    [],  # nothing about resources yet
    [ev(IN_CREATE, ".a.yaml.tmp"), ev(IN_MODIFY, ".a.yaml.tmp")],  # only hidden temporaries
    [ev(IN_MODIFY, "a.yaml")],  # still open for writing
    [ev(IN_CREATE, "a.yaml")],
    # written in place and closed: `echo a > f; echo b >> f` closes after each part
    [ev(IN_MODIFY, "a.yaml"), ev(IN_CLOSE_WRITE, "a.yaml")],
    # vim with a backup: the old file moved away, a new one written in place
    [ev(IN_MOVED_FROM, "a.yaml"), ev(IN_MOVED_TO, "a.yaml~"), ev(IN_CREATE, "a.yaml"),
     ev(IN_MODIFY, "a.yaml"), ev(IN_CLOSE_WRITE, "a.yaml"), ev(IN_ATTRIB, "a.yaml")],
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_MODIFY, "a.yaml")],  # replaced, then written into
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_MODIFY, "b.yaml")],  # one done, one not
    [ev(IN_DELETE, "a.yaml")],  # may be the first half of a replace
    [ev(IN_MOVED_FROM, "a.yaml")],
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_CREATE | IN_ISDIR, "sub")],  # a new directory
    [ev(IN_MOVED_TO, "..data")],  # Kubernetes' atomic writer
    [ev(IN_MOVED_TO, "a.yaml"), ev(IN_Q_OVERFLOW, "")],
], ids=["empty", "hidden-only", "open", "created", "closed-in-place", "vim-backup",
        "replaced-then-written", "one-of-two", "deleted", "moved-out", "new-dir",
        "configmap-swap", "overflow"])
def test_anything_else_waits_for_the_debounce(events: list[InotifyEvent]) -> None:
    assert not tracker(*events).complete


def test_settle_must_not_exceed_debounce(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="settle"):
        FileSyncer(tmp_path, debounce=0.05, settle=0.1)
    FileSyncer(tmp_path, debounce=0.005)  # the default settle shrinks to a shorter debounce


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Recorder]:
    """An inotify FileSyncer on tmp_path holding p.yaml (selector v == '0')."""
    write(tmp_path / "p.yaml", yaml_docs(gnp("p", "v == '0'")))
    syncer = FileSyncer(tmp_path, use_inotify=True, debounce=LONG_DEBOUNCE, settle=0.01,
                        settle_limit=3 * LONG_DEBOUNCE)
    rec = Recorder()
    syncer.start(rec)
    try:
        rec.wait_in_sync()
        assert syncer.mode == "inotify"
        yield rec
    finally:
        syncer.stop()


def test_atomic_rename_is_read_after_the_short_settle(tmp_path: Path, watched) -> None:
    rec = watched
    staged = tmp_path / ".p.yaml.tmp"
    staged.write_text(yaml_docs(gnp("p", "v == '1'")))
    started = time.monotonic()
    os.replace(staged, tmp_path / "p.yaml")
    rec.wait_for(lambda r: r.state[gnp_key("p")] == gnp("p", "v == '1'"), "renamed file")
    assert time.monotonic() - started < LONG_DEBOUNCE / 2, "waited for the long debounce"


def test_file_written_in_place_waits_for_the_debounce(tmp_path: Path, watched) -> None:
    rec = watched
    started = time.monotonic()
    with open(tmp_path / "p.yaml", "w") as handle:  # written in place, then closed
        handle.write(yaml_docs(gnp("p", "v == '2'")))
    time.sleep(0.3)  # 30 x `settle`: closed, yet only `debounce` (3 s) may end the wait
    assert rec.state[gnp_key("p")] == gnp("p", "v == '0'")
    rec.wait_for(lambda r: r.state[gnp_key("p")] == gnp("p", "v == '2'"), "in-place write")
    assert time.monotonic() - started >= LONG_DEBOUNCE * 0.9

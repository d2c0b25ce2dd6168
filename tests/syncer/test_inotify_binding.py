"""The ctypes inotify binding: real events from a temporary directory."""

from __future__ import annotations

import os
import select
import struct
from pathlib import Path

import pytest

from pyfelix.agent.syncer import inotify
from pyfelix.agent.syncer.inotify import Inotify, InotifyEvent, parse_events


def read_until(watcher: Inotify, wanted: int, timeout: float = 5.0) -> list[InotifyEvent]:
    events: list[InotifyEvent] = []
    while not any(e.mask & wanted for e in events):
        ready, _, _ = select.select([watcher.fileno()], [], [], timeout)
        if not ready:
            raise AssertionError(f"no event {wanted:#x} within {timeout} s; got {events}")
        events.extend(watcher.read_events())
    return events


def test_create_modify_move_delete_events(tmp_path: Path) -> None:
    with Inotify() as watcher:
        wd = watcher.add_watch(str(tmp_path))
        assert watcher.read_events() == []
        (tmp_path / "a.yaml").write_text("x: 1\n")
        events = read_until(watcher, inotify.IN_CLOSE_WRITE)
        assert {(e.wd, e.name) for e in events} == {(wd, "a.yaml")}
        assert any(e.mask & inotify.IN_CREATE for e in events)

        os.rename(tmp_path / "a.yaml", tmp_path / "b.yaml")
        events = read_until(watcher, inotify.IN_MOVED_TO)
        moved_from = [e for e in events if e.mask & inotify.IN_MOVED_FROM]
        moved_to = [e for e in events if e.mask & inotify.IN_MOVED_TO]
        assert [e.name for e in moved_from] == ["a.yaml"]
        assert [e.name for e in moved_to] == ["b.yaml"]
        assert moved_from[0].cookie == moved_to[0].cookie != 0

        (tmp_path / "sub").mkdir()
        events = read_until(watcher, inotify.IN_CREATE)
        assert [(e.name, e.is_dir) for e in events] == [("sub", True)]

        (tmp_path / "b.yaml").unlink()
        events = read_until(watcher, inotify.IN_DELETE)
        assert [e.name for e in events] == ["b.yaml"]


def test_watching_a_missing_directory_raises_oserror(tmp_path: Path) -> None:
    with Inotify() as watcher, pytest.raises(OSError):
        watcher.add_watch(str(tmp_path / "missing"))


def test_parse_events_handles_padding_and_several_events() -> None:
    def raw(wd: int, mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name)) if name else b""
        return struct.pack("iIII", wd, mask, 7, len(padded)) + padded

    buffer = raw(1, inotify.IN_CREATE, b"x.yaml") + raw(2, inotify.IN_IGNORED, b"")
    assert parse_events(buffer) == [InotifyEvent(1, inotify.IN_CREATE, 7, "x.yaml"),
                                    InotifyEvent(2, inotify.IN_IGNORED, 7, "")]

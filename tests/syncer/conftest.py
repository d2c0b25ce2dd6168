"""Fixtures for the syncer tests: run FileSyncers (inotify or polling) on temporary dirs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from syncer_testlib import Recorder

from pyfelix.agent.syncer.file import FileSyncer

SyncerFactory = Callable[..., tuple[FileSyncer, Recorder]]


@pytest.fixture(params=["inotify", "poll"])
def watch_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start_syncer(watch_mode: str) -> Iterator[SyncerFactory]:
    """Start FileSyncers in the parametrised watch mode; all are stopped at teardown."""
    started: list[FileSyncer] = []

    def start(path: Path, **options: Any) -> tuple[FileSyncer, Recorder]:
        options.setdefault("use_inotify", watch_mode == "inotify")
        options.setdefault("poll_interval", 0.05)
        options.setdefault("debounce", 0.05)
        syncer = FileSyncer(path, **options)
        recorder = Recorder()
        syncer.start(recorder)
        started.append(syncer)
        return syncer, recorder

    yield start
    for syncer in started:
        syncer.stop()

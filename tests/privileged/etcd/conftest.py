"""Fixtures for the real-etcd tests: etcd servers (see etcd_server.py) and started syncers.

Every server and syncer a test starts is stopped at teardown, also when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.etcd import EtcdSyncer
from pyfelix.agent.syncer.etcd_conn import EtcdConfig
from tests.privileged.etcd.etcd_server import ETCD_BINARY, EtcdServer
from tests.privileged.etcd.etcd_testlib import TimedRecorder

ServerFactory = Callable[..., EtcdServer]
SyncerFactory = Callable[..., tuple[EtcdSyncer, TimedRecorder]]


@pytest.fixture(scope="session", autouse=True)
def _etcd_installed() -> None:
    if not Path(ETCD_BINARY).exists():
        pytest.fail(f"{ETCD_BINARY} is missing: install Debian's etcd-server (scripts/setup.sh)")


@pytest.fixture
def make_etcd(tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[EtcdServer] = []

    def make(*, tls: bool = False, start: bool = True) -> EtcdServer:
        server = EtcdServer(tmp_path, tls=tls)
        servers.append(server)
        if start:
            server.start()
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def etcd(make_etcd: ServerFactory) -> EtcdServer:
    return make_etcd()


@pytest.fixture
def start_syncer() -> Iterator[SyncerFactory]:
    """Start EtcdSyncers with test-friendly timings; all are stopped at teardown."""
    started: list[EtcdSyncer] = []

    def start(config: EtcdConfig, **options: Any) -> tuple[EtcdSyncer, TimedRecorder]:
        options.setdefault("backoff", Backoff(initial=0.05, maximum=0.5))
        options.setdefault("liveness_interval", 1.0)
        options.setdefault("liveness_timeout", 1.0)
        syncer = EtcdSyncer(config, **options)
        recorder = TimedRecorder()
        syncer.start(recorder)
        started.append(syncer)
        return syncer, recorder

    yield start
    for syncer in started:
        syncer.stop()

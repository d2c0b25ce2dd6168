"""Fixtures for the Typha tests: file datastores, servers on free loopback ports, clients.

Every server and client a test starts is stopped at teardown, also when the test fails.
Timings are shortened (pings every 0.2 s, small retry delays) so failures show quickly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typha_testlib import FileStore, Recorder

from pyfelix.agent.syncer.file import FileSyncer
from pyfelix.agent.typha.client import TyphaSyncer
from pyfelix.agent.typha.server import ServerConfig, TyphaServer

ServerFactory = Callable[..., TyphaServer]
ClientFactory = Callable[..., tuple[TyphaSyncer, Recorder]]

TEST_SERVER_TIMINGS: dict[str, Any] = {
    "handshake_timeout": 2.0, "ping_interval": 0.2, "pong_timeout": 2.0, "write_timeout": 2.0,
}


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "datastore")


def file_syncer_factory(root: Path) -> Callable[[str], FileSyncer]:
    def make(_syncer_type: str) -> FileSyncer:
        return FileSyncer(root, debounce=0.02, settle_limit=0.2, poll_interval=0.05)

    return make


@pytest.fixture
def start_server(store: FileStore) -> Iterator[ServerFactory]:
    """Start TyphaServers on the file datastore `store` (port 0 = a free one unless given)."""
    servers: list[TyphaServer] = []

    def start(*, factory: Callable[[str], Any] | None = None, **options: Any) -> TyphaServer:
        options.setdefault("port", 0)
        for name, value in TEST_SERVER_TIMINGS.items():
            options.setdefault(name, value)
        server = TyphaServer(factory or file_syncer_factory(store.root), ServerConfig(**options))
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_client() -> Iterator[ClientFactory]:
    clients: list[TyphaSyncer] = []

    def start(address: tuple[str, int] | str | list[str], *, recorder: Recorder | None = None,
              **options: Any) -> tuple[TyphaSyncer, Recorder]:
        if isinstance(address, tuple):
            addresses = [f"{address[0]}:{address[1]}"]
        elif isinstance(address, str):
            addresses = [address]
        else:
            addresses = address
        options.setdefault("retry_initial", 0.05)
        options.setdefault("retry_max", 0.3)
        options.setdefault("read_timeout", 3.0)
        options.setdefault("connect_timeout", 3.0)
        options.setdefault("hostname", f"node{len(clients)}")
        client = TyphaSyncer(addresses, **options)
        recorder = recorder or Recorder()
        client.start(recorder)
        clients.append(client)
        return client, recorder

    yield start
    for client in clients:
        client.stop()

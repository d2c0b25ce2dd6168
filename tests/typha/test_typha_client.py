"""TyphaSyncer's connection attempts (the budget, discovery refresh, giving up with a clear
error), its settings from the environment, and stopping promptly."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from typha_testlib import FileStore, gnp

from pyfelix.agent.syncer.api import SyncStatus
from pyfelix.agent.typha.client import TyphaConfigError, make_typha_syncer
from pyfelix.agent.typha.discovery import DiscoveryError, KubernetesServiceDiscovery


class ClosingListener:
    """Accepts connections and closes them at once, counting them (a broken Typha)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listeners():
    made: list[ClosingListener] = []

    def make(count: int) -> list[ClosingListener]:
        new = [ClosingListener() for _ in range(count)]
        made.extend(new)
        return new

    yield make
    for listener in made:
        listener.close()


@pytest.mark.parametrize(("count", "expected_total"), [(1, 6), (2, 6), (3, 6), (4, 8), (7, 14)])
def test_attempt_budget_is_max_of_six_and_two_per_address(count: int, expected_total: int,
                                                          listeners, start_client) -> None:
    broken = listeners(count)
    client, rec = start_client([b.address for b in broken], retry_initial=0.001,
                               retry_max=0.002)
    assert client.failed.wait(10)
    assert sum(b.accepted for b in broken) == expected_total
    per_address = [b.accepted for b in broken]
    assert max(per_address) - min(per_address) <= 1  # round robin
    assert rec.statuses == [SyncStatus.WAIT_FOR_DATASTORE]
    assert len(rec.errors) == 1
    message = rec.errors[0].message
    assert f"for the felix syncer after {expected_total} attempts" in message
    for b in broken:  # each address with its last error (EOF or reset)
        assert f"{b.address}: {b.address} closed the connection" in message or \
            f"{b.address}: reading from {b.address} failed" in message


class ScriptedDiscovery:
    """Returns the next list (or raises the next error) on each call."""

    def __init__(self, *results: list[str] | Exception) -> None:
        self.results = list(results)
        self.calls = 0
        self.description = "scripted discovery"

    def discover(self) -> list[str]:
        result = self.results[min(self.calls, len(self.results) - 1)]
        self.calls += 1
        if isinstance(result, Exception):
            raise result
        return list(result)


def test_discovery_is_asked_again_after_each_pass(listeners, store: FileStore, start_server,
                                                  start_client) -> None:
    store.put(gnp("a"))
    server = start_server()
    live = f"127.0.0.1:{server.address[1]}"
    (broken,) = listeners(1)
    discovery = ScriptedDiscovery(DiscoveryError("service x/y has no ready endpoint"),
                                  [broken.address], [broken.address, live])
    client, rec = start_client([], discovery=discovery, retry_initial=0.001)
    rec.wait_converged(store.expected())
    assert discovery.calls == 3  # error, [broken], [broken, live]
    assert broken.accepted == 2
    assert client.connected_to == live


def test_discovery_failures_count_as_attempts(start_client) -> None:
    discovery = ScriptedDiscovery(DiscoveryError("service kube-system/t has no ready endpoint"))
    client, rec = start_client([], discovery=discovery, retry_initial=0.001)
    assert client.failed.wait(10)
    assert discovery.calls == 6
    assert "scripted discovery: service kube-system/t has no ready endpoint" in \
        rec.errors[0].message


def test_stop_is_prompt_while_retrying(listeners, start_client) -> None:
    (broken,) = listeners(1)
    client, _ = start_client([broken.address], retry_initial=5.0, retry_max=5.0)
    time.sleep(0.2)
    started = time.monotonic()
    client.stop()
    assert time.monotonic() - started < 2.0


def test_stop_is_prompt_while_connected(store: FileStore, start_server, start_client) -> None:
    server = start_server()
    client, rec = start_client(server.address, read_timeout=30.0)
    rec.wait_for(lambda r: r.status == SyncStatus.IN_SYNC, "in sync")
    started = time.monotonic()
    client.stop()
    assert time.monotonic() - started < 2.0


def test_settings_from_the_environment() -> None:
    syncer = make_typha_syncer(["10.0.0.1:5473"], env={
        "FELIX_TYPHAREADTIMEOUT": "12.5", "FELIX_TYPHAWRITETIMEOUT": "3",
        "FELIX_FELIXHOSTNAME": "node7"}, syncer_type="bgp")
    assert (syncer.read_timeout, syncer.write_timeout) == (12.5, 3.0)
    assert syncer.hostname == "node7"
    assert syncer.syncer_type == "bgp"
    assert syncer.tls is None
    discovered = make_typha_syncer([], env={"FELIX_TYPHAK8SSERVICENAME": "calico-typha",
                                            "FELIX_FELIXHOSTNAME": "node7"})
    assert isinstance(discovered.discovery, KubernetesServiceDiscovery)
    assert discovered.discovery.node_name == "node7"


@pytest.mark.parametrize(("endpoints", "env", "message"), [
    ([], {}, "typha:// names no HOST:PORT and neither FELIX_TYPHAADDR nor "
             "FELIX_TYPHAK8SSERVICENAME is set"),
    (["a:1"], {"FELIX_TYPHAREADTIMEOUT": "soon"},
     "FELIX_TYPHAREADTIMEOUT='soon' is not a number of seconds"),
    (["a:1"], {"FELIX_TYPHAWRITETIMEOUT": "-1"}, "FELIX_TYPHAWRITETIMEOUT='-1' must be positive"),
    (["a:1"], {"FELIX_TYPHACAFILE": "/nonexistent/ca.crt"},
     "TLS needs FELIX_TYPHACAFILE, FELIX_TYPHACERTFILE, FELIX_TYPHAKEYFILE together"),
    (["nonsense"], {}, "Typha address 'nonsense' is not HOST:PORT"),
])
def test_bad_settings_are_clear_errors(endpoints: list[str], env: dict[str, str],
                                       message: str) -> None:
    with pytest.raises(TyphaConfigError) as caught:
        make_typha_syncer(endpoints, env=env)
    assert message in str(caught.value)

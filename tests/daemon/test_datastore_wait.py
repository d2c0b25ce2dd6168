"""An agent started while its datastore cannot be reached waits for it (agent/daemon.py,
`Agent.wait_for_datastore_config`): retries with growing delays, logs each failure with the
next delay, is not ready meanwhile, stops promptly on SIGTERM, and still exits at once for
bad local configuration or a datastore that answers but refuses.

The real thing (an agent process, etcd started after it) is
tests/privileged/reliability/test_agent_etcd.py::test_agent_started_before_etcd_waits_then_syncs.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest

from pyfelix.agent import daemon
from pyfelix.agent.config import ConfigError
from pyfelix.agent.daemon import DATAPLANE_REPORTER, DATASTORE_REPORTER, Agent, AgentOptions
from pyfelix.agent.datastore import open_datastore, parse_datastore_url
from pyfelix.agent.health import HealthAggregator
from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.client import DatastoreClientError, DatastoreUnavailable


class _FlakyDatastore:
    """`datastore_felix_config` stand-in: unreachable `failures` times, then answers."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or DatastoreUnavailable("cannot reach etcd at 127.0.0.1:1: refused")
        self.calls: list[float] = []
        self.ready_seen: list[bool] = []
        self.health: HealthAggregator | None = None

    def __call__(self, datastore: str, hostname: str) -> tuple[dict[str, str], dict[str, str]]:
        self.calls.append(time.monotonic())
        if self.health is not None:
            self.ready_seen.append(self.health.is_ready())
        if len(self.calls) <= self.failures:
            raise self.error
        return {"LogSeverityScreen": "Warning"}, {}


def _agent(monkeypatch: pytest.MonkeyPatch, fake: _FlakyDatastore,
           environ: dict[str, str] | None = None) -> Agent:
    monkeypatch.setattr(daemon, "datastore_felix_config", fake)
    backoff = Backoff(initial=0.01, maximum=0.08, jitter=0.0, rng=random.Random(1))
    return Agent(AgentOptions(parse_datastore_url("etcd3://127.0.0.1:1"), "node1",
                              environ=environ or {}),
                 startup_backoff=backoff)


def _health() -> HealthAggregator:
    health = HealthAggregator()
    health.register(DATASTORE_REPORTER, live=False, ready=True)
    return health


def test_unreachable_datastore_is_retried_with_backoff_then_config_is_read(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake = _FlakyDatastore(failures=5)
    agent = _agent(monkeypatch, fake)
    health = fake.health = _health()
    with caplog.at_level(logging.INFO, logger="pyfelix.agent.daemon"):
        config = agent.wait_for_datastore_config(health)
    assert config is not None and config.log_severity_screen == "Warning"  # datastore layer
    assert len(fake.calls) == 6
    gaps = [b - a for a, b in zip(fake.calls, fake.calls[1:], strict=False)]
    assert gaps[3] > gaps[0] * 3  # 0.01, 0.02, 0.04, 0.08 (capped), 0.08
    assert fake.ready_seen == [False] * 6  # never ready while waiting (nor before reading)
    assert health.is_ready()
    waiting = [r.getMessage() for r in caplog.records if "not reachable" in r.getMessage()]
    assert len(waiting) == 5
    assert "etcd3://127.0.0.1:1" in waiting[0] and "next attempt in" in waiting[0]
    assert "attempt 5" in waiting[-1]
    assert any("reachable after" in r.getMessage() for r in caplog.records)


def test_readiness_names_the_datastore_while_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FlakyDatastore(failures=1)
    agent = _agent(monkeypatch, fake)
    health = _health()

    def check_during_wait(datastore: str, hostname: str) -> Any:
        if len(fake.calls) == 1:  # the second attempt: one failure reported so far
            state = health.summary()[DATASTORE_REPORTER]
            assert (state["live"], state["ready"]) == (True, False)
            assert not health.is_ready()
        return fake(datastore, hostname)

    monkeypatch.setattr(daemon, "datastore_felix_config", check_during_wait)
    assert agent.wait_for_datastore_config(health) is not None


def test_stop_while_waiting_returns_promptly(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FlakyDatastore(failures=10**6)
    monkeypatch.setattr(daemon, "datastore_felix_config", fake)
    agent = Agent(AgentOptions(parse_datastore_url("etcd3://127.0.0.1:1"), "node1", environ={}),
                  startup_backoff=Backoff(initial=5.0, maximum=5.0))
    timer = threading.Timer(0.3, agent.request_stop)
    timer.start()
    started = time.monotonic()
    try:
        assert agent.wait_for_datastore_config(_health()) is None
    finally:
        timer.cancel()
    assert time.monotonic() - started < 3.0


def test_a_refusing_datastore_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FlakyDatastore(failures=1, error=DatastoreClientError("etcd: permission denied"))
    agent = _agent(monkeypatch, fake)
    with pytest.raises(DatastoreClientError, match="permission denied"):
        agent.wait_for_datastore_config(_health())
    assert len(fake.calls) == 1


def test_bad_local_config_exits_before_the_datastore_is_tried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FlakyDatastore(failures=10**6)
    agent = _agent(monkeypatch, fake, environ={"FELIX_HEALTHPORT": "70000"})
    with pytest.raises(ConfigError, match="HealthPort"):
        agent.run()
    assert fake.calls == []


class _FakeHealthServer:
    """Stands in for agent.health.HealthServer (no socket): records what was served."""

    instances: list[_FakeHealthServer] = []

    def __init__(self, aggregator: HealthAggregator, host: str, port: int,
                 **_bounds: object) -> None:
        self.aggregator, self.host, self.port = aggregator, host, port
        self.started = self.stopped = False
        _FakeHealthServer.instances.append(self)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


def test_run_stopped_while_waiting_exits_0_and_serves_readiness_503(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole `run()`: health served from the local config while waiting (not ready,
    the datastore reporter says why), a stop exits 0 and closes the health server."""
    monkeypatch.setattr(daemon, "HealthServer", _FakeHealthServer)
    _FakeHealthServer.instances = []
    fake = _FlakyDatastore(failures=10**6)
    agent = _agent(monkeypatch, fake, environ={
        "FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.9",
        "FELIX_HEALTHPORT": "9199"})
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(fake.calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        [server] = _FakeHealthServer.instances
        assert (server.host, server.port, server.started) == ("127.0.0.9", 9199, True)
        assert not server.aggregator.is_ready()
        assert server.aggregator.is_live()
        summary = server.aggregator.summary()
        assert list(summary) == [DATASTORE_REPORTER, DATAPLANE_REPORTER]
        assert (summary[DATASTORE_REPORTER]["live"], summary[DATASTORE_REPORTER]["ready"]) \
            == (True, False)
    finally:
        agent.request_stop()
        thread.join(timeout=10)
    assert result == [0]
    assert server.stopped


def test_health_moves_when_the_datastore_config_moves_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "HealthServer", _FakeHealthServer)
    _FakeHealthServer.instances = []
    agent = _agent(monkeypatch, _FlakyDatastore(failures=0), environ={
        "FELIX_HEALTHENABLED": "true", "FELIX_HEALTHPORT": "9199"})
    health = _health()
    agent._serve_health(health, agent.local_config())
    config = agent.wait_for_datastore_config(health)
    assert config is not None
    agent._serve_health(health, config)  # same address: kept
    assert len(_FakeHealthServer.instances) == 1
    moved = daemon.load_config(environ={"FELIX_HEALTHENABLED": "true"},
                               datastore_global={"HealthPort": "9299"})
    agent._serve_health(health, moved)
    first, second = _FakeHealthServer.instances
    assert first.stopped and second.started and second.port == 9299
    agent._serve_health(health, None)
    assert second.stopped


def test_etcd_client_reports_no_endpoint_answering_as_unavailable(tmp_path: Any) -> None:
    """The real etcd client (no server: unix sockets that do not exist) raises the
    retryable error the agent waits on."""
    missing = [f"unix:{tmp_path}/no-etcd-{i}:1" for i in range(2)]
    from pyfelix.agent.syncer.etcd_conn import EtcdConfig
    from pyfelix.agent.syncer.etcd_store import EtcdDatastore

    store = EtcdDatastore(EtcdConfig(tuple(missing), request_timeout=2.0))
    try:
        with pytest.raises(DatastoreUnavailable, match="cannot reach etcd"):
            store.get("FelixConfiguration", "default")
    finally:
        store.close()
    assert callable(open_datastore)


@pytest.mark.parametrize(("error", "retryable"), [
    ("unavailable", True), (503, True), (500, True), (429, True), (403, False), (401, False),
    (400, False),
])
def test_kubernetes_errors_split_into_unavailable_and_refused(error: Any,
                                                              retryable: bool) -> None:
    from pyfelix.agent.syncer.kube_api import KubeUnavailable, http_error
    from pyfelix.agent.syncer.kube_store import _client_error

    exc = (KubeUnavailable("GET https://10.0.0.1:6443/api: connection refused")
           if error == "unavailable" else http_error(error, "{}", "GET /apis/x"))
    assert isinstance(_client_error(exc), DatastoreUnavailable) is retryable
    assert isinstance(_client_error(exc), DatastoreClientError)


def test_not_ready_between_reading_the_config_and_the_dataplane_programming(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The datastore answered but the dataplane is still being built (BPF programs
    compiling) or fails to build: readiness stays 503 and names the dataplane. (It answered
    200 here before: only the datastore reporter existed until the dataplane loop's.)"""
    monkeypatch.setattr(daemon, "HealthServer", _FakeHealthServer)
    _FakeHealthServer.instances = []
    seen: list[tuple[bool, list[str]]] = []

    def failing_factory(config: Any) -> Any:
        server = _FakeHealthServer.instances[-1]
        seen.append((server.aggregator.is_ready(), server.aggregator.readiness_problems()))
        raise RuntimeError("BPF program failed to load: verifier rejected calico_from_wep")

    monkeypatch.setattr(daemon, "datastore_felix_config", _FlakyDatastore(failures=0))
    agent = Agent(AgentOptions(parse_datastore_url("etcd3://127.0.0.1:1"), "node1",
                               environ={"FELIX_HEALTHENABLED": "true",
                                        "FELIX_HEALTHPORT": "9199"}),
                  managers_factory=failing_factory)
    with pytest.raises(RuntimeError, match="failed to load"):
        agent.run()
    [(ready, problems)] = seen
    assert not ready
    assert any(p.startswith(DATAPLANE_REPORTER) for p in problems), problems

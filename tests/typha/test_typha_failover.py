"""Failing over between Typha replicas: a client moved to a replica whose own datastore
syncer is not in sync yet keeps every key it had (a partial snapshot deletes nothing) until
that replica says it is in sync; then the keys really deleted meanwhile go. The replica's
readiness (HTTP /readiness) is false until then. A server that cannot serve the client's
protocol version says so and the client moves on to the next server.

The replica held out of sync is a real TyphaServer whose file syncer is wrapped in
`HeldSyncer`: it passes on only some kinds at once and holds the rest, and IN_SYNC, until
released (a Typha whose own list of the datastore is not complete yet).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from conftest import file_syncer_factory
from test_typha_wire import fake_server  # noqa: F401 (a fixture)
from typha_testlib import CALICO, FileStore, Recorder, gnp, ippool, wait_until, wep

from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane
from pyfelix.agent.calc.pipeline import CalcPipeline
from pyfelix.agent.calc.snapshot import compute
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, ResourceKey, SyncStatus
from pyfelix.agent.typha.client import ClientState, StreamFollower
from pyfelix.agent.typha.protocol import encode_kv, encode_message, error_message

NODE = "node1"
POLICY = "GlobalNetworkPolicy"


def _kv(name: str, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    key = ResourceKey(POLICY, "", name)
    return json.loads(encode_kv(RawUpdate(key, doc if doc is not None else gnp(name))).text)


def _gone(name: str) -> dict[str, Any]:
    return json.loads(encode_kv(RawUpdate(ResourceKey(POLICY, "", name), None)).text)


def _status(status: str) -> dict[str, Any]:
    return {"type": "status", "seq": 0, "status": status}


def _connection(state: ClientState, where: str, snapshot: list[dict[str, Any]]
                ) -> StreamFollower:
    follower = StreamFollower(state, where)
    follower.handle({"type": "snapshot_begin", "seq": 0, "kv_count": len(snapshot)})
    follower.handle({"type": "kvs", "kvs": snapshot})
    follower.handle({"type": "snapshot_end", "seq": 0})
    return follower


def test_a_partial_snapshot_deletes_nothing_until_the_server_is_in_sync() -> None:
    rec = Recorder()
    state = ClientState(rec)
    state.set_status(SyncStatus.WAIT_FOR_DATASTORE)
    first = _connection(state, "typha-a", [_kv("a"), _kv("b"), _kv("c"), _kv("d")])
    first.handle(_status("in-sync"))
    assert rec.status == SyncStatus.IN_SYNC
    state.connection_lost()

    # failover to a replica still listing the datastore: it knows only a and b so far
    second = _connection(state, "typha-b", [_kv("a"), _kv("b", gnp("b", "x == 'y'"))])
    second.handle(_status("wait-for-datastore"))
    second.handle(_status("resync"))
    assert rec.deletes == []
    assert set(rec.state) == {ResourceKey(POLICY, "", n) for n in "abcd"}
    assert rec.state[ResourceKey(POLICY, "", "b")]["spec"]["selector"] == "x == 'y'"
    # the replica's list goes on: c arrives late (kept, not deleted at in-sync), a new key
    # too, and a delete the replica's own syncer saw is applied at once
    second.handle({"type": "kvs", "seq": 1, "kvs": [_kv("c"), _kv("e"), _gone("a")]})
    assert rec.deletes == [ResourceKey(POLICY, "", "a")]
    # never back to "waiting for the datastore" once data flowed; never in sync early
    assert rec.statuses == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.IN_SYNC,
                            SyncStatus.RESYNC]
    second.handle(_status("in-sync"))
    # d really was deleted while we followed the other replica
    assert rec.deletes == [ResourceKey(POLICY, "", "a"), ResourceKey(POLICY, "", "d")]
    assert set(rec.state) == {ResourceKey(POLICY, "", n) for n in "bce"}
    assert rec.statuses[-1] == SyncStatus.IN_SYNC
    assert rec.violations == []


def test_an_in_sync_snapshot_deletes_what_it_lacks_at_its_status() -> None:
    rec = Recorder()
    state = ClientState(rec)
    _connection(state, "typha-a", [_kv("a"), _kv("b")]).handle(_status("in-sync"))
    state.connection_lost()
    follower = _connection(state, "typha-b", [_kv("a")])
    follower.handle(_status("in-sync"))
    assert rec.deletes == [ResourceKey(POLICY, "", "b")]
    # later statuses of the same connection (the server relisting) delete nothing more
    follower.handle(_status("resync"))
    follower.handle({"type": "kvs", "seq": 1, "kvs": [_kv("c")]})
    follower.handle(_status("in-sync"))
    assert rec.deletes == [ResourceKey(POLICY, "", "b")]
    assert set(rec.state) == {ResourceKey(POLICY, "", "a"), ResourceKey(POLICY, "", "c")}


# --------------------------------------------------------------------------------------------
# Two real replicas, one held out of sync


class HeldSyncer:
    """Wraps a real syncer: passes on at once only updates whose key `passes`; holds the
    others, and IN_SYNC, until `release()`."""

    def __init__(self, inner: Any, passes: Any) -> None:
        self.inner = inner
        self.passes = passes
        self.lock = threading.Lock()
        self.held = True
        self.buffer: list[RawUpdate] = []
        self.held_status: SyncStatus | None = None
        self.callbacks: Any = None

    def start(self, callbacks: Any) -> None:
        self.callbacks = callbacks
        self.inner.start(self)

    def stop(self) -> None:
        self.inner.stop()

    def on_updates(self, updates: list[RawUpdate]) -> None:
        with self.lock:
            if self.held:
                self.buffer.extend(u for u in updates if not self.passes(u.key))
                updates = [u for u in updates if self.passes(u.key)]
            if updates:
                self.callbacks.on_updates(updates)

    def on_status(self, status: SyncStatus) -> None:
        with self.lock:
            if self.held and status == SyncStatus.IN_SYNC:
                self.held_status = status
                return
            self.callbacks.on_status(status)

    def on_error(self, error: DatastoreError) -> None:
        self.callbacks.on_error(error)

    def release(self) -> None:
        with self.lock:
            self.held = False
            if self.buffer:
                self.callbacks.on_updates(self.buffer)
                self.buffer = []
            if self.held_status is not None:
                self.callbacks.on_status(self.held_status)


class CalcRecorder(Recorder):
    """A Recorder that also feeds a real calc pipeline (what the dataplane gets)."""

    def __init__(self, pipeline: CalcPipeline) -> None:
        super().__init__()
        self.pipeline = pipeline

    def on_status(self, status: SyncStatus) -> None:
        super().on_status(status)
        self.pipeline.on_status(status)

    def on_updates(self, updates: list[RawUpdate]) -> None:
        super().on_updates(updates)
        self.pipeline.on_updates(updates)

    def on_error(self, error: DatastoreError) -> None:
        super().on_error(error)
        self.pipeline.on_error(error)


def _policy(name: str, selector: str, source: str) -> dict[str, Any]:
    doc = gnp(name, selector)
    doc["spec"]["ingress"] = [{"action": "Allow", "source": {"selector": source}}]
    return doc


def _seed(store: FileStore) -> None:
    for i in range(6):
        doc = wep(f"pod{i}", "shop", node=NODE if i < 4 else "node2", ip=f"10.65.0.{i + 1}",
                  labels={"role": "db" if i % 2 else "web"})
        doc["spec"]["profiles"] = ["open"]
        store.put(doc)
    store.put({"apiVersion": CALICO, "kind": "Profile", "metadata": {"name": "open"},
               "spec": {"ingress": [{"action": "Allow"}]}},
              ippool("pool", "10.65.0.0/16"),
              _policy("db-from-web", "role == 'db'", "role == 'web'"),
              _policy("web-from-all", "role == 'web'", "all()"),
              _policy("all-from-db", "all()", "role == 'db'"))


def _readiness(server: Any) -> tuple[int, dict[str, Any]]:
    host, port = server.health_address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readiness", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _expected(store: FileStore) -> dict[str, Any]:
    """What `pyfelix calc` computes from the datastore itself."""
    return compute(DatastoreLocation.file(store.root), NODE).summary


def _calc_summary(pipeline: CalcPipeline, state: ExpectedDataplane) -> dict[str, Any]:
    wait_until(pipeline.idle, "the calc pipeline idle")
    for _ in range(50):
        try:
            return state.summary()
        except RuntimeError:  # read while the pipeline thread was writing: try again
            time.sleep(0.02)
    raise AssertionError("could not read the dataplane state")


def test_failover_to_a_replica_out_of_sync_loses_no_policy(store: FileStore, start_server,
                                                           start_client) -> None:
    _seed(store)
    health = {"health_port": 0, "health_host": "127.0.0.1"}
    replica_a = start_server(**health)
    held: dict[str, HeldSyncer] = {}

    def held_replica(syncer_type: str) -> HeldSyncer:
        inner = file_syncer_factory(store.root)(syncer_type)
        held[syncer_type] = HeldSyncer(inner, lambda key: key.kind != POLICY)
        return held[syncer_type]

    replica_b = start_server(factory=held_replica, **health)
    wait_until(lambda: _readiness(replica_a)[0] == 200, "replica A ready")
    non_policies = sum(1 for key in store.state if key.kind != POLICY)
    wait_until(lambda: replica_b.caches["felix"].kv_count == non_policies,
               "replica B holding everything but the policies")
    code, body = _readiness(replica_b)
    assert code == 503
    assert body["reporters"]["typha-syncer-felix"]["ready"] is False

    state = ExpectedDataplane(strict=False)
    pipeline = CalcPipeline(NODE, state)
    pipeline.start()
    try:
        rec = CalcRecorder(pipeline)
        address_a = f"127.0.0.1:{replica_a.address[1]}"
        address_b = f"127.0.0.1:{replica_b.address[1]}"
        client, _ = start_client([address_a, address_b], recorder=rec, min_attempts=20)
        rec.wait_converged(store.expected())
        wait_until(pipeline.in_sync.is_set, "the calc graph in sync")
        before = _calc_summary(pipeline, state)
        assert before == _expected(store)
        assert any(ep["ingress"] for ep in before["endpoints"].values())

        replica_a.stop()  # e.g. a rolling update: its clients move to replica B
        wait_until(lambda: client.connected_to == address_b, "the client on replica B")
        # a new endpoint that replica B passes on: once the client has it, it has handled
        # B's (partial) snapshot and its status
        marker = wep("marker", "shop", node="node2", ip="10.65.0.99")
        store.put(marker)
        rec.wait_for(lambda r: ResourceKey("WorkloadEndpoint", "shop", "marker") in r.state,
                     "the marker endpoint through replica B")
        assert rec.deletes == [], "a partial snapshot deleted keys"
        assert rec.state == store.expected()
        first_in_sync = rec.statuses.index(SyncStatus.IN_SYNC)
        assert rec.statuses[first_in_sync + 1:] == [SyncStatus.RESYNC]
        assert _calc_summary(pipeline, state) == _expected(store)
        assert _readiness(replica_b)[0] == 503

        # meanwhile in the datastore: a policy deleted, another changed; replica B does not
        # know yet, so the client keeps what it had
        gone = ResourceKey(POLICY, "", "web-from-all")
        store.delete(gone)
        store.put(_policy("db-from-web", "role == 'db'", "role == 'nobody'"))
        wait_until(lambda: any(u.key == gone and u.value is None for u in held["felix"].buffer),
                   "replica B's syncer seeing the delete (held)")
        assert gone in rec.state and rec.deletes == []

        for syncer in held.values():
            syncer.release()
        rec.wait_converged(store.expected(), "the client after replica B's list completed")
        assert rec.deletes == [gone]
        wait_until(lambda: _readiness(replica_b)[0] == 200, "replica B ready once in sync")
        assert _calc_summary(pipeline, state) == _expected(store)
        assert rec.violations == []
    finally:
        pipeline.stop()


# --------------------------------------------------------------------------------------------
# Protocol versions


def test_a_server_refusing_the_version_is_logged_and_the_next_one_used(
        fake_server, store: FileStore, start_server, start_client,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    store.put(gnp("a"))

    def newer_typha(sock: socket.socket, hello: dict) -> None:
        assert hello["protocol_version"] == 1
        sock.sendall(encode_message(error_message(
            "unsupported-version", "protocol version 1 is not supported; this server "
                                   "speaks version 2")))

    newer = fake_server(newer_typha)
    current = start_server()
    refusing = f"127.0.0.1:{newer.address[1]}"
    serving = f"127.0.0.1:{current.address[1]}"
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.typha.client"):
        client, rec = start_client([refusing, serving])
        rec.wait_converged(store.expected())
    assert client.connected_to == serving
    assert newer.connections == 1
    refusals = [r.getMessage() for r in caplog.records if refusing in r.getMessage()]
    assert refusals == [
        f"typha client (felix): {refusing} cannot serve this client (it does not speak "
        f"protocol version 1): unsupported-version: protocol version 1 is not supported; "
        f"this server speaks version 2; trying {serving} next (attempt 1 of 6)"]

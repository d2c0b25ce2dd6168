"""Typha on a REAL etcd (Debian's etcd 3.4, started per test on loopback by the etcd tests'
`EtcdServer`): many clients converge through edits and deletes, etcd holds one watch per
syncer type whatever the number of clients, and clients converge across a Typha restart
with deletes made while it was down. Privileged (it runs etcd), so `make test-privileged`.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typha_testlib import bgp_peer, gnp, ippool, node, wep

from pyfelix.agent.kinds import BGP_KINDS
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus, key_of
from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.etcd import EtcdSyncer
from pyfelix.agent.syncer.etcd_store import EtcdDatastore
from tests.privileged.etcd.etcd_server import ETCD_BINARY, EtcdServer

pytestmark = pytest.mark.privileged


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    if not Path(ETCD_BINARY).exists():
        pytest.fail(f"{ETCD_BINARY} is missing: install Debian's etcd-server (scripts/setup.sh)")
    for attempt in range(3):  # its free ports are picked before etcd binds them: retry a race
        server = EtcdServer(tmp_path)
        try:
            server.start()
            break
        except RuntimeError:
            server.close()
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        server.close()


class EtcdStore:
    """Writes through the etcd client on the writer port and keeps the truth."""

    def __init__(self, etcd: EtcdServer) -> None:
        self.client = EtcdDatastore(etcd.writer_config())
        self.state: dict[ResourceKey, dict[str, Any]] = {}

    def put(self, *docs: dict[str, Any]) -> None:
        self.client.apply(list(docs))
        self.state.update((key_of(doc), doc) for doc in docs)

    def delete(self, *keys: ResourceKey) -> None:
        for key in keys:
            self.client.delete(key)
            del self.state[key]

    def expected(self, kinds: frozenset[str] | None = None) -> dict[ResourceKey, dict]:
        return {k: v for k, v in self.state.items() if kinds is None or k.kind in kinds}


def _syncers(etcd: EtcdServer) -> Callable[[str], EtcdSyncer]:
    return lambda _type: EtcdSyncer(etcd.config(), backoff=Backoff(0.05, 0.5),
                                    liveness_interval=1.0, liveness_timeout=1.0)


def _etcd_watchers(etcd: EtcdServer) -> float:
    """etcd's own count of watchers, from its /metrics (the datastore-side load)."""
    with urllib.request.urlopen(f"http://{etcd.writer_endpoint}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return float(line.split()[1])
    raise AssertionError("etcd reported no etcd_debugging_mvcc_watcher_total")


def _seed(store: EtcdStore) -> None:
    store.put(*(wep(f"pod{i}", f"ns{i % 3}", ip=f"10.65.0.{i + 1}") for i in range(30)))
    store.put(gnp("allow-all"), ippool("pool1", "10.65.0.0/16"), node("node1", "198.18.0.1"),
              bgp_peer("peer1", "198.18.0.254"))


def test_many_clients_one_watch_per_syncer_type(etcd: EtcdServer, start_server,
                                                start_client) -> None:
    store = EtcdStore(etcd)
    _seed(store)
    server = start_server(factory=_syncers(etcd))
    felix = [start_client(server.address) for _ in range(20)]
    bgp = [start_client(server.address, syncer_type="bgp") for _ in range(6)]
    for _, rec in felix:
        rec.wait_converged(store.expected(), "felix snapshot")
    for _, rec in bgp:
        rec.wait_converged(store.expected(BGP_KINDS), "bgp snapshot")
    # 26 clients, and etcd serves exactly one watch per syncer type
    assert _etcd_watchers(etcd) == len(server.caches) == 2

    store.put(wep("pod1", "ns1", ip="10.65.1.1", labels={"role": "db"}), gnp("deny", "a == 'b'"))
    store.delete(ResourceKey("WorkloadEndpoint", "ns0", "pod0"),
                 ResourceKey("BGPPeer", "", "peer1"))
    store.put(ippool("pool1", "10.66.0.0/16"))
    for _, rec in felix:
        rec.wait_converged(store.expected(), "felix after edits")
    for _, rec in bgp:
        rec.wait_converged(store.expected(BGP_KINDS), "bgp after edits")
    for client, rec in felix + bgp:
        assert rec.violations == []
        assert client.sessions == 1


def test_converge_across_a_typha_restart_with_deletes_meanwhile(etcd: EtcdServer,
                                                                start_server,
                                                                start_client) -> None:
    store = EtcdStore(etcd)
    _seed(store)
    server = start_server(factory=_syncers(etcd))
    port = server.address[1]
    clients = [start_client(server.address, min_attempts=50, retry_max=0.2)
               for _ in range(8)]
    for _, rec in clients:
        rec.wait_converged(store.expected(), "before the restart")
    server.stop()
    store.delete(*(ResourceKey("WorkloadEndpoint", "ns1", f"pod{i}") for i in (1, 4, 7)))
    store.delete(ResourceKey("GlobalNetworkPolicy", "", "allow-all"))
    store.put(gnp("new-policy"), wep("pod2", "ns2", ip="10.65.9.9"))
    start_server(factory=_syncers(etcd), port=port)
    for client, rec in clients:
        rec.wait_converged(store.expected(), "after the restart", timeout=30)
        assert client.sessions == 2
        assert ResourceKey("GlobalNetworkPolicy", "", "allow-all") in rec.deletes
        assert rec.violations == []
        assert SyncStatus.RESYNC in rec.statuses

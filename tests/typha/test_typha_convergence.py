"""A real Typha server on the file datastore with many clients in one process: every client
converges to the datastore's state, through edits, a server restart, and a reconnect after
missed deletes."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY
from typha_testlib import FileStore, Recorder, bgp_peer, gnp, ippool, node, wait_until, wep

from pyfelix.agent.kinds import BGP_KINDS
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus

FELIX_CLIENTS = 24
BGP_CLIENTS = 8


def _seed(store: FileStore) -> None:
    store.put(*(wep(f"pod{i}", f"ns{i % 3}", ip=f"10.65.0.{i + 1}") for i in range(40)))
    store.put(gnp("allow-all"), ippool("pool1", "10.65.0.0/16"), node("node1", "198.18.0.1"),
              bgp_peer("peer1", "198.18.0.254"))


def _metric(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_many_clients_converge_through_edits_and_deletes(store: FileStore, start_server,
                                                         start_client) -> None:
    _seed(store)
    server = start_server()
    felix = [start_client(server.address) for _ in range(FELIX_CLIENTS)]
    bgp = [start_client(server.address, syncer_type="bgp") for _ in range(BGP_CLIENTS)]
    for _, rec in felix:
        rec.wait_converged(store.expected(), "initial felix snapshot")
    for _, rec in bgp:
        rec.wait_converged(store.expected(BGP_KINDS), "initial bgp snapshot")
    assert _metric("typha_connections_active", syncer_type="felix") >= FELIX_CLIENTS
    assert _metric("typha_snapshot_size", syncer_type="felix") == len(store.state)

    # edits, adds and deletes of both BGP and non-BGP kinds
    store.put(wep("pod1", "ns1", ip="10.65.1.1", labels={"role": "db"}), gnp("deny", "x == 'y'"))
    store.delete(ResourceKey("WorkloadEndpoint", "ns0", "pod0"),
                 ResourceKey("BGPPeer", "", "peer1"))
    store.put(bgp_peer("peer2", "198.18.0.253"), ippool("pool1", "10.66.0.0/16"))
    for _, rec in felix:
        rec.wait_converged(store.expected(), "felix after edits")
    for _, rec in bgp:
        rec.wait_converged(store.expected(BGP_KINDS), "bgp after edits")
        assert ResourceKey("BGPPeer", "", "peer1") in rec.deletes
    for client, rec in felix + bgp:
        assert rec.violations == []
        assert rec.errors == []
        assert client.sessions == 1
        assert rec.statuses[-1] == SyncStatus.IN_SYNC
        assert rec.statuses[0] == SyncStatus.WAIT_FOR_DATASTORE


def test_clients_converge_across_a_server_restart_with_deletes_made_meanwhile(
        store: FileStore, start_server, start_client) -> None:
    _seed(store)
    server = start_server()
    port = server.address[1]
    clients = [start_client(server.address, min_attempts=50, retry_max=0.2)
               for _ in range(10)]
    for _, rec in clients:
        rec.wait_converged(store.expected(), "before the restart")

    server.stop()
    # while no server runs: deletes and changes nobody can be told about
    store.delete(*(ResourceKey("WorkloadEndpoint", "ns1", f"pod{i}") for i in (1, 4, 7)))
    store.delete(ResourceKey("GlobalNetworkPolicy", "", "allow-all"))
    store.put(wep("pod2", "ns2", ip="10.65.9.9"), gnp("new-policy"))
    for _, rec in clients:
        rec.wait_for(lambda r: r.status == SyncStatus.RESYNC, "resync while the server is down")

    start_server(port=port)
    for client, rec in clients:
        rec.wait_converged(store.expected(), "after the restart")
        assert client.sessions == 2
        assert ResourceKey("GlobalNetworkPolicy", "", "allow-all") in rec.deletes
        # no delete of an unknown key, and unchanged keys were not re-sent by the second
        # snapshot (the recorder flags an update that changes nothing)
        assert rec.violations == []
        assert rec.statuses[-3:] == [SyncStatus.IN_SYNC, SyncStatus.RESYNC, SyncStatus.IN_SYNC]


def test_slow_client_is_dropped_then_reconnects_and_gets_the_deletes_it_missed(
        store: FileStore, start_server, start_client) -> None:
    _seed(store)
    server = start_server(write_timeout=0.3, max_send_buffer=256 * 1024,
                          socket_send_buffer=32 * 1024)
    # the burst below is ~0.8 MB on the wire (zlib halves the hex padding). The slow client
    # stops reading, so its 32 KiB socket and the 256 KiB bound fill and it is dropped as
    # slow (within the 0.3 s write timeout: before its 2 s ping timeout would drop it for
    # another reason). The healthy one has a large receive buffer, but TCP opens its window
    # gradually, so under load a stall of this process leaves bytes queued at the server for
    # a moment: the bound (4x the 64 KiB of a failed CI run, where the healthy client was
    # dropped at 89 KiB) is its margin for that
    healthy, healthy_rec = start_client(server.address, socket_receive_buffer=8 * 1024 * 1024)
    gate = threading.Event()
    gate.set()
    slow, slow_rec = start_client(server.address, recorder=Recorder(block=gate),
                                  socket_receive_buffer=32 * 1024)
    slow_rec.wait_converged(store.expected(), "slow client's first snapshot")
    dropped_before = _metric("typha_connections_dropped_total", reason="slow")

    cache = server.caches["felix"]
    gate.clear()  # the slow client's callback now blocks: it stops reading its socket
    try:
        seq = cache.latest_seq
        store.put(wep("pod5", "ns2", ip="10.65.0.6", padding=20_000))
        wait_until(lambda: cache.latest_seq > seq, "the server logging the change")
        # a burst far bigger than both socket buffers and the send bound
        for round_ in range(8):
            seq = cache.latest_seq
            store.put(*(wep(f"big{round_}-{i}", "bulk", padding=10_000) for i in range(20)))
            wait_until(lambda seq=seq: cache.latest_seq > seq, "the server logging the burst")
        wait_until(lambda: _metric("typha_connections_dropped_total", reason="slow")
                   > dropped_before, "the server dropping the slow client", timeout=20)
        # deletes the slow client cannot see now
        gone = [ResourceKey("WorkloadEndpoint", "ns0", f"pod{i}") for i in (0, 3, 6)]
        store.delete(*gone)
        store.delete(*(key for key in list(store.state) if key.namespace == "bulk"))
        healthy_rec.wait_converged(store.expected(), "healthy client unaffected")
        assert healthy.sessions == 1
    finally:
        gate.set()
    slow_rec.wait_for(lambda r: slow.sessions >= 2, "slow client reconnecting")
    slow_rec.wait_converged(store.expected(), "slow client after reconnect")
    assert set(gone) <= set(slow_rec.deletes)
    assert slow_rec.violations == []


def test_compression_choices_all_converge(store: FileStore, start_server, start_client) -> None:
    _seed(store)
    zlib_server = start_server()
    plain_server = start_server(compression=("none",))
    cases = [
        start_client(zlib_server.address),
        start_client(zlib_server.address, compression=("none",)),
        start_client(plain_server.address),
    ]
    store.put(gnp("after-start"))
    for _, rec in cases:
        rec.wait_converged(store.expected(), "convergence")
    chosen = sorted((c["hostname"], c["syncer_type"]) for c in zlib_server.clients())
    assert len(chosen) == 2
    assert _metric("typha_snapshot_bytes", syncer_type="felix", compression="zlib") > 0
    assert _metric("typha_snapshot_bytes", syncer_type="felix", compression="none") > 0


def test_client_that_falls_out_of_the_log_is_dropped_and_converges(
        store: FileStore, start_server, start_client) -> None:
    _seed(store)
    # a tiny log, generous timeouts: the client is dropped for being BEHIND, not slow
    server = start_server(max_log_entries=3, write_timeout=20.0, pong_timeout=30.0,
                          max_send_buffer=64 * 1024, socket_send_buffer=32 * 1024)
    gate = threading.Event()
    gate.set()
    lagging, rec = start_client(server.address, recorder=Recorder(block=gate),
                                socket_receive_buffer=32 * 1024, read_timeout=30.0)
    rec.wait_converged(store.expected(), "first snapshot")
    behind_before = _metric("typha_connections_dropped_total", reason="behind")
    cache = server.caches["felix"]

    def put_and_wait(*docs: dict) -> None:
        seq = cache.latest_seq
        store.put(*docs)
        wait_until(lambda: cache.latest_seq > seq, "the server logging the write")

    gate.clear()
    try:
        put_and_wait(gnp("first"))  # the client's callback blocks on this one
        # more than the socket buffers hold: the server's writer now waits on this client...
        for i in range(20):
            put_and_wait(wep(f"big-{i}", "bulk", padding=20_000))
        # ...while the log moves on by many more entries than it keeps
        for i in range(12):
            put_and_wait(gnp(f"policy-{i}"))
        store.delete(*(key for key in list(store.state) if key.namespace == "bulk"))
    finally:
        gate.set()
    wait_until(lambda: _metric("typha_connections_dropped_total", reason="behind")
               > behind_before, "the server dropping the lagging client")
    rec.wait_converged(store.expected(), "after reconnecting")
    assert lagging.sessions >= 2
    assert rec.violations == []

"""The server's snapshot cache and bounded log, driven directly (no sockets, no threads):
any snapshot plus the entries after it rebuilds the current state."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typha_testlib import gnp, ippool, wep

from pyfelix.agent.kinds import BGP_KINDS
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of
from pyfelix.agent.typha.cache import SnapshotCache
from pyfelix.agent.typha.protocol import SERVER_MESSAGE_TYPES, FrameReader, MessageDecoder
from pyfelix.agent.typha.server import SYNCER_TYPES


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def put(*docs: dict[str, Any]) -> list[RawUpdate]:
    return [RawUpdate(key_of(doc), doc, "test") for doc in docs]


def delete(*docs: dict[str, Any]) -> list[RawUpdate]:
    return [RawUpdate(key_of(doc), None, "test") for doc in docs]


def _decode_frames(frames: list[bytes], compression: str = "none") -> list[dict[str, Any]]:
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
    decoder.compression = compression  # as after the connection's decoder_restart
    reader = FrameReader()
    messages = []
    for data in frames:
        messages += [decoder.decode(p) for p in reader.feed(data)]
    return messages


def _apply(state: dict[tuple, dict], message: dict[str, Any]) -> None:
    for entry in message.get("kvs", []):
        key = tuple(entry["k"])
        if entry["v"] is None:
            del state[key]  # a delete is only ever logged for a key that exists
        else:
            state[key] = entry["v"]


def _state_of(cache: SnapshotCache) -> dict[tuple, dict]:
    state: dict[tuple, dict] = {}
    for message in _decode_frames(cache.snapshot().frames("none")):
        _apply(state, message)
    return state


STEPS = [
    put(gnp("a"), gnp("b"), ippool("p", "10.65.0.0/16")),
    put(gnp("a", "x == 'y'")),
    delete(gnp("b")),
    put(wep("w1"), wep("w2", "ns2")),
    put(gnp("b")),
    delete(wep("w1"), ippool("p", "10.65.0.0/16")),
    put(ippool("p", "10.66.0.0/16")),
]


def test_every_snapshot_plus_later_entries_gives_the_final_state() -> None:
    clock = FakeClock()
    cache = SnapshotCache("felix", clock=clock, snapshot_reuse_seconds=0)
    cache.on_status(SyncStatus.RESYNC)
    snapshots = []
    for step in STEPS:
        snapshot = cache.snapshot()
        snapshots.append((snapshot, _decode_frames(snapshot.frames("zlib"), "zlib")))
        cache.on_updates(step)
        clock.now += 1
    cache.on_status(SyncStatus.IN_SYNC)
    final = _state_of(cache)
    assert final == {("GlobalNetworkPolicy", "", "a"): gnp("a", "x == 'y'"),
                     ("GlobalNetworkPolicy", "", "b"): gnp("b"),
                     ("WorkloadEndpoint", "ns2", "w2"): wep("w2", "ns2"),
                     ("IPPool", "", "p"): ippool("p", "10.66.0.0/16")}
    for snapshot, messages in snapshots:
        state: dict[tuple, dict] = {}
        assert messages[0] == {"type": "snapshot_begin", "seq": snapshot.seq,
                               "kv_count": snapshot.kv_count}
        for message in messages:
            _apply(state, message)
        entries = cache.entries_after(snapshot.seq, cache.latest_seq)
        assert entries is not None
        for crumb in entries:
            _apply(state, json.loads(crumb.text))
        assert state == final
    assert json.loads(entries[-1].text) == {"type": "status", "seq": cache.latest_seq,
                                            "status": "in-sync"}


def test_no_entry_for_updates_that_change_nothing() -> None:
    cache = SnapshotCache("felix")
    cache.on_updates(put(gnp("a")))
    seq = cache.latest_seq
    cache.on_updates(put(gnp("a")))  # same value, same source
    cache.on_updates(delete(gnp("never-existed")))
    cache.on_status(SyncStatus.WAIT_FOR_DATASTORE)  # the initial status again
    assert cache.latest_seq == seq


def test_big_batches_are_split_into_chunks() -> None:
    cache = SnapshotCache("felix")
    cache.on_updates(put(*(gnp(f"p{i}") for i in range(2500))))
    entries = cache.entries_after(0, cache.latest_seq)
    assert entries is not None
    assert [crumb.kv_count for crumb in entries] == [1000, 1000, 500]
    snapshot_messages = _decode_frames(cache.snapshot().frames("none"))
    assert [len(m["kvs"]) for m in snapshot_messages if m["type"] == "kvs"] == [1000, 1000, 500]


def test_log_is_bounded_and_a_reader_that_fell_off_is_told() -> None:
    cache = SnapshotCache("felix", max_log_entries=5)
    for i in range(12):
        cache.on_updates(put(gnp(f"p{i}")))
    assert cache.oldest_seq() == 8
    assert cache.entries_after(6, 12) is None  # needs entry 7: gone
    entries = cache.entries_after(7, 12)
    assert entries is not None and [c.seq for c in entries] == [8, 9, 10, 11, 12]
    limited = cache.entries_after(7, 12, max_bytes=1)
    assert limited is not None and [c.seq for c in limited] == [8]  # at least one

    by_bytes = SnapshotCache("felix", max_log_bytes=1000)
    for i in range(20):
        by_bytes.on_updates(put(gnp(f"p{i}")))
    kept = by_bytes.entries_after(by_bytes.oldest_seq() - 1, by_bytes.latest_seq)
    assert kept is not None and sum(c.size for c in kept) <= 1000
    assert len(kept) < 20


def test_snapshot_reuse_only_while_young_and_bridgeable() -> None:
    clock = FakeClock()
    cache = SnapshotCache("felix", max_log_entries=3, snapshot_reuse_seconds=1.0, clock=clock)
    cache.on_updates(put(gnp("a")))
    first = cache.snapshot()
    assert cache.snapshot() is first
    cache.on_updates(put(gnp("b")))
    assert cache.snapshot() is first  # young, and entry 2 is still in the log
    for name in ("c", "d", "e"):
        cache.on_updates(put(gnp(name)))
    assert cache.snapshot() is not first  # entry 2 left the log: no bridge
    second = cache.snapshot()
    clock.now += 1.5
    assert cache.snapshot() is not second  # too old


def test_kind_filter_and_the_bgp_kinds() -> None:
    # confd's view and Typha's bgp syncer type read the same catalogue entry
    assert {"BGPConfiguration", "BGPPeer", "BGPFilter", "Node", "IPPool", "BlockAffinity",
            "Secret", "Service", "EndpointSlice"} == BGP_KINDS
    cache = SnapshotCache("bgp", BGP_KINDS)
    cache.on_updates(put(gnp("a"), ippool("p", "10.65.0.0/16"), wep("w")))
    assert set(_state_of(cache)) == {("IPPool", "", "p")}


def test_felix_syncer_type_never_carries_secrets() -> None:
    """BGP password Secrets go to confd (the bgp syncer type) only, never to agents."""
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "bgp-secrets", "namespace": "kube-system"},
              "stringData": {"pw": "x"}}
    assert "Secret" not in SYNCER_TYPES["felix"] and "Secret" in SYNCER_TYPES["bgp"]
    felix = SnapshotCache("felix", SYNCER_TYPES["felix"])
    felix.on_updates(put(secret, ippool("p", "10.65.0.0/16")))
    assert set(_state_of(felix)) == {("IPPool", "", "p")}
    bgp = SnapshotCache("bgp", SYNCER_TYPES["bgp"], secret_namespace="kube-system")
    elsewhere = {**secret, "metadata": {"name": "bgp-secrets", "namespace": "default"}}
    bgp.on_updates(put(secret, elsewhere))
    assert set(_state_of(bgp)) == {("Secret", "kube-system", "bgp-secrets")}


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_entry_frames_decode_to_the_entry(compression: str) -> None:
    cache = SnapshotCache("felix")
    cache.on_updates(put(gnp("a")))
    (crumb,) = cache.entries_after(0, 1) or []
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
    decoder.compression = compression
    (payload,) = FrameReader().feed(crumb.frame(compression))
    assert decoder.decode(payload) == json.loads(crumb.text)
    assert crumb.frame(compression) is crumb.frame(compression)  # encoded once


def test_snapshot_status_follows_the_syncer() -> None:
    cache = SnapshotCache("felix")
    messages = _decode_frames(cache.snapshot().frames("none"))
    assert [m["type"] for m in messages] == ["snapshot_begin", "snapshot_end", "status"]
    assert messages[-1]["status"] == "wait-for-datastore"
    cache.on_status(SyncStatus.IN_SYNC)
    cache.snapshot_reuse_seconds = 0
    assert _decode_frames(cache.snapshot().frames("none"))[-1]["status"] == "in-sync"


def test_batches_merge_runs_of_kv_entries_and_keep_status_order() -> None:
    from pyfelix.agent.typha.cache import batch_frames

    cache = SnapshotCache("felix")
    cache.on_updates(put(gnp("a")))
    cache.on_updates(put(gnp("b")))
    cache.on_status(SyncStatus.IN_SYNC)
    cache.on_updates(delete(gnp("a")))
    crumbs = cache.entries_after(0, cache.latest_seq)
    assert crumbs is not None and len(crumbs) == 4
    messages = _decode_frames([batch_frames(crumbs, "zlib")], "zlib")
    assert [(m["type"], m["seq"]) for m in messages] == [("kvs", 2), ("status", 3), ("kvs", 4)]
    assert [entry["k"][2] for entry in messages[0]["kvs"]] == ["a", "b"]
    assert messages[2]["kvs"][0]["v"] is None

"""The typha benchmark's counting clients (`pyfelix.bench.typha._CountingConnection`) read
what the real server cache encodes: they find every churned endpoint's generation and write
time in the update messages, follow the snapshot without decoding it, answer pings with a
frame the server decodes, and refuse frames out of order or sequence."""

from __future__ import annotations

import time

import pytest

from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of
from pyfelix.agent.typha.cache import SnapshotCache, batch_frames
from pyfelix.agent.typha.protocol import (
    CLIENT_MESSAGE_TYPES,
    SNAPSHOT_CHUNK,
    FrameReader,
    MessageDecoder,
    decoder_restart,
    encode_message,
    server_hello,
)
from pyfelix.bench import typha as bench


class Registry:
    def __init__(self) -> None:
        self.hellos = 0
        self.in_sync = 0

    def hello(self) -> None:
        self.hellos += 1

    def synced(self) -> None:
        self.in_sync += 1


def payloads(*frames: bytes) -> list[bytes]:
    reader = FrameReader()
    return [p for data in frames for p in reader.feed(data)]


def put(*docs: dict) -> list[RawUpdate]:
    return [RawUpdate(key_of(doc), doc, "test") for doc in docs]


def loaded_cache(endpoints: int, churn: int) -> SnapshotCache:
    cache = SnapshotCache("felix")
    cache.on_updates(put(*[bench._endpoint(i) for i in range(endpoints - churn)]))
    cache.on_updates(put(*[bench._endpoint(i, churn=True) for i in range(churn)]))
    cache.on_status(SyncStatus.IN_SYNC)
    return cache


def start(connection: bench._CountingConnection, cache: SnapshotCache) -> None:
    frames = [encode_message(server_hello(syncer_type="felix", compression="zlib")),
              encode_message(decoder_restart("zlib")), *cache.snapshot().frames("zlib")]
    for payload in payloads(*frames):
        assert connection.handle(payload) is None


def test_chunk_size_matches_the_protocol() -> None:
    assert bench.SNAPSHOT_CHUNK_KVS == SNAPSHOT_CHUNK


def test_counting_client_follows_snapshot_and_reads_updates() -> None:
    cache = loaded_cache(2500, 5)  # three snapshot chunks
    callbacks = bench._BenchClient(Registry())  # type: ignore[arg-type]
    connection = bench._CountingConnection(callbacks)
    start(connection, cache)
    assert callbacks.registry.hellos == 1 and callbacks.registry.in_sync == 1
    assert connection.chunks == 3
    assert callbacks.generations == {}  # snapshot chunks are not decoded
    first = cache.latest_seq
    before = time.time()
    cache.on_updates(put(bench._endpoint(1, 7, churn=True), bench._endpoint(3, 9, churn=True)))
    cache.on_updates(put(bench._endpoint(50, 1)))  # not churned: ignored
    cache.on_updates(put(bench._endpoint(1, 8, churn=True)))
    crumbs = cache.entries_after(first, cache.latest_seq)
    assert crumbs is not None and len(crumbs) == 3
    for payload in payloads(batch_frames(crumbs, "zlib")):  # merged into one message
        connection.handle(payload)
    assert callbacks.generations == {"churn-1": 8, "churn-3": 9}
    assert len(callbacks.latencies) == 3
    for written, latency in callbacks.latencies:
        assert before - 1 <= written <= time.time() and latency >= 0
    assert connection.last_seq == cache.latest_seq


def test_counting_client_answers_pings_uncompressed() -> None:
    connection = bench._CountingConnection(bench._BenchClient(Registry()))  # type: ignore[arg-type]
    start(connection, loaded_cache(10, 2))
    (payload,) = payloads(encode_message({"type": "ping", "timestamp": 12.5}, "zlib"))
    reply = connection.handle(payload)
    assert reply is not None
    (sent,) = payloads(bench._frame_json(reply))
    message = MessageDecoder(CLIENT_MESSAGE_TYPES).decode(sent)  # the server's decoder
    assert message == {"type": "pong", "timestamp": 12.5}


def test_counting_client_refuses_out_of_order_frames() -> None:
    cache = loaded_cache(10, 2)
    connection = bench._CountingConnection(bench._BenchClient(Registry()))  # type: ignore[arg-type]
    start(connection, cache)
    seq = connection.last_seq
    stale = encode_message({"type": "kvs", "seq": seq, "kvs": []}, "zlib")
    with pytest.raises(ValueError, match="seq"):
        connection.handle(payloads(stale)[0])
    early = bench._CountingConnection(bench._BenchClient(Registry()))  # type: ignore[arg-type]
    for payload in payloads(encode_message(server_hello(syncer_type="felix", compression="none")),
                            encode_message({"type": "kvs", "kvs": []})):
        try:
            early.handle(payload)
        except ValueError as exc:
            assert "snapshot chunk" in str(exc)
            break
    else:
        pytest.fail("a snapshot chunk before snapshot_begin was accepted")


def test_counting_client_treats_refusals_as_retryable_only_when_they_are() -> None:
    for code, error in (("server-full", ConnectionError), ("unsupported-version", ValueError)):
        connection = bench._CountingConnection(bench._BenchClient(Registry()))  # type: ignore[arg-type]
        (payload,) = payloads(encode_message({"type": "error", "code": code, "message": "x"}))
        with pytest.raises(error):
            connection.handle(payload)

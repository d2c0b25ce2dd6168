"""Protocol behaviour over real sockets: version and syncer-type mismatch, ping and read
timeouts, compression negotiation and mid-stream switches, malformed frames (clear error,
connection closed, server unaffected), the connection limit.

Server-side cases use a real TyphaServer and a hand-driven RawClient; client-side cases use
a real TyphaSyncer against a scripted fake server.
"""

from __future__ import annotations

import json
import socket
import threading
import zlib
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY
from typha_testlib import (
    FileStore,
    RawClient,
    Recorder,
    frame_bytes,
    gnp,
    json_frame,
    wait_until,
)

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, SyncStatus
from pyfelix.agent.typha.protocol import (
    FrameReader,
    MessageDecoder,
    client_hello,
    decoder_restart,
    encode_kv,
    encode_message,
    kvs_text,
    server_hello,
)


def _dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("typha_connections_dropped_total", {"reason": reason}) or 0.0


def _expect_error(raw: RawClient, code: str, text: str) -> None:
    messages = raw.messages_until("error", limit=100)
    error = messages[-1]
    assert error["code"] == code, error
    assert text in error["message"], error
    assert raw.closed_by_server()


# --------------------------------------------------------------------------------------------
# Hello: versions and syncer types


def test_unsupported_version_gets_an_error_and_close(store: FileStore, start_server) -> None:
    server = start_server()
    raw = RawClient(server.address)
    reply = raw.hello(version=99)
    assert reply == {"type": "error", "code": "unsupported-version", "message":
                     "protocol version 99 is not supported; this server speaks version 1"}
    assert raw.closed_by_server()


def test_unknown_syncer_type_names_the_served_ones(store: FileStore, start_server) -> None:
    server = start_server(syncer_types=("felix",))
    raw = RawClient(server.address)
    reply = raw.hello("bgp")
    assert reply["code"] == "unknown-syncer-type"
    assert reply["message"] == "syncer type 'bgp' is not served here; this server serves felix"
    assert raw.closed_by_server()


def test_client_gives_up_on_a_server_refusing_its_version(store: FileStore, start_server,
                                                          start_client) -> None:
    server = start_server()
    client, rec = start_client(server.address, protocol_version=99, retry_initial=0.01)
    assert client.failed.wait(10)
    assert client.sessions == 0
    assert len(rec.errors) == 1
    message = rec.errors[0].message
    assert "after 6 attempts" in message
    assert "unsupported-version: protocol version 99 is not supported" in message
    assert rec.statuses == [SyncStatus.WAIT_FOR_DATASTORE]


class FakeServer:
    """A scripted Typha server: runs `script(sock, decoder)` for each of up to `limit`
    connections, in a thread; counts connections."""

    def __init__(self, script: Callable[[socket.socket, dict], None], limit: int = 20) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.address = self.listener.getsockname()
        self.script = script
        self.limit = limit
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and self.connections < self.limit:
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with sock:
                sock.settimeout(5)
                try:
                    hello = _read_one(sock)
                    self.script(sock, hello)
                except (OSError, EOFError):
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


def _read_one(sock: socket.socket) -> dict:
    reader = FrameReader()
    decoder = MessageDecoder(frozenset({"client_hello", "pong"}))
    while True:
        data = sock.recv(65536)
        if not data:
            raise EOFError
        payloads = reader.feed(data)
        if payloads:
            return decoder.decode(payloads[0])


@pytest.fixture
def fake_server():
    servers: list[FakeServer] = []

    def make(script: Callable[[socket.socket, dict], None], limit: int = 20) -> FakeServer:
        server = FakeServer(script, limit)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def test_client_refuses_a_server_answering_for_another_syncer_type(fake_server,
                                                                   start_client) -> None:
    def answer_felix(sock: socket.socket, hello: dict) -> None:
        sock.sendall(encode_message(server_hello(syncer_type="felix", compression="none")))
        sock.recv(10)

    server = fake_server(answer_felix)
    client, rec = start_client(server.address, syncer_type="bgp", retry_initial=0.01)
    assert client.failed.wait(10)
    assert server.connections == 6
    assert "server answered for syncer type 'felix'; this client asked for 'bgp'" in \
        rec.errors[0].message


# --------------------------------------------------------------------------------------------
# Keepalive


def test_server_drops_a_client_that_never_pongs(store: FileStore, start_server) -> None:
    server = start_server(ping_interval=0.1, pong_timeout=0.5)
    before = _dropped("ping-timeout")
    raw = RawClient(server.address)
    assert raw.hello()["type"] == "server_hello"
    messages = raw.messages_until("error", limit=1000)
    assert any(m["type"] == "ping" for m in messages)
    assert messages[-1]["code"] == "ping-timeout"
    assert messages[-1]["message"] == "no pong within 0.5 s"
    assert raw.closed_by_server()
    assert _dropped("ping-timeout") == before + 1


def test_a_client_that_pongs_stays_connected(store: FileStore, start_server) -> None:
    server = start_server(ping_interval=0.05, pong_timeout=0.3)
    raw = RawClient(server.address)
    raw.hello()
    pings = 0
    while pings < 15:  # well past several pong timeouts
        message = raw.message()
        assert message["type"] != "error", message
        if message["type"] == "ping":
            pings += 1
            raw.send({"type": "pong", "timestamp": message["timestamp"]})
    raw.close()


def test_client_reconnects_when_the_server_goes_silent(fake_server, start_client) -> None:
    def silent_after_snapshot(sock: socket.socket, hello: dict) -> None:
        sock.sendall(encode_message(server_hello(syncer_type="felix", compression="none"))
                     + encode_message({"type": "snapshot_begin", "seq": 0, "kv_count": 0})
                     + encode_message({"type": "snapshot_end", "seq": 0})
                     + encode_message({"type": "status", "seq": 0, "status": "in-sync"}))
        sock.settimeout(3)
        sock.recv(10)  # then nothing, until the client gives up on us

    server = fake_server(silent_after_snapshot, limit=3)
    client, rec = start_client(server.address, read_timeout=0.3)
    rec.wait_for(lambda r: client.sessions >= 2, "a second session")
    assert rec.statuses[:4] == [SyncStatus.WAIT_FOR_DATASTORE, SyncStatus.IN_SYNC,
                                SyncStatus.RESYNC, SyncStatus.IN_SYNC]


# --------------------------------------------------------------------------------------------
# Compression


def test_zlib_is_negotiated_and_switched_on_with_a_decoder_restart(store: FileStore,
                                                                   start_server) -> None:
    store.put(gnp("a"), gnp("b"))
    server = start_server()
    raw = RawClient(server.address)
    raw.send(client_hello(hostname="h", syncer_type="felix", compression=["zlib", "none"]))
    hello = json.loads(raw.payload())  # plain JSON
    assert hello["type"] == "server_hello" and hello["compression"] == "zlib"
    assert json.loads(raw.payload()) == {"type": "decoder_restart", "compression": "zlib"}
    compressed = raw.payload()
    with pytest.raises(ValueError):
        json.loads(compressed)
    assert json.loads(zlib.decompress(compressed))["type"] == "snapshot_begin"


def test_no_compression_when_the_client_offers_none(store: FileStore, start_server) -> None:
    server = start_server()
    raw = RawClient(server.address)
    raw.send(client_hello(hostname="h", syncer_type="felix", compression=["none"]))
    assert json.loads(raw.payload())["compression"] == "none"
    assert json.loads(raw.payload())["type"] == "snapshot_begin"


def test_client_follows_compression_switches_mid_stream(fake_server, start_client) -> None:
    docs = {name: gnp(name) for name in ("a", "b", "c", "d")}

    def kvs(*names: str, compression: str) -> bytes:
        fragments = [encode_kv(RawUpdate(ResourceKey("GlobalNetworkPolicy", "", n),
                                         docs[n])).text for n in names]
        return frame_bytes(zlib.compress(kvs_text(fragments).encode())
                           if compression == "zlib" else kvs_text(fragments).encode())

    def switching(sock: socket.socket, hello: dict) -> None:
        assert hello["compression"] == ["zlib", "none"]
        sock.sendall(
            encode_message(server_hello(syncer_type="felix", compression="zlib"))
            + encode_message(decoder_restart("zlib"))
            + encode_message({"type": "snapshot_begin", "seq": 5, "kv_count": 1}, "zlib")
            + kvs("a", compression="zlib")
            + encode_message({"type": "snapshot_end", "seq": 5}, "zlib")
            + encode_message({"type": "status", "seq": 5, "status": "in-sync"}, "zlib")
            + encode_message(decoder_restart("none"), "zlib")
            + kvs("b", compression="none")
            + encode_message(decoder_restart("zlib"))
            + kvs("c", "d", compression="zlib"))
        sock.recv(10)

    server = fake_server(switching, limit=1)
    _, rec = start_client(server.address)
    rec.wait_converged({ResourceKey("GlobalNetworkPolicy", "", n): d for n, d in docs.items()})


# --------------------------------------------------------------------------------------------
# Malformed input: clear error, connection closed, server unaffected

MALFORMED = {
    "oversized frame": (b"\x7f\xff\xff\xff", "malformed",
                        "frame 1 announces 2147483647 bytes, over the limit of 65536"),
    "invalid JSON": (frame_bytes(b"{nope"), "malformed", "message 1 is not valid UTF-8 JSON"),
    "not UTF-8": (frame_bytes(b"\xc3\x28"), "malformed", "not valid UTF-8 JSON"),
    "JSON list": (json_frame([1, 2]), "malformed", "message 1 is a JSON list, not an object"),
    "no type": (json_frame({"hello": 1}), "malformed", "has no string field 'type'"),
    "server message type": (json_frame({"type": "kvs"}), "malformed",
                            "unexpected type 'kvs'"),
    "pong before hello": (json_frame({"type": "pong"}), "bad-hello",
                          "the first message must be client_hello, got 'pong'"),
    "hello without syncer type": (json_frame({"type": "client_hello", "protocol_version": 1}),
                                  "bad-hello", "field 'syncer_type' is missing"),
    "hello with a string version": (
        json_frame({"type": "client_hello", "protocol_version": "1", "syncer_type": "felix"}),
        "bad-hello", "field 'protocol_version' is missing or not a int"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_first_frame(case: str, store: FileStore, start_server,
                               start_client) -> None:
    data, code, text = MALFORMED[case]
    store.put(gnp("a"))
    server = start_server()
    bystander, rec = start_client(server.address)
    rec.wait_converged(store.expected())
    raw = RawClient(server.address)
    raw.send_raw(data)
    _expect_error(raw, code, text)
    _server_still_serves(server, store, rec)
    assert bystander.sessions == 1


@pytest.mark.parametrize("after_hello", ["garbage", "second hello", "truncated"])
def test_malformed_frame_after_the_hello(after_hello: str, store: FileStore, start_server,
                                         start_client) -> None:
    server = start_server()
    bystander, rec = start_client(server.address)
    rec.wait_converged(store.expected())
    raw = RawClient(server.address)
    assert raw.hello()["type"] == "server_hello"
    if after_hello == "garbage":
        raw.send_raw(frame_bytes(b"\x00\x01garbage"))
        _expect_error(raw, "malformed", "message 2 is not valid UTF-8 JSON")
    elif after_hello == "second hello":
        raw.send(client_hello(hostname="h", syncer_type="felix", compression=[]))
        _expect_error(raw, "malformed", "unexpected 'client_hello' after the hello")
    else:
        raw.send_raw(b"\x00\x00\x01\x00" + b"{" * 10)  # 10 of 256 bytes, then gone
        raw.sock.shutdown(socket.SHUT_WR)
        assert raw.closed_by_server()
    _server_still_serves(server, store, rec)
    assert bystander.sessions == 1


def _server_still_serves(server, store: FileStore, rec: Recorder) -> None:
    store.put(gnp("after-the-bad-client"))
    rec.wait_converged(store.expected(), "the bystander client's update")
    fresh = RawClient(server.address)
    assert fresh.hello()["type"] == "server_hello"
    assert fresh.message()["type"] == "snapshot_begin"
    fresh.close()


def test_connection_limit(store: FileStore, start_server) -> None:
    server = start_server(max_connections=1)
    first = RawClient(server.address)
    first.hello()
    wait_until(lambda: server.client_count == 1, "the first client counted")
    second = RawClient(server.address)
    second_reply = second.message()
    assert second_reply["code"] == "server-full"
    assert second_reply["message"] == "the server already has 1 clients (its limit)"
    assert second.closed_by_server()


@pytest.mark.parametrize(("batch_delay", "expected"), [
    (0.0, [["a"], ["b"], ["c"]]),
    (1.0, [["a", "b", "c"]]),
])
def test_updates_close_together_share_one_message(batch_delay: float, expected: list,
                                                  store: FileStore, start_server) -> None:
    server = start_server(batch_delay=batch_delay)
    cache = server.caches["felix"]
    wait_until(lambda: cache.status == SyncStatus.IN_SYNC, "the server in sync")
    raw = RawClient(server.address)
    raw.hello()
    raw.messages_until("status")  # the snapshot
    for name in ("a", "b", "c"):
        seq = cache.latest_seq
        store.put(gnp(name))
        wait_until(lambda seq=seq: cache.latest_seq > seq, "the server logging the write")
        if not batch_delay:  # each one is sent before the next is written
            message = raw.message()
            while message["type"] != "kvs":
                message = raw.message()
            assert [entry["k"][2] for entry in message["kvs"]] == [name]
    if batch_delay:
        message = raw.message()
        while message["type"] != "kvs":
            message = raw.message()
        assert [[entry["k"][2] for entry in message["kvs"]]] == expected
        assert message["seq"] == cache.latest_seq  # one message for three log entries


def test_a_flush_writes_one_shared_message_to_every_caught_up_client(
        store: FileStore, start_server) -> None:
    """Caught-up clients are written by the fan-out's flush itself (`direct_writes`), one
    write each, with the same merged message (per compression) for all of them."""
    server = start_server(batch_delay=0.5)
    cache = server.caches["felix"]
    fanout = server.fanouts["felix"]
    wait_until(lambda: cache.status == SyncStatus.IN_SYNC, "the server in sync")
    clients = [RawClient(server.address) for _ in range(12)]
    for index, raw in enumerate(clients):
        raw.hello(compression=("zlib",) if index % 2 else ("none",))
        raw.messages_until("status")  # the snapshot
    wait_until(lambda: server.client_count == 12, "every client counted")
    before = fanout.direct_writes
    for name in ("a", "b"):  # two log entries within one batch_delay
        seq = cache.latest_seq
        store.put(gnp(name))
        wait_until(lambda seq=seq: cache.latest_seq > seq, "the server logging the write")
    for raw in clients:
        message = raw.message()
        while message["type"] != "kvs":
            message = raw.message()
        assert [entry["k"][2] for entry in message["kvs"]] == ["a", "b"]
        assert message["seq"] == cache.latest_seq
    assert fanout.direct_writes - before == 12
    for raw in clients:
        raw.close()

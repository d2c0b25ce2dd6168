"""Fuzzing the Typha wire (hypothesis, derandomized and bounded: 4,600 cases, ~20 s).

Properties:
- the frame decoder (`FrameReader` + `MessageDecoder`) raises nothing but ProtocolError, with
  a short clear text, whatever bytes arrive in whatever chunks;
- the client's handling of a server's stream (`ClientConnection`: hello check, snapshot,
  deltas, statuses, pings, errors) raises nothing but ProtocolError / HelloRefused /
  ServerClosed, and whatever it accepted leaves its callbacks consistent (no delete of an
  unknown key, no unchanged update, keys and values well-typed, what it remembers equal to
  what its callbacks hold) and its replies encodable;
- the client's quick check of a KV entry accepts exactly what the strict `decode_kv` does;
- end to end, a real `TyphaSyncer` fed bad streams by a scripted server counts each bad
  frame, drops the connection, reconnects, and converges on the next good stream; nothing
  escapes to its error callback.

Streams are built from realistic sessions (hello, snapshot, deltas, statuses) with messages
and fields replaced by junk, raw junk frames, nesting bombs, bad zlib and bad lengths, then
mutated at the byte level and cut into random chunks.
"""

from __future__ import annotations

import itertools
import json
import socket
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from test_typha_wire import fake_server  # noqa: F401 (a fixture)
from typha_testlib import Recorder, frame_bytes, gnp

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey
from pyfelix.agent.typha.client import ClientConnection, ClientState, HelloRefused, ServerClosed
from pyfelix.agent.typha.protocol import (
    FRAME_HEADER,
    MAX_ERROR_CHARS,
    SERVER_MESSAGE_TYPES,
    FrameReader,
    MessageDecoder,
    ProtocolError,
    decode_kv,
    encode_kv,
    encode_message,
    server_hello,
)

MAX_FRAME = 1024 * 1024  # the client's frame limit in these tests (the real one is 64 MiB)
FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# --------------------------------------------------------------------------------------------
# Strategies

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "in-sync", "resync", "wait-for-datastore", "zlib", "none", "kvs",
                     "felix", "GlobalNetworkPolicy", "snapshot_begin", "\u00e9", "\x00"]),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=8,
)
names = st.sampled_from(["a", "b", "c", "d", "e"])
kinds = st.sampled_from(["GlobalNetworkPolicy", "WorkloadEndpoint", "IPPool"])
small = st.integers(0, 9)
bits = st.booleans()
KV_FIELDS = st.sampled_from(["k", "v", "f", "r", "s"])
KV_FIELD_JUNK = st.one_of(
    junk, st.text(min_size=3, max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=3), scalars, min_size=3, max_size=3),
    st.lists(st.text(max_size=3), min_size=3, max_size=3))


def _nested(depth: int, inner: str = "0") -> str:
    return "[" * depth + inner + "]" * depth


# built once: drawing them must be cheap
BOMBS = [text.encode() for depth in (999, 1001, 5000, 100_000) for text in (
    _nested(depth), '{"type": "kvs", "kvs": [' + _nested(depth, "{}") + "]}")]
DEEP = [_nested(depth) for depth in (100, 500, 900, 990)]
DEEP_FIELDS = [
    '{"type": "ping", "timestamp": %s}', '{"type": "error", "code": %s}',
    '{"type": "status", "seq": 1, "status": %s}', '{"type": "kvs", "kvs": %s}',
    '{"type": "server_hello", "protocol_version": %s}',
    '{"type": "decoder_restart", "compression": %s}']
ZLIB_BOMB = zlib.compress(b'{"type": "ping", "pad": "' + b"0" * 3_000_000 + b'"}')
BAD_LENGTHS = [0, MAX_FRAME + 1, 2**32 - 1]


@st.composite
def kv_entries(draw: st.DrawFn) -> Any:
    """A KV entry: valid (value or delete), with one field replaced or removed, or junk."""
    kind, name = draw(kinds), draw(names)
    value = [None, gnp(name), gnp(name, "x == 'y'")][draw(st.integers(0, 2))]
    entry = json.loads(encode_kv(RawUpdate(ResourceKey(kind, "", name), value)).text)
    choice = draw(small)
    if choice <= 4:
        return entry
    if choice <= 7:
        field = draw(KV_FIELDS)
        if draw(bits):
            entry.pop(field, None)
        else:
            entry[field] = draw(KV_FIELD_JUNK)
        return entry
    return draw(junk)


def _good_entry(kind: str, name: str, value_choice: int) -> dict[str, Any]:
    value = [gnp(name), gnp(name, "x == 'y'"), None][value_choice]
    return json.loads(encode_kv(RawUpdate(ResourceKey(kind, "", name), value)).text)


KV_ENTRIES = kv_entries()
KV_LISTS = st.lists(KV_ENTRIES, max_size=4)  # some broken
SNAPSHOT_LISTS = st.lists(st.builds(_good_entry, kinds, names, st.integers(0, 1)), max_size=4)
UPDATE_LISTS = st.lists(st.builds(_good_entry, kinds, names, st.integers(0, 2)), max_size=4)
LIVE = st.one_of(
    st.builds(lambda e: {"type": "kvs", "seq": 4, "kvs": e}, UPDATE_LISTS),
    st.builds(lambda s: {"type": "status", "seq": 4, "status": s},
              st.sampled_from(["in-sync", "resync", "wait-for-datastore"])),
    st.builds(lambda t: {"type": "ping", "timestamp": t}, junk),
    st.builds(lambda c: {"type": "decoder_restart", "compression": c},
              st.sampled_from(["zlib", "none"])),
    st.builds(lambda c, m: {"type": "error", "code": c, "message": m}, junk, junk))
HELLO_COMPRESSION = st.sampled_from(["none", "zlib"])
MESSAGE_TYPES = sorted(SERVER_MESSAGE_TYPES)
REPLACEMENTS = st.one_of(junk, st.sampled_from([*MESSAGE_TYPES, "client_hello", "pong", "x"]))
TYPES = st.sampled_from(MESSAGE_TYPES)
EXTRA_FIELDS = st.dictionaries(st.text(max_size=6), junk, max_size=3)
PERCENT = st.integers(0, 99)
SNAPSHOT_STATUS = st.sampled_from(["in-sync", "in-sync", "resync", "wait-for-datastore"])
FAULT_RATES = st.sampled_from([0, 5, 20, 60])  # percent of a stream's messages broken
DAMAGE = st.sampled_from([0, 0, 0, 1, 2])  # byte-level changes to a stream


def _message(draw: st.DrawFn, stage: str, broken: bool) -> Any:
    """A message a server might send at `stage`, or (`broken`) something wrong instead."""
    good: dict[str, Any]
    if stage == "hello":
        good = server_hello(syncer_type="felix", compression=draw(HELLO_COMPRESSION))
    elif stage == "begin":
        good = {"type": "snapshot_begin", "seq": 3, "kv_count": 2}
    elif stage == "snapshot":
        good = {"type": "kvs", "kvs": draw(KV_LISTS if broken else SNAPSHOT_LISTS)}
    elif stage == "end":
        good = {"type": "snapshot_end", "seq": 3}
    elif stage == "status":
        good = {"type": "status", "seq": 3, "status": draw(SNAPSHOT_STATUS)}
    else:
        good = draw(LIVE)
    if not broken:
        return good
    choice = draw(small)
    if choice <= 2 and stage in ("snapshot", "live") and good["type"] == "kvs":
        return {**good, "kvs": draw(KV_LISTS)}  # some entries broken
    if choice <= 5:  # one field replaced
        field = sorted(good)[draw(st.integers(0, len(good) - 1))]
        return {**good, field: draw(REPLACEMENTS)}
    if choice <= 6:
        return draw(junk)
    if choice <= 7:
        return draw(LIVE)  # a message out of place (or not)
    return {"type": draw(TYPES), **draw(EXTRA_FIELDS)}


def _frame(draw: st.DrawFn, message: Any, compression: str, broken: bool) -> bytes:
    """`message` as a frame encoded as announced, or (`broken`) a bad or raw one."""
    choice = draw(small) if broken else 0
    if choice <= 4:
        text = json.dumps(message).encode()
        if choice in (1, 2):  # the wrong compression
            compression = "none" if compression == "zlib" else "zlib"
        payload = zlib.compress(text) if compression == "zlib" else text
        return frame_bytes(payload or b"{")
    if choice == 5:  # a nesting bomb, whole or in a field
        payload = BOMBS[draw(st.integers(0, len(BOMBS) - 1))]
        return frame_bytes(zlib.compress(payload) if compression == "zlib" else payload)
    if choice == 6:  # a deep but parseable structure where a scalar belongs
        inner = DEEP[draw(st.integers(0, len(DEEP) - 1))]
        template = DEEP_FIELDS[draw(st.integers(0, len(DEEP_FIELDS) - 1))]
        payload = (template % inner).encode()
        return frame_bytes(zlib.compress(payload) if compression == "zlib" else payload)
    if choice == 7:  # zlib trouble: truncated, or a small bomb
        if draw(bits):
            return frame_bytes(zlib.compress(json.dumps(message).encode())[:-3] or b"x")
        return frame_bytes(ZLIB_BOMB)
    if choice == 8:  # a bad length
        return FRAME_HEADER.pack(BAD_LENGTHS[draw(st.integers(0, len(BAD_LENGTHS) - 1))])
    return frame_bytes(draw(st.binary(min_size=1, max_size=64)))


@st.composite
def server_streams(draw: st.DrawFn) -> bytes:
    """A server's side of one connection: hello, a snapshot, then anything; mutated."""
    stages = ["hello", "begin", *["snapshot"] * draw(st.integers(0, 3)), "end", "status",
              *["live"] * draw(st.integers(0, 8))]
    stages = stages[:draw(st.integers(1, len(stages)))]
    rate = draw(FAULT_RATES)
    compression = "none"
    out = []
    for stage in stages:
        stage_rate = rate // 4 if stage == "hello" else rate  # most get past the hello
        message = _message(draw, stage, draw(PERCENT) < stage_rate)
        out.append(_frame(draw, message, compression, draw(PERCENT) < stage_rate))
        if isinstance(message, dict) and message.get("type") == "decoder_restart" and \
                message.get("compression") in ("zlib", "none"):
            compression = message["compression"]  # what a sender would do next
    stream = bytearray(b"".join(out))
    for _ in range(draw(DAMAGE)):  # byte-level damage
        if not stream:
            break
        at = draw(st.integers(0, len(stream) - 1))
        action = draw(st.integers(0, 2))
        if action == 0:
            stream[at] ^= draw(st.integers(1, 255))
        elif action == 1:
            del stream[at:]
        else:
            stream[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(stream)


STREAMS = server_streams()
CUTS = st.lists(st.integers(0, 10**6), max_size=6)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [data]


def _clear(exc: Exception) -> None:
    text = str(exc)
    assert text, f"{type(exc).__name__} without a message"
    assert len(text) <= MAX_ERROR_CHARS, f"error text of {len(text)} characters"


# --------------------------------------------------------------------------------------------
# The frame decoder


@settings(FUZZ, max_examples=1500)
@given(stream=STREAMS, cuts=CUTS, raw=st.binary(max_size=200), use_raw=st.integers(0, 4))
def test_the_frame_decoder_raises_only_protocol_errors(stream: bytes, cuts: list[int],
                                                       raw: bytes, use_raw: int) -> None:
    data = raw if use_raw == 0 else stream
    reader = FrameReader(MAX_FRAME)
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES, max_message_bytes=MAX_FRAME * 2)
    try:
        for chunk in _chunks(data, cuts):
            for payload in reader.feed(chunk):
                message = decoder.decode(payload)
                assert isinstance(message, dict)
                assert message["type"] in SERVER_MESSAGE_TYPES
    except ProtocolError as exc:
        _clear(exc)


# --------------------------------------------------------------------------------------------
# The client's handling of a stream


def _primed_state() -> tuple[ClientState, Recorder]:
    """A client that followed another server before: keys it would delete if it believed a
    partial snapshot."""
    rec = Recorder()
    state = ClientState(rec)
    state.apply([json.loads(encode_kv(RawUpdate(ResourceKey(kind, "", name), gnp(name))).text)
                 for kind in ("GlobalNetworkPolicy", "IPPool") for name in ("a", "d")], None)
    state.connection_lost()
    return state, rec


def _check_consistent(state: ClientState, rec: Recorder) -> None:
    # The client dedupes by the server's fingerprint (`f`): a fuzzed stream may send one
    # value under two fingerprints, which a real server never does, and the client then
    # passes on a redundant (harmless) update. Everything else is a real violation.
    assert [v for v in rec.violations if not v.startswith("unchanged update")] == []
    for key, value in rec.state.items():
        assert type(key) is ResourceKey
        assert all(type(part) is str for part in (key.kind, key.namespace, key.name))
        assert key.kind and key.name
        assert type(value) is dict
    assert set(state.emitted) == {(k.kind, k.namespace, k.name) for k in rec.state}


@settings(FUZZ, max_examples=2100)
@given(stream=STREAMS, cuts=CUTS)
def test_the_client_survives_any_server_stream(stream: bytes, cuts: list[int]) -> None:
    state, rec = _primed_state()
    connection = ClientConnection(state, "fuzz", syncer_type="felix", offered=("zlib", "none"),
                                  max_frame_bytes=MAX_FRAME)
    try:
        for chunk in _chunks(stream, cuts):
            for reply in connection.feed(chunk):
                assert reply["type"] == "pong"
                encode_message(reply)  # what the syncer sends back must encode
    except (ProtocolError, HelloRefused, ServerClosed) as exc:
        _clear(exc)
    _check_consistent(state, rec)


@settings(FUZZ, max_examples=1000)
@given(entry=KV_ENTRIES, delete_known=bits)
def test_the_quick_kv_check_accepts_what_decode_kv_accepts(entry: Any,
                                                           delete_known: bool) -> None:
    try:
        strict = decode_kv(entry, "entry")
    except ProtocolError:
        strict = None
    rec = Recorder()
    state = ClientState(rec)
    if strict is not None and strict.value is None and delete_known:
        state.emitted[strict.key] = "known"
        rec.state[ResourceKey(*strict.key)] = {}
    try:
        state.apply([entry], None)
    except ProtocolError as exc:
        assert strict is None, f"the quick path refused what decode_kv accepts: {exc}"
        return
    assert strict is not None, f"the quick path accepted what decode_kv refuses: {entry!r}"
    if strict.value is None:
        expected = [RawUpdate(ResourceKey(*strict.key), None, strict.source, strict.revision)]
        assert rec.deletes == ([ResourceKey(*strict.key)] if delete_known else [])
        assert (rec.update_count == 1) == delete_known
        if delete_known:
            assert expected[0].key not in rec.state
    else:
        assert rec.state == {ResourceKey(*strict.key): strict.value}


# --------------------------------------------------------------------------------------------
# End to end: a real client, a scripted server sending bad streams, one per connection

GOOD_HELLO = encode_message(server_hello(syncer_type="felix", compression="none"))


def _msg(message: dict[str, Any]) -> bytes:
    return encode_message(message)


def _kvs(*entries: Any) -> bytes:
    return _msg({"type": "kvs", "kvs": list(entries)})


def _entry(name: str) -> dict[str, Any]:
    return json.loads(encode_kv(RawUpdate(ResourceKey("GlobalNetworkPolicy", "", name),
                                          gnp(name))).text)


SNAPSHOT_START = GOOD_HELLO + _msg({"type": "snapshot_begin", "seq": 1, "kv_count": 1})
IN_SYNC = _msg({"type": "snapshot_end", "seq": 1}) + _msg(
    {"type": "status", "seq": 1, "status": "in-sync"})
BAD_STREAMS = {
    "nesting bomb": SNAPSHOT_START + frame_bytes(_nested(5000).encode()),
    "nesting bomb in a field": SNAPSHOT_START + frame_bytes(
        b'{"type": "kvs", "kvs": [' + _nested(3000, "{}").encode() + b"]}"),
    "deep kvs field": SNAPSHOT_START + frame_bytes(
        b'{"type": "kvs", "kvs": ' + _nested(950).encode() + b"}"),
    "key as a string": SNAPSHOT_START + _kvs({**_entry("a"), "k": "abc"}),
    "key as an object": SNAPSHOT_START + _kvs({**_entry("a"), "k": {"x": 1, "y": 2, "z": 3}}),
    "delete in a snapshot": SNAPSHOT_START + _kvs({**_entry("a"), "v": None, "f": None}),
    "status before the snapshot ended": SNAPSHOT_START + _msg(
        {"type": "status", "seq": 1, "status": "in-sync"}),
    "oversized frame": SNAPSHOT_START + FRAME_HEADER.pack(2**32 - 1),
    "bad zlib": GOOD_HELLO + _msg({"type": "decoder_restart", "compression": "zlib"})
    + frame_bytes(b"not zlib"),
    "unknown compression": GOOD_HELLO + _msg({"type": "decoder_restart",
                                              "compression": "lz4"}),
    "not UTF-8": SNAPSHOT_START + frame_bytes(b"\xc3\x28"),
    "client message type": SNAPSHOT_START + _msg({"type": "pong"}),
    "kvs before the snapshot": GOOD_HELLO + _kvs(_entry("a")),
    "deep ping timestamp, then garbage": SNAPSHOT_START + _kvs(_entry("a")) + IN_SYNC
    + frame_bytes(b'{"type": "ping", "timestamp": ' + _nested(900).encode() + b"}")
    + frame_bytes(b"\x00garbage"),
}


def _protocol_errors() -> float:
    return REGISTRY.get_sample_value("pyfelix_typha_client_protocol_errors_total",
                                     {"syncer_type": "felix"}) or 0.0


def test_a_real_client_counts_bad_frames_reconnects_and_converges(
        fake_server, start_client) -> None:  # noqa: F811
    streams = list(BAD_STREAMS.values())
    final = SNAPSHOT_START + _kvs(_entry("b")) + IN_SYNC

    def serve(sock: socket.socket, hello: dict) -> None:
        number = server.connections - 1
        sock.sendall(streams[number] if number < len(streams) else final)
        sock.settimeout(2)
        while sock.recv(65536):  # until the client hangs up (or 2 s pass)
            pass

    server = fake_server(serve, limit=len(streams) + 1)
    before = _protocol_errors()
    client, rec = start_client(server.address, read_timeout=5.0)
    rec.wait_converged({ResourceKey("GlobalNetworkPolicy", "", "b"): gnp("b")},
                       "the good stream after every bad one", timeout=30)
    assert client.sessions == len(streams) + 1
    assert _protocol_errors() - before == len(streams)
    assert rec.errors == []  # nothing escaped as an unexpected failure
    assert rec.violations == []


@pytest.mark.parametrize("name", sorted(BAD_STREAMS))
def test_each_bad_stream_is_a_protocol_error(name: str) -> None:
    state, rec = _primed_state()
    connection = ClientConnection(state, "scripted", syncer_type="felix", offered=("none",))
    with pytest.raises(ProtocolError) as caught:
        connection.feed(BAD_STREAMS[name])
    _clear(caught.value)
    _check_consistent(state, rec)

"""The wire format without sockets: framing, decoder restarts, KV encoding, clear errors."""

from __future__ import annotations

import json
import zlib

import pytest
from typha_testlib import frame_bytes, json_frame

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey
from pyfelix.agent.typha.protocol import (
    CLIENT_MESSAGE_TYPES,
    SERVER_MESSAGE_TYPES,
    FrameReader,
    MessageDecoder,
    ProtocolError,
    decode_kv,
    decode_status,
    decoder_restart,
    encode_kv,
    encode_message,
    kvs_text,
)

DOC = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
       "metadata": {"name": "a"}, "spec": {"selector": "all()", "note": "é"}}
KEY = ResourceKey("GlobalNetworkPolicy", "", "a")


def test_frames_split_at_any_byte_boundary() -> None:
    stream = b"".join(encode_message({"type": "ping", "n": n}) for n in range(5))
    reader = FrameReader()
    payloads = []
    for i in range(len(stream)):  # one byte at a time
        payloads += reader.feed(stream[i:i + 1])
    assert [json.loads(p)["n"] for p in payloads] == [0, 1, 2, 3, 4]
    assert reader.buffered == 0
    assert reader.frames_read == 5


def test_oversized_and_empty_frames_are_refused_before_buffering() -> None:
    reader = FrameReader(max_frame_bytes=100)
    with pytest.raises(ProtocolError, match="frame 1 announces 4294967295 bytes, over the "
                                            "limit of 100"):
        reader.feed(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError, match="frame 1 has length 0"):
        FrameReader().feed(b"\x00\x00\x00\x00")


def test_decoder_follows_restarts_both_ways() -> None:
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
    stream = (encode_message({"type": "ping", "n": 1})
              + encode_message(decoder_restart("zlib"))
              + encode_message({"type": "ping", "n": 2}, "zlib")
              + encode_message(decoder_restart("none"), "zlib")
              + encode_message({"type": "ping", "n": 3}))
    messages = [decoder.decode(p) for p in FrameReader().feed(stream)]
    assert [m.get("n") for m in messages] == [1, None, 2, None, 3]
    assert decoder.compression == "none"


def test_zlib_payload_is_really_compressed_independently() -> None:
    frame = encode_message({"type": "kvs", "kvs": [], "pad": "x" * 5000}, "zlib")
    payload = FrameReader().feed(frame)[0]
    assert len(payload) < 200
    assert json.loads(zlib.decompress(payload))["pad"] == "x" * 5000


@pytest.mark.parametrize(("payload", "compression", "error"), [
    (b"{not json", "none", "message 1 is not valid UTF-8 JSON"),
    (b"\xff\xfe", "none", "not valid UTF-8 JSON"),
    (b"[1, 2]", "none", "message 1 is a JSON list, not an object"),
    (b'{"kind": "x"}', "none", "message 1 has no string field 'type'"),
    (b'{"type": "client_hello"}', "none", "unexpected type 'client_hello'"),
    (b'{"type": "ping"}', "zlib", "not a valid zlib stream"),
    (zlib.compress(b'{"type": "ping"}')[:-3], "zlib", "truncated"),
    (json.dumps({"type": "decoder_restart", "compression": "lz4"}).encode(), "none",
     "unknown compression 'lz4'"),
])
def test_malformed_payloads_raise_clear_errors(payload: bytes, compression: str,
                                               error: str) -> None:
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES)
    decoder.compression = compression
    with pytest.raises(ProtocolError, match=error):
        decoder.decode(payload)


def test_inflation_is_bounded() -> None:
    decoder = MessageDecoder(SERVER_MESSAGE_TYPES, max_message_bytes=10_000)
    decoder.compression = "zlib"
    bomb = zlib.compress(json.dumps({"type": "ping", "pad": "0" * 1_000_000}).encode())
    assert len(bomb) < 5_000
    with pytest.raises(ProtocolError, match="inflates to more than 10000 bytes"):
        decoder.decode(bomb)


def test_kv_round_trip_update_and_delete() -> None:
    update = RawUpdate(KEY, DOC, "dir/a.yaml#1", "7")
    fragment = encode_kv(update)
    decoded = decode_kv(json.loads(fragment.text), "entry 0")
    assert decoded.raw_update() == update
    assert decoded.fingerprint == fragment.fingerprint
    deleted = encode_kv(RawUpdate(KEY, None, "dir/a.yaml#1"))
    assert deleted.fingerprint is None
    assert decode_kv(json.loads(deleted.text), "entry 0").raw_update().value is None
    # the fingerprint follows the value only
    other_source = encode_kv(RawUpdate(KEY, dict(DOC), "elsewhere.yaml#3"))
    assert other_source.fingerprint == fragment.fingerprint
    changed = encode_kv(RawUpdate(KEY, {**DOC, "spec": {"selector": "x == 'y'"}}))
    assert changed.fingerprint != fragment.fingerprint


def test_kvs_message_embeds_fragments_as_json() -> None:
    fragments = [encode_kv(RawUpdate(ResourceKey("Node", "", f"n{i}"), {"kind": "Node"})).text
                 for i in range(3)]
    message = json.loads(kvs_text(fragments, 42))
    assert message["seq"] == 42
    assert [entry["k"][2] for entry in message["kvs"]] == ["n0", "n1", "n2"]


@pytest.mark.parametrize(("entry", "error"), [
    ([], "entry 3: is a list, not an object"),
    ({"k": ["Node", ""], "v": None}, "field 'k' must be \\[kind, namespace, name\\]"),
    ({"k": ["Node", "", ""], "v": None}, "kind and name non-empty"),
    ({"k": ["Node", "", "n"], "v": [1]}, "\\(Node n\\): field 'v' must be an object or null"),
    ({"k": ["Node", "", "n"], "v": {}}, "field 'f' must be a string when 'v' is set"),
    ({"k": ["Node", "", "n"], "v": None, "r": 5}, "fields 'r' and 's' must be strings"),
])
def test_bad_kv_entries_name_the_entry_and_field(entry: object, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        decode_kv(entry, "entry 3")


def test_status_values() -> None:
    assert decode_status({"type": "status", "status": "in-sync"}).value == "in-sync"
    with pytest.raises(ProtocolError, match="field 'status' is 'done'; expected one of"):
        decode_status({"type": "status", "status": "done"})


def test_client_side_message_types_are_restricted() -> None:
    decoder = MessageDecoder(CLIENT_MESSAGE_TYPES)
    assert decoder.decode(json.dumps({"type": "pong"}).encode())["type"] == "pong"
    with pytest.raises(ProtocolError, match="unexpected type 'kvs'"):
        decoder.decode(json.dumps({"type": "kvs", "kvs": []}).encode())


def test_testlib_frames_match_the_encoder() -> None:
    # the raw-socket tests build frames by hand; they must agree with the real encoder
    assert json_frame({"type": "pong"}) == frame_bytes(b'{"type": "pong"}')
    assert FrameReader().feed(encode_message({"type": "pong"})) == [b'{"type":"pong"}']

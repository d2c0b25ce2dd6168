"""The Typha wire protocol, version 1: framing, messages, compression (docs/typha-protocol.md).

Role: the one place that knows the bytes on the wire. The server (`agent.typha.server`) and
the client (`agent.typha.client`) both build and parse messages only through this module.

Framing: every message is one frame, a 4-byte unsigned big-endian payload length L
(1 <= L <= the receiver's limit) followed by L payload bytes. A payload is a JSON object with
a string field `type`, encoded as UTF-8, optionally compressed: each direction starts
uncompressed; after a sender sends `decoder_restart` (itself encoded the old way), every
later payload it sends is encoded with the compression that message names. With "zlib",
each payload is one complete zlib stream (RFC 1950), compressed on its own: the server can
encode a message once and send the same bytes to every client.

Inputs / outputs: `encode_*` functions return bytes ready for a socket; `FrameReader` splits
a byte stream into payloads (`feed`, or `push` + `pop` one at a time); `MessageDecoder`
turns payloads into message dicts (following decoder restarts); `encode_kv`/`decode_kv`
convert `RawUpdate`s to and from the JSON text of one key/value entry.

The message catalogue, the connection's life and the versioning rules are in
docs/typha-protocol.md.

Invariants: every malformed input raises `ProtocolError` whose message says what was wrong
(which frame size, which message, which field); nothing here raises anything else for bad
bytes, whatever they are (a hypothesis fuzz test, tests/typha/test_typha_fuzz.py, holds the
decoder and the client's handling of frames to this; JSON nested deeper than Python's parser
goes is one such error, not a RecursionError). A receiver ignores unknown fields (newer peers
may add some); new message types need a new protocol version.

Easy to get wrong: a frame's length must be checked BEFORE its payload is buffered (a bad
peer would otherwise make us allocate 4 GiB); zlib output must be bounded too (a small frame
can inflate enormously); `decoder_restart` changes how the NEXT payload is read, not itself.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, SyncStatus

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOL_VERSIONS: tuple[int, ...] = (1,)

FRAME_HEADER = struct.Struct("!I")
# What a client accepts from the server (snapshot chunks are far smaller; see SNAPSHOT_CHUNK)
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# What the server accepts from a client: hellos and pongs are tiny
CLIENT_MAX_FRAME_BYTES = 64 * 1024
# KVs per `kvs` message when the server sends a snapshot
SNAPSHOT_CHUNK = 1000

COMPRESSION_NONE = "none"
COMPRESSION_ZLIB = "zlib"
KNOWN_COMPRESSIONS: tuple[str, ...] = (COMPRESSION_ZLIB, COMPRESSION_NONE)
ZLIB_LEVEL = 1  # fast: loopback and LAN links are not the bottleneck, CPU is

# Message types
CLIENT_HELLO = "client_hello"
SERVER_HELLO = "server_hello"
DECODER_RESTART = "decoder_restart"
SNAPSHOT_BEGIN = "snapshot_begin"
KVS = "kvs"
SNAPSHOT_END = "snapshot_end"
STATUS = "status"
PING = "ping"
PONG = "pong"
ERROR = "error"
SERVER_MESSAGE_TYPES = frozenset({SERVER_HELLO, DECODER_RESTART, SNAPSHOT_BEGIN, KVS,
                                  SNAPSHOT_END, STATUS, PING, ERROR})
CLIENT_MESSAGE_TYPES = frozenset({CLIENT_HELLO, PONG})

# Error codes (the `code` field of an `error` message)
ERR_UNSUPPORTED_VERSION = "unsupported-version"
ERR_UNKNOWN_SYNCER_TYPE = "unknown-syncer-type"
ERR_BAD_HELLO = "bad-hello"
ERR_MALFORMED = "malformed"
ERR_TOO_SLOW = "too-slow"
ERR_PING_TIMEOUT = "ping-timeout"
ERR_SHUTDOWN = "server-shutdown"
ERR_SERVER_FULL = "server-full"
ERR_NOT_AUTHORIZED = "not-authorized"

_STATUS_BY_TEXT = {status.value: status for status in SyncStatus}


MAX_ERROR_CHARS = 500  # of a ProtocolError's text: it quotes what the peer sent


class ProtocolError(Exception):
    """The peer sent something this protocol version does not allow; `code` is the error
    code to send back (an `ERR_*` constant). The text is cut at MAX_ERROR_CHARS."""

    def __init__(self, message: str, code: str = ERR_MALFORMED) -> None:
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS - 3] + "..."
        super().__init__(message)
        self.code = code


def brief(value: Any, limit: int = 120) -> str:
    """A peer's value quoted in an error: short scalars and short flat lists/objects as
    repr, anything else summarised. Never the repr of a whole big or deeply nested value
    (slow, and deep nesting makes repr itself raise RecursionError)."""
    if isinstance(value, list | dict):
        items = value.values() if isinstance(value, dict) else value
        flat = len(value) <= 8 and not any(isinstance(i, list | dict) for i in items) \
            and not any(isinstance(k, list | dict) for k in value)
        if not flat:
            kind = "an object" if isinstance(value, dict) else "a list"
            return f"{kind} of {len(value)} {'fields' if isinstance(value, dict) else 'items'}"
    elif isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + "..."
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------
# Encoding


def _dumps(message: Mapping[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def compress(payload: bytes, compression: str) -> bytes:
    """Encode one payload with `compression` ("none" or "zlib")."""
    if compression == COMPRESSION_NONE:
        return payload
    if compression == COMPRESSION_ZLIB:
        return zlib.compress(payload, ZLIB_LEVEL)
    raise ValueError(f"unknown compression {compression!r}; known: {', '.join(KNOWN_COMPRESSIONS)}")


def frame(payload: bytes) -> bytes:
    """Prefix a payload with its length."""
    if not payload:
        raise ValueError("a frame payload cannot be empty")
    return FRAME_HEADER.pack(len(payload)) + payload


def encode_text(text: str, compression: str = COMPRESSION_NONE) -> bytes:
    """A whole frame for a message already rendered as JSON text."""
    return frame(compress(text.encode(), compression))


def encode_message(message: Mapping[str, Any], compression: str = COMPRESSION_NONE) -> bytes:
    """A whole frame for a message dict (which must have a string `type`)."""
    if not isinstance(message.get("type"), str):
        raise ValueError(f"message without a type: {message!r}")
    return encode_text(_dumps(message), compression)


def client_hello(*, hostname: str, syncer_type: str, compression: Iterable[str],
                 protocol_version: int = PROTOCOL_VERSION, client_version: str = "") -> dict:
    return {"type": CLIENT_HELLO, "protocol_version": protocol_version, "hostname": hostname,
            "syncer_type": syncer_type, "compression": list(compression),
            "client_version": client_version}


def server_hello(*, syncer_type: str, compression: str, server_version: str = "",
                 protocol_version: int = PROTOCOL_VERSION) -> dict:
    return {"type": SERVER_HELLO, "protocol_version": protocol_version,
            "syncer_type": syncer_type, "compression": compression,
            "server_version": server_version}


def decoder_restart(compression: str) -> dict:
    return {"type": DECODER_RESTART, "compression": compression}


def error_message(code: str, message: str) -> dict:
    return {"type": ERROR, "code": code, "message": message}


def status_text(seq: int, status: SyncStatus) -> str:
    return _dumps({"type": STATUS, "seq": seq, "status": status.value})


def kvs_text(fragments: Iterable[str], seq: int | None = None) -> str:
    """A `kvs` message from already-encoded KV fragments (see `encode_kv`)."""
    head = '{"type":"kvs"' if seq is None else f'{{"type":"kvs","seq":{int(seq)}'
    return f'{head},"kvs":[{",".join(fragments)}]}}'


@dataclass(frozen=True)
class KVFragment:
    """One KV as JSON text, and the fingerprint of its value (None for a delete)."""

    key: ResourceKey
    text: str
    fingerprint: str | None


def fingerprint_of(value_text: str) -> str:
    """A short digest of a value's JSON text: equal texts, equal fingerprints."""
    return hashlib.blake2b(value_text.encode(), digest_size=8).hexdigest()


def encode_kv(update: RawUpdate) -> KVFragment:
    """The JSON text of one KV entry: {"k": [kind, namespace, name], "v": doc or null,
    "f": fingerprint or null, "r": revision, "s": source}."""
    key = update.key
    head = _dumps({"k": [key.kind, key.namespace, key.name], "r": update.revision,
                   "s": update.source})
    if update.value is None:
        return KVFragment(key, f'{head[:-1]},"f":null,"v":null}}', None)
    value_text = _dumps(update.value)
    fingerprint = fingerprint_of(value_text)
    return KVFragment(key, f'{head[:-1]},"f":"{fingerprint}","v":{value_text}}}', fingerprint)


class DecodedKV(NamedTuple):
    key: tuple[str, str, str]  # kind, namespace, name
    value: dict[str, Any] | None
    fingerprint: str | None
    revision: str
    source: str

    def raw_update(self) -> RawUpdate:
        return RawUpdate(ResourceKey(*self.key), self.value, self.source, self.revision)


def decode_kv(entry: Any, where: str) -> DecodedKV:
    """Check and convert one KV entry; `where` names it in errors ("kvs message, entry 3").
    (A hot path: every client decodes every entry of its snapshot; plain type checks.)"""
    if type(entry) is not dict:
        raise ProtocolError(f"{where}: is a {type(entry).__name__}, not an object")
    key = entry.get("k")
    if type(key) is not list or len(key) != 3:
        raise _bad_key(where, key)
    kind, namespace, name = key
    if type(kind) is not str or type(namespace) is not str or type(name) is not str \
            or not kind or not name:
        raise _bad_key(where, key)
    value = entry.get("v")
    revision = entry.get("r", "")
    source = entry.get("s", "")
    if type(revision) is not str or type(source) is not str:
        raise ProtocolError(f"{where} ({kind} {name}): fields 'r' and 's' must be strings")
    if value is None:
        return DecodedKV((kind, namespace, name), None, None, revision, source)
    if type(value) is not dict:
        raise ProtocolError(f"{where} ({kind} {name}): field 'v' must be an object or "
                            f"null, got a {type(value).__name__}")
    fingerprint = entry.get("f")
    if type(fingerprint) is not str:
        raise ProtocolError(f"{where} ({kind} {name}): field 'f' must be a string when "
                            "'v' is set")
    return DecodedKV((kind, namespace, name), value, fingerprint, revision, source)


def _bad_key(where: str, key: Any) -> ProtocolError:
    return ProtocolError(f"{where}: field 'k' must be [kind, namespace, name] strings "
                         f"(kind and name non-empty), got {brief(key)}")


def decode_status(message: Mapping[str, Any]) -> SyncStatus:
    text = message.get("status")
    status = _STATUS_BY_TEXT.get(text) if isinstance(text, str) else None
    if status is None:
        raise ProtocolError(f"status message: field 'status' is {brief(text)}; expected one "
                            f"of {', '.join(sorted(_STATUS_BY_TEXT))}")
    return status


def require(message: Mapping[str, Any], field: str, kind: type | tuple[type, ...]) -> Any:
    """`message[field]`, checked to be of `kind`; ProtocolError naming message and field."""
    value = message.get(field)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        kind = message.get("type")
        raise ProtocolError(f"{kind if isinstance(kind, str) else 'a'} message: field "
                            f"{field!r} is missing or not a {names} (got {brief(value)})")
    return value


# --------------------------------------------------------------------------------------------
# Decoding


class FrameReader:
    """Splits a byte stream into frame payloads, refusing sizes over `max_frame_bytes`."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self.frames_read = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def check_length(self, length: int) -> None:
        if length == 0:
            raise ProtocolError(f"frame {self.frames_read + 1} has length 0 (empty frames "
                                "are not allowed)")
        if length > self.max_frame_bytes:
            raise ProtocolError(f"frame {self.frames_read + 1} announces {length} bytes, over "
                                f"the limit of {self.max_frame_bytes}")

    def push(self, data: bytes) -> None:
        """Add received bytes (take the payloads with `pop`)."""
        self._buffer += data

    def pop(self) -> bytes | None:
        """The next complete payload, or None until more bytes come; ProtocolError when the
        next frame's length is bad (checked as soon as its header is in)."""
        header = FRAME_HEADER.size
        if len(self._buffer) < header:
            return None
        (length,) = FRAME_HEADER.unpack_from(self._buffer)
        self.check_length(length)
        if len(self._buffer) < header + length:
            return None
        payload = bytes(self._buffer[header:header + length])
        del self._buffer[:header + length]
        self.frames_read += 1
        return payload

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return every complete payload now available, in order."""
        self.push(data)
        payloads: list[bytes] = []
        while (payload := self.pop()) is not None:
            payloads.append(payload)
        return payloads


class MessageDecoder:
    """Payloads -> message dicts, following `decoder_restart` (see module docstring).

    `allowed_types` restricts which message types the peer may send.
    """

    def __init__(self, allowed_types: frozenset[str], *,
                 max_message_bytes: int = DEFAULT_MAX_FRAME_BYTES * 4) -> None:
        self.allowed_types = allowed_types
        self.max_message_bytes = max_message_bytes
        self.compression = COMPRESSION_NONE
        self.messages_read = 0

    def _inflate(self, payload: bytes) -> bytes:
        if self.compression == COMPRESSION_NONE:
            return payload
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(payload, self.max_message_bytes)
        except zlib.error as exc:
            raise ProtocolError(f"message {self.messages_read + 1}: not a valid zlib stream "
                                f"after decoder restart to zlib ({exc})") from exc
        if inflater.unconsumed_tail:
            raise ProtocolError(f"message {self.messages_read + 1}: inflates to more than "
                                f"{self.max_message_bytes} bytes")
        if not inflater.eof or inflater.unused_data:
            raise ProtocolError(f"message {self.messages_read + 1}: the zlib stream is "
                                "truncated or followed by extra bytes")
        return data

    def decode(self, payload: bytes) -> dict[str, Any]:
        number = self.messages_read + 1
        data = self._inflate(payload)
        try:
            message = json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"message {number} is not valid UTF-8 JSON "
                                f"({compression_note(self.compression)}): {exc}") from exc
        except RecursionError:  # "[[[[..." : Python's parser gives up around 1,000 levels
            raise ProtocolError(f"message {number} nests JSON arrays/objects too deeply "
                                f"({compression_note(self.compression)})") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"message {number} is a JSON {type(message).__name__}, "
                                "not an object")
        kind = message.get("type")
        if not isinstance(kind, str):
            raise ProtocolError(f"message {number} has no string field 'type'")
        if kind not in self.allowed_types:
            raise ProtocolError(f"message {number} has unexpected type {brief(kind)}; "
                                f"expected one of {', '.join(sorted(self.allowed_types))}")
        self.messages_read = number
        if kind == DECODER_RESTART:
            compression = message.get("compression")
            if compression not in KNOWN_COMPRESSIONS:
                raise ProtocolError(f"decoder_restart message: unknown compression "
                                    f"{brief(compression)}; known: "
                                    f"{', '.join(KNOWN_COMPRESSIONS)}")
            self.compression = compression
        return message


def compression_note(compression: str) -> str:
    return "uncompressed" if compression == COMPRESSION_NONE else f"after {compression} inflate"

"""The `ids` map: names behind the numeric ids Python allocates (bpf/include/ids.h).

The programs only see numbers (IP-set ids, rule counter ids, endpoint ids). This map, pinned
with the rest, records kind + number -> name so that a restarted agent reuses every id it
finds (nothing the programs reference changes meaning) and the CLI can print names.
A name that does not fit in NAME_LEN - 1 bytes is stored as its `stored_name()`:
"sha256:<hex>"; compare names through `stored_name()` on both sides.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

NAME_LEN = 120  # must match ID_NAME_LEN


class IdKind(enum.IntEnum):
    """must match ID_KIND_* in bpf/include/ids.h"""

    IPSET = 1
    NETSET = 2
    RULE = 3
    ENDPOINT = 4


class Key(ctypes.Structure):
    """must match struct id_key in bpf/include/ids.h"""

    _fields_ = [("kind", ctypes.c_uint32), ("id", ctypes.c_uint32)]


class Value(ctypes.Structure):
    """must match struct id_value in bpf/include/ids.h"""

    _fields_ = [("name", ctypes.c_char * NAME_LEN)]


PARAMS = MapParams(
    name="ids", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=1 << 17, version=1, header="ids.h",
)

_KEY = struct.Struct("=II")


def stored_name(name: str) -> str:
    """The form a name takes in the map: itself, or a digest if too long."""
    if len(name.encode()) < NAME_LEN:
        return name
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def encode_key(kind: IdKind, number: int) -> bytes:
    return _KEY.pack(int(kind), number)


def decode_key(raw: bytes) -> tuple[IdKind, int]:
    kind, number = _KEY.unpack(raw)
    return IdKind(kind), number


def encode_value(name: str) -> bytes:
    data = stored_name(name).encode()
    return data + bytes(NAME_LEN - len(data))


def decode_value(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def read_all(m: BpfMap) -> dict[IdKind, dict[int, str]]:
    """kind -> {number: stored name}, for the id allocators' adoption after a restart."""
    out: dict[IdKind, dict[int, str]] = {k: {} for k in IdKind}
    for key, value in m.items():
        try:
            kind, number = decode_key(key)
        except ValueError:
            continue  # a kind this version does not know: leave it alone
        out[kind][number] = decode_value(value)
    return out


def dump(m: BpfMap) -> list[dict]:
    """[{"kind": "ipset", "id": 3, "name": "..."}], sorted by kind then id."""
    rows = []
    for kind, numbers in read_all(m).items():
        rows += [{"kind": kind.name.lower(), "id": n, "name": s} for n, s in numbers.items()]
    return sorted(rows, key=lambda r: (r["kind"], r["id"]))

"""The `nat_backend6` map: (service id, index) -> IPv6 backend address and port
(bpf/include/nat_backend6.h). The IPv6 twin of `nat_backend` (same key layout; ids are
`nat_frontend6`'s). A frontend with count n uses indexes [0, n)."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr
from pyfelix.agent.bpf.maps.nat_backend import Key, decode_key, encode_key

__all__ = [
    "PARAMS",
    "Key",
    "Value",
    "decode_key",
    "decode_value",
    "dump",
    "encode_key",
    "encode_value",
    "open_pinned",
]


class Value(ctypes.Structure):
    """must match struct nat_be6_value in bpf/include/nat_backend6.h"""

    _fields_ = [("addr", PfAddr), ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


PARAMS = MapParams(
    name="nat_backend6", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=262144, version=1, header="nat_backend6.h",
)

_VALUE = struct.Struct("=16sHxx")


def encode_value(addr: str, port: int) -> bytes:
    return _VALUE.pack(ipaddress.IPv6Address(addr).packed, port)


def decode_value(raw: bytes) -> tuple[str, int]:
    addr, port = _VALUE.unpack(raw)
    return str(ipaddress.IPv6Address(addr)), port


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"service_id", "index", "addr", "port"}] sorted by service id and index."""
    rows = []
    for k, v in m.items():
        service_id, index = decode_key(k)
        addr, port = decode_value(v)
        rows.append({"service_id": service_id, "index": index, "addr": addr, "port": port})
    return sorted(rows, key=lambda r: (r["service_id"], r["index"]))

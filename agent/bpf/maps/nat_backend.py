"""The `nat_backend` map: (service id, index) -> backend address and port
(bpf/include/nat_backend.h). A frontend with count n uses indexes [0, n)."""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32


class Key(ctypes.Structure):
    """must match struct nat_be_key in bpf/include/nat_backend.h"""

    _fields_ = [("service_id", ctypes.c_uint32), ("index", ctypes.c_uint32)]


class Value(ctypes.Structure):
    """must match struct nat_be_value in bpf/include/nat_backend.h"""

    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


PARAMS = MapParams(
    name="nat_backend", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=262144, version=1, header="nat_backend.h",
)

_KEY = struct.Struct("=II")
_VALUE = struct.Struct("=IHxx")


def encode_key(service_id: int, index: int) -> bytes:
    return _KEY.pack(service_id, index)


def decode_key(raw: bytes) -> tuple[int, int]:
    service_id, index = _KEY.unpack(raw)
    return service_id, index


def encode_value(addr: str, port: int) -> bytes:
    return _VALUE.pack(ip_to_be32(addr), port)


def decode_value(raw: bytes) -> tuple[str, int]:
    addr, port = _VALUE.unpack(raw)
    return be32_to_ip(addr), port


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

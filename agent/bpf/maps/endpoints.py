"""The `endpoints` map: ifindex of a workload's host-side interface -> its chains and id
(bpf/include/endpoints.h). No entry for an ifindex running our programs = drop (fail closed).
Chains are [start, start + len) in the rules map (agent.bpf.maps.rules); `ingress` is the
POD's ingress (to_wep hook), `egress` the pod's egress (from_wep hook).
"""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

FLAG_ADMIN_DOWN = 0x01  # must match EP_F_ADMIN_DOWN


class Key(ctypes.Structure):
    """must match struct endpoint_key in bpf/include/endpoints.h"""

    _fields_ = [("ifindex", ctypes.c_uint32)]


class Value(ctypes.Structure):
    """must match struct endpoint_value in bpf/include/endpoints.h"""

    _fields_ = [
        ("endpoint_id", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("ingress_start", ctypes.c_uint32),
        ("ingress_len", ctypes.c_uint32),
        ("egress_start", ctypes.c_uint32),
        ("egress_len", ctypes.c_uint32),
    ]


PARAMS = MapParams(
    name="endpoints", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=16384, version=1, header="endpoints.h",
)

_KEY = struct.Struct("=I")
_VALUE = struct.Struct("=IIIIII")


def encode_key(ifindex: int) -> bytes:
    return _KEY.pack(ifindex)


def decode_key(raw: bytes) -> int:
    return _KEY.unpack(raw)[0]


def encode_value(
    endpoint_id: int, flags: int, ingress: tuple[int, int], egress: tuple[int, int]
) -> bytes:
    """ingress/egress are (start, len) chain placements."""
    return _VALUE.pack(endpoint_id, flags, ingress[0], ingress[1], egress[0], egress[1])


def decode_value(raw: bytes) -> dict:
    eid, flags, i_start, i_len, e_start, e_len = _VALUE.unpack(raw)
    return {
        "endpoint_id": eid, "flags": flags, "admin_down": bool(flags & FLAG_ADMIN_DOWN),
        "ingress": {"start": i_start, "len": i_len}, "egress": {"start": e_start, "len": e_len},
    }


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"ifindex": 7, "endpoint_id": 1, "flags": 0, "admin_down": False, "ingress":
    {"start": 0, "len": 3}, "egress": {...}}], sorted by ifindex."""
    rows = [{"ifindex": decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: r["ifindex"])

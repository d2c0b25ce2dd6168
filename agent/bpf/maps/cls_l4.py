"""The `cls_l4` map: (instance, protocol, flags, ICMP type/code, level) -> vector id
(bpf/include/classifier.h, field CLS_F_L4).

The program tries, for an ICMP packet, level TYPE_CODE (type and code), TYPE (code 0 in
the key), PROTO (type and code 0), then OTHER (protocol 0): a protocol no record of the
chain names; for any other packet PROTO then OTHER. `pflags` is the packet's
PKT_F_PORTS | PKT_F_ICMP | PKT_F_IPV6 bits (the family is an L4 key part, so a rule's
ipVersion is an L4 constraint: no per-rule test). Written by the BPF policy manager as
part of an instance.
"""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

LEVEL_PROTO = 0  # must match CLS_L4_PROTO
LEVEL_TYPE = 1  # must match CLS_L4_TYPE
LEVEL_TYPE_CODE = 2  # must match CLS_L4_TYPE_CODE
LEVEL_OTHER = 3  # must match CLS_L4_OTHER
PKT_F_PORTS = 0x01  # must match PKT_F_PORTS (common.h)
PKT_F_ICMP = 0x08  # must match PKT_F_ICMP (common.h)
PKT_F_IPV6 = 0x80  # must match PKT_F_IPV6 (common.h)


class Key(ctypes.Structure):
    """must match struct cls_l4_key"""

    _fields_ = [("instance", ctypes.c_uint32), ("proto", ctypes.c_uint8),
                ("pflags", ctypes.c_uint8), ("icmp_type", ctypes.c_uint8),
                ("icmp_code", ctypes.c_uint8), ("level", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 3)]


class Value(ctypes.Structure):
    """must match struct cls_vec_value"""

    _fields_ = [("vec", ctypes.c_uint32)]


PARAMS = MapParams(
    name="cls_l4", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=2, header="classifier.h",
)

_KEY = struct.Struct("=IBBBBB3x")
_VALUE = struct.Struct("=I")


def encode_key(instance: int, proto: int, pflags: int, icmp_type: int, icmp_code: int,
               level: int) -> bytes:
    return _KEY.pack(instance, proto, pflags, icmp_type, icmp_code, level)


def decode_key(raw: bytes) -> dict:
    inst, proto, pflags, t, c, level = _KEY.unpack(raw)
    return {"instance": inst, "proto": proto, "pflags": pflags, "icmp_type": t,
            "icmp_code": c, "level": level}


def encode_value(vec: int) -> bytes:
    return _VALUE.pack(vec)


def decode_value(raw: bytes) -> int:
    return _VALUE.unpack(raw)[0]


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    rows = [{**decode_key(k), "vec": decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (r["instance"], r["level"], r["proto"], r["pflags"],
                                       r["icmp_type"], r["icmp_code"]))

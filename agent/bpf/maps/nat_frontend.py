"""The `nat_frontend` map: service frontends (bpf/include/nat_frontend.h).

Key = (virtual IP, port, IP protocol); value = (service id, backend count, flags, affinity
timeout in seconds, and a copy of the first `INLINE_BACKENDS` backends). Written by
`BpfNatManager` from ServiceFrontendUpdate; count 0 means the Service has no ready backends
and its traffic is rejected. Invariant: the inline backends are exactly `nat_backend`'s
indexes [0, min(count, INLINE_BACKENDS)) (the rest zero), so the programs can pick a new
flow's backend from the frontend entry alone (nat_fe_backend in the header).
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import os
import struct
from collections.abc import Sequence

from pyfelix.agent.bpf.maps import nat_backend
from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32

INLINE_BACKENDS = 7  # must match NAT_FE_INLINE_BACKENDS


class FrontendFlags(enum.IntFlag):
    """must match NAT_FE_F_* in bpf/include/nat_frontend.h"""

    AFFINITY = 0x01
    EXTERNAL = 0x02
    NODEPORT = 0x04  # key address 0.0.0.0: any of the node's addresses


class Key(ctypes.Structure):
    """must match struct nat_fe_key in bpf/include/nat_frontend.h"""

    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class Value(ctypes.Structure):
    """must match struct nat_fe_value in bpf/include/nat_frontend.h"""

    _fields_ = [("service_id", ctypes.c_uint32), ("count", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("affinity_timeout", ctypes.c_uint32),
                ("backends", nat_backend.Value * INLINE_BACKENDS)]


PARAMS = MapParams(
    name="nat_frontend", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=2, header="nat_frontend.h",
)

_KEY = struct.Struct("=IHBx")
_VALUE = struct.Struct("=IIII")
_INLINE = struct.Struct("=" + "IHxx" * INLINE_BACKENDS)
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}


def encode_key(vip: str, port: int, proto: int) -> bytes:
    return _KEY.pack(ip_to_be32(vip), port, proto)


def decode_key(raw: bytes) -> dict:
    addr, port, proto = _KEY.unpack(raw)
    return {"vip": be32_to_ip(addr), "port": port,
            "protocol": PROTOCOL_NAMES.get(proto, str(proto))}


def encode_value(service_id: int, count: int, flags: FrontendFlags | int = 0,
                 affinity_timeout: int = 0,
                 backends: Sequence[tuple[str, int]] = ()) -> bytes:
    """`backends`: the service's backends in index order (only the first INLINE_BACKENDS
    are copied; pass none for a frontend written with count 0)."""
    inline: list[int] = []
    for addr, port in list(backends)[:INLINE_BACKENDS]:
        inline += (ip_to_be32(addr), port)
    inline += [0, 0] * (INLINE_BACKENDS - len(inline) // 2)
    return _VALUE.pack(service_id, count, int(flags), affinity_timeout) + _INLINE.pack(*inline)


def decode_value(raw: bytes) -> dict:
    service_id, count, flags, timeout = _VALUE.unpack_from(raw)
    words = _INLINE.unpack_from(raw, _VALUE.size)
    inline = [(be32_to_ip(words[2 * i]), words[2 * i + 1])
              for i in range(min(count, INLINE_BACKENDS))]
    return {"service_id": service_id, "backends": count,
            "flags": sorted(f.name.lower() for f in FrontendFlags if f & flags and f.name),
            "affinity_timeout": timeout, "inline_backends": inline}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"vip", "port", "protocol", "service_id", "backends", "flags", "affinity_timeout",
    "inline_backends": [(addr, port)]}]."""
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (ipaddress.IPv4Address(r["vip"]), r["port"],
                                       r["protocol"]))

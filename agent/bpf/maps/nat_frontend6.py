"""The `nat_frontend6` map: IPv6 service frontends (bpf/include/nat_frontend6.h).

Key = (16-byte virtual IP, port, IP protocol); value = (service id, backend count, flags,
affinity timeout in seconds). The IPv6 twin of `nat_frontend` (flags are its
`FrontendFlags`), written by the IPv6 `BpfNatManager` from ServiceFrontendUpdates whose VIP
is IPv6. count 0: no ready backends, traffic rejected. No inline backends: the programs read
every IPv6 new flow's backend from `nat_backend6`.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct
from collections.abc import Sequence

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr
from pyfelix.agent.bpf.maps.nat_frontend import PROTOCOL_NAMES, FrontendFlags

INLINE_BACKENDS = 0  # the manager's interface: nothing copied into an IPv6 frontend


class Key(ctypes.Structure):
    """must match struct nat_fe6_key in bpf/include/nat_frontend6.h"""

    _fields_ = [("addr", PfAddr), ("port", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class Value(ctypes.Structure):
    """must match struct nat_fe6_value in bpf/include/nat_frontend6.h"""

    _fields_ = [("service_id", ctypes.c_uint32), ("count", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("affinity_timeout", ctypes.c_uint32)]


PARAMS = MapParams(
    name="nat_frontend6", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=1, header="nat_frontend6.h",
)

_KEY = struct.Struct("=16sHBx")
_VALUE = struct.Struct("=IIII")


def encode_key(vip: str, port: int, proto: int) -> bytes:
    return _KEY.pack(ipaddress.IPv6Address(vip).packed, port, proto)


def decode_key(raw: bytes) -> dict:
    addr, port, proto = _KEY.unpack(raw)
    return {"vip": str(ipaddress.IPv6Address(addr)), "port": port,
            "protocol": PROTOCOL_NAMES.get(proto, str(proto))}


def encode_value(service_id: int, count: int, flags: FrontendFlags | int = 0,
                 affinity_timeout: int = 0,
                 backends: Sequence[tuple[str, int]] = ()) -> bytes:
    """`backends` is accepted for the IPv4 module's signature and ignored (no inline copy)."""
    del backends
    return _VALUE.pack(service_id, count, int(flags), affinity_timeout)


def decode_value(raw: bytes) -> dict:
    service_id, count, flags, timeout = _VALUE.unpack_from(raw)
    return {"service_id": service_id, "backends": count,
            "flags": sorted(f.name.lower() for f in FrontendFlags if f & flags and f.name),
            "affinity_timeout": timeout, "inline_backends": []}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"vip", "port", "protocol", "service_id", "backends", "flags", "affinity_timeout",
    "inline_backends": []}] sorted by VIP, port, protocol."""
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (ipaddress.IPv6Address(r["vip"]), r["port"],
                                       r["protocol"]))

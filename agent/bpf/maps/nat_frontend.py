"""The `nat_frontend` map: service frontends (bpf/include/nat_frontend.h).

Key = (virtual IP, port, IP protocol); value = (service id, backend count, flags, affinity
timeout in seconds). Written by `BpfNatManager` from ServiceFrontendUpdate; count 0 means
the Service has no ready backends and its traffic is rejected.
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32


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
                ("flags", ctypes.c_uint32), ("affinity_timeout", ctypes.c_uint32)]


PARAMS = MapParams(
    name="nat_frontend", map_type=MapType.HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=1, header="nat_frontend.h",
)

_KEY = struct.Struct("=IHBx")
_VALUE = struct.Struct("=IIII")
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}


def encode_key(vip: str, port: int, proto: int) -> bytes:
    return _KEY.pack(ip_to_be32(vip), port, proto)


def decode_key(raw: bytes) -> dict:
    addr, port, proto = _KEY.unpack(raw)
    return {"vip": be32_to_ip(addr), "port": port,
            "protocol": PROTOCOL_NAMES.get(proto, str(proto))}


def encode_value(service_id: int, count: int, flags: FrontendFlags | int = 0,
                 affinity_timeout: int = 0) -> bytes:
    return _VALUE.pack(service_id, count, int(flags), affinity_timeout)


def decode_value(raw: bytes) -> dict:
    service_id, count, flags, timeout = _VALUE.unpack(raw)
    return {"service_id": service_id, "backends": count,
            "flags": sorted(f.name.lower() for f in FrontendFlags if f & flags and f.name),
            "affinity_timeout": timeout}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"vip", "port", "protocol", "service_id", "backends", "flags", "affinity_timeout"}]."""
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (ipaddress.IPv4Address(r["vip"]), r["port"],
                                       r["protocol"]))

"""The `routes` map: destination prefix -> flags, ifindex, next hop (bpf/include/routes.h).

Filled from RouteUpdate and IP pools by the compiler; each entry's flags include the pool
flags of every pool containing it (a longest-prefix match returns one entry only).
The programs currently read only RT_F_LOCAL_HOST (endpoint-to-host action).
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import (
    BpfMap,
    MapParams,
    MapType,
    PfAddr,
    addr16,
    addr16_to_ip,
    net16,
    net_sort_key,
    parse_net,
)

KEY_FIXED_BITS = 32  # must match ROUTE_KEY_FIXED_BITS (the family)


class RouteFlags(enum.IntFlag):
    """must match RT_F_* in bpf/include/routes.h"""

    LOCAL_HOST = 0x01
    LOCAL_WORKLOAD = 0x02
    REMOTE_WORKLOAD = 0x04
    REMOTE_HOST = 0x08
    IN_POOL = 0x10
    NAT_OUTGOING = 0x20
    TUNNEL_VXLAN = 0x40
    TUNNEL_IPIP = 0x80


class Key(ctypes.Structure):
    """must match struct route_key in bpf/include/routes.h"""

    _fields_ = [("prefixlen", ctypes.c_uint32), ("family", ctypes.c_uint32),
                ("addr", PfAddr)]


class Value(ctypes.Structure):
    """must match struct route_value in bpf/include/routes.h"""

    _fields_ = [
        ("flags", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("next_hop", PfAddr),
    ]


PARAMS = MapParams(
    name="routes", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=65536, version=2, flags=1, header="routes.h",
)

_KEY = struct.Struct("=II16s")
_VALUE = struct.Struct("=II16s")


def encode_key(cidr: str | ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    net = parse_net(cidr)
    family, addr = net16(net)
    return _KEY.pack(KEY_FIXED_BITS + net.prefixlen, family, addr)


def key_family(raw: bytes) -> int:
    """4 or 6: the family of an encoded key."""
    return _KEY.unpack(raw)[1]


def decode_key(raw: bytes) -> str:
    plen, family, addr = _KEY.unpack(raw)
    return f"{addr16_to_ip(family, addr)}/{plen - KEY_FIXED_BITS}"


def encode_value(flags: RouteFlags | int, ifindex: int = 0, next_hop: str = "") -> bytes:
    return _VALUE.pack(int(flags), ifindex, addr16(next_hop)[1] if next_hop else bytes(16))


def decode_value(raw: bytes) -> dict:
    flags, ifindex, nh = _VALUE.unpack(raw)
    names = [f.name.lower() for f in RouteFlags if f & flags and f.name]
    next_hop = ""
    if any(nh):
        next_hop = addr16_to_ip(4 if not any(nh[4:]) else 6, nh)
    return {"flags": sorted(names), "ifindex": ifindex, "next_hop": next_hop}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"dst": "10.65.0.0/26", "flags": ["in_pool", ...], "ifindex": 0, "next_hop": ""}]."""
    rows = [{"dst": decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: net_sort_key(r["dst"]))

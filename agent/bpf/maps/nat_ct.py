"""The `nat_ct` map: each service flow's translation, both ways (bpf/include/nat_ct.h).

FWD entries: (client, VIP, client port, service port, proto) -> backend address and port;
REV entries: (backend, client, backend port, client port, proto) -> VIP and service port.
Written by the programs (an LRU: never full, it evicts); read by the CLI.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32
from pyfelix.agent.bpf.maps.nat_frontend import PROTOCOL_NAMES


class Kind(enum.IntEnum):
    """must match NAT_CT_* in bpf/include/nat_ct.h"""

    FWD = 1
    REV = 2


class Key(ctypes.Structure):
    """must match struct nat_ct_key in bpf/include/nat_ct.h"""

    _fields_ = [("saddr", ctypes.c_uint32), ("daddr", ctypes.c_uint32),
                ("sport", ctypes.c_uint16), ("dport", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("kind", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 2)]


class Value(ctypes.Structure):
    """must match struct nat_ct_value in bpf/include/nat_ct.h"""

    _fields_ = [("addr", ctypes.c_uint32), ("port", ctypes.c_uint16),
                ("flags", ctypes.c_uint16),
                ("created_ns", ctypes.c_uint64), ("last_seen_ns", ctypes.c_uint64),
                ("peer_addr", ctypes.c_uint32), ("peer_port", ctypes.c_uint16),
                ("pad", ctypes.c_uint16)]


HAIRPIN = 0x01  # must match NAT_CT_F_HAIRPIN
NODEPORT = 0x02  # must match NAT_CT_F_NODEPORT
SNAT = 0x04  # must match NAT_CT_F_SNAT


PARAMS = MapParams(
    name="nat_ct", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=262144, version=2, header="nat_ct.h",
)

_KEY = struct.Struct("=IIHHBBxx")
_VALUE = struct.Struct("=IHHQQIHxx")


def encode_key(saddr: str, daddr: str, sport: int, dport: int, proto: int,
               kind: Kind) -> bytes:
    return _KEY.pack(ip_to_be32(saddr), ip_to_be32(daddr), sport, dport, proto, int(kind))


def decode_key(raw: bytes) -> dict:
    saddr, daddr, sport, dport, proto, kind = _KEY.unpack(raw)
    return {"kind": Kind(kind).name.lower() if kind in (1, 2) else str(kind),
            "src": f"{be32_to_ip(saddr)}:{sport}", "dst": f"{be32_to_ip(daddr)}:{dport}",
            "protocol": PROTOCOL_NAMES.get(proto, str(proto))}


def decode_value(raw: bytes) -> dict:
    addr, port, flags, created, last, peer_addr, peer_port = _VALUE.unpack(raw)
    out = {"to": f"{be32_to_ip(addr)}:{port}", "hairpin": bool(flags & HAIRPIN),
           "nodeport": bool(flags & NODEPORT), "created_ns": created, "last_seen_ns": last}
    if flags & SNAT:
        out["snat_peer"] = f"{be32_to_ip(peer_addr)}:{peer_port}"
    return out


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"kind": "fwd"|"rev", "src", "dst", "protocol", "to", "created_ns", "last_seen_ns"}]."""
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (r["kind"], r["src"], r["dst"], r["protocol"]))

"""The `nat_affinity6` map: IPv6 ClientIP session affinity, (service id, client) -> backend
and the time it was last used (bpf/include/nat_affinity6.h). The IPv6 twin of
`nat_affinity`: written by the programs; the manager deletes entries whose backend or
service it removed."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr


class Key(ctypes.Structure):
    """must match struct nat_aff6_key in bpf/include/nat_affinity6.h"""

    _fields_ = [("service_id", ctypes.c_uint32), ("client", PfAddr)]


class Value(ctypes.Structure):
    """must match struct nat_aff6_value in bpf/include/nat_affinity6.h"""

    _fields_ = [("addr", PfAddr), ("port", ctypes.c_uint16), ("pad", ctypes.c_uint16),
                ("pad2", ctypes.c_uint32), ("last_used_ns", ctypes.c_uint64)]


PARAMS = MapParams(
    name="nat_affinity6", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=1, header="nat_affinity6.h",
)

_KEY = struct.Struct("=I16s")
_VALUE = struct.Struct("=16sHxxxxxxQ")


def encode_key(service_id: int, client: str) -> bytes:
    return _KEY.pack(service_id, ipaddress.IPv6Address(client).packed)


def decode_key(raw: bytes) -> tuple[int, str]:
    service_id, client = _KEY.unpack(raw)
    return service_id, str(ipaddress.IPv6Address(client))


def encode_value(addr: str, port: int, last_used_ns: int) -> bytes:
    return _VALUE.pack(ipaddress.IPv6Address(addr).packed, port, last_used_ns)


def decode_value(raw: bytes) -> tuple[str, int, int]:
    addr, port, last = _VALUE.unpack(raw)
    return str(ipaddress.IPv6Address(addr)), port, last


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"service_id", "client", "addr", "port", "last_used_ns"}]."""
    rows = []
    for k, v in m.items():
        service_id, client = decode_key(k)
        addr, port, last = decode_value(v)
        rows.append({"service_id": service_id, "client": client, "addr": addr, "port": port,
                     "last_used_ns": last})
    return sorted(rows, key=lambda r: (r["service_id"], r["client"]))

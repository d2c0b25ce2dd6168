"""The `denied_sources` map: packets/bytes policy denied per (deciding rule counter,
source address) (bpf/include/denied_sources.h).

An LRU hash written by the programs on the deny path only; its size bounds the label sets
of Felix's `calico_denied_packets` / `calico_denied_bytes` {policy, srcIP}, which the BPF
dataplane reads from it at scrape time (`agent.dataplane.managers.bpf_metrics`).
"""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32


class Key(ctypes.Structure):
    """must match struct denied_key in bpf/include/denied_sources.h"""

    _fields_ = [("counter_id", ctypes.c_uint32), ("saddr", ctypes.c_uint32)]


class Value(ctypes.Structure):
    """must match struct denied_value in bpf/include/denied_sources.h"""

    _fields_ = [("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


PARAMS = MapParams(
    name="denied_sources", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=4096, version=1, header="denied_sources.h",
)

_KEY = struct.Struct("=II")
_VALUE = struct.Struct("=QQ")


def encode_key(counter_id: int, source: str) -> bytes:
    return _KEY.pack(counter_id, ip_to_be32(source))


def decode_key(raw: bytes) -> tuple[int, str]:
    counter_id, saddr = _KEY.unpack(raw)
    return counter_id, be32_to_ip(saddr)


def decode_value(raw: bytes) -> tuple[int, int]:
    packets, nbytes = _VALUE.unpack(raw)
    return packets, nbytes


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"counter_id", "source", "packets", "bytes"}], by counter then source."""
    rows = []
    for k, v in m.items():
        counter_id, source = decode_key(k)
        packets, nbytes = decode_value(v)
        rows.append({"counter_id": counter_id, "source": source, "packets": packets,
                     "bytes": nbytes})
    return sorted(rows, key=lambda r: (r["counter_id"], r["source"]))

"""The `nat_counters` map: what the service NAT did (bpf/include/nat_counters.h), one
per-CPU u64 per reason; reading sums the CPUs."""

from __future__ import annotations

import ctypes
import enum
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, percpu_slots


class NatCounter(enum.IntEnum):
    """must match NAT_CNT_* in bpf/include/nat_counters.h"""

    NEW_FLOWS = 0
    CT_HIT = 1
    REPLIES = 2
    AFFINITY_HIT = 3
    REJECTED = 4
    REJECT_FAILED = 5
    XLATE_FAILED = 6
    NO_BACKEND = 7
    NODEPORT_NEW = 8
    NODEPORT_SNAT = 9
    SNAT_NO_PORT = 10
    NO_ROUTE = 11


PARAMS = MapParams(
    name="nat_counters", map_type=MapType.PERCPU_ARRAY, key_type=ctypes.c_uint32,
    value_type=ctypes.c_uint64, max_entries=16, version=2, header="nat_counters.h",
)

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")


def read(m: BpfMap) -> dict[str, int]:
    """{"new_flows": n, ...} summed over CPUs."""
    out = {}
    for c in NatCounter:
        raw = m.lookup(_U32.pack(int(c)))
        total = 0
        if raw:
            for slot in percpu_slots(m.params, raw, m.ncpus):
                total += _U64.unpack(slot[:8])[0]
        out[c.name.lower()] = total
    return out


def dump(m: BpfMap) -> list[dict]:
    return [{"counter": k, "value": v} for k, v in read(m).items()]

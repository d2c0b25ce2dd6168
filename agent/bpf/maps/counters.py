"""The counter maps (bpf/include/counters.h): per-CPU arrays the programs only add to.

- `rule_counters[counter_id]`: packets/bytes per rule (ids map kind RULE names the rule);
- `ep_counters[endpoint_id]`: allowed/denied packets and bytes per endpoint and POD direction;
- `ep_spoofed[endpoint_id]`: the packets/bytes it sent from a source it may not use (dropped
  by the RPF check; a map of its own so ep_counters stays one cache line per entry);
- `global_counters[GlobalCounter]`: why packets took their path (each drop reason: spoofed
  source, IPv6 not policed, unknown protocol, no endpoint, policy...; conntrack hits,
  tail-call failures...).
Reading sums the per-CPU slots. Counters are never reset by the programs; Python may zero an
id's slot when it allocates the id to a new owner.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, percpu_slots


class GlobalCounter(enum.IntEnum):
    """must match GCNT_* in bpf/include/counters.h"""

    UNKNOWN_PROTO_DROPPED = 0
    MALFORMED_DROPPED = 1
    NO_ENDPOINT_DROPPED = 2
    ADMIN_DOWN_DROPPED = 3
    CT_HIT = 4
    CT_RELATED = 5
    CT_EXPIRED = 6
    CT_CREATED = 7
    CT_CREATE_FAILED = 8
    POLICY_ALLOWED = 9
    POLICY_DENIED = 10
    TAIL_CALL_FAILED = 11
    BAD_RULE_INDEX = 12
    EP_TO_HOST_DROPPED = 13
    FRAGMENTS = 14
    XDP_DROPPED = 15
    XDP_PASSED = 16
    CLASSIFIER_STEPS = 17
    SPOOFED_DROPPED = 18
    IPV6_DROPPED = 19
    IPV6_ND_PASSED = 20
    ARP_PASSED = 21
    HEP_RPF_DROPPED = 22
    CLASSIFIER_ERROR = 23
    FASTPATH_REDIRECTED = 24
    FASTPATH_TTL_EXPIRED = 25
    IPV6_EXT_DROPPED = 26
    IPV6_PACKETS = 27
    FLOW_EVENTS = 28
    FLOW_EVENTS_DROPPED = 29
    TUNNEL_FROM_WEP_DROPPED = 30


EP_DIRECTIONS = ("ingress_allowed", "ingress_denied", "egress_allowed", "egress_denied")


class RuleCounter(ctypes.Structure):
    """must match struct rule_counter in bpf/include/counters.h"""

    _fields_ = [("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class EpCounter(ctypes.Structure):
    """must match struct ep_counter in bpf/include/counters.h"""

    _fields_ = [("packets", ctypes.c_uint64 * 4), ("bytes", ctypes.c_uint64 * 4)]


RULE_COUNTERS = MapParams(
    name="rule_counters", map_type=MapType.PERCPU_ARRAY, key_type=ctypes.c_uint32,
    value_type=RuleCounter, max_entries=16384, version=1, header="counters.h",
)
EP_COUNTERS = MapParams(
    name="ep_counters", map_type=MapType.PERCPU_ARRAY, key_type=ctypes.c_uint32,
    value_type=EpCounter, max_entries=16384, version=1, header="counters.h",
)
EP_SPOOFED = MapParams(
    name="ep_spoofed", map_type=MapType.PERCPU_ARRAY, key_type=ctypes.c_uint32,
    value_type=RuleCounter, max_entries=16384, version=1, header="counters.h",
    sized_like="ep_counters",
)
GLOBAL_COUNTERS = MapParams(
    name="global_counters", map_type=MapType.PERCPU_ARRAY, key_type=ctypes.c_uint32,
    value_type=ctypes.c_uint64, max_entries=32, version=2, header="counters.h",
)

_U32 = struct.Struct("=I")


def encode_index(i: int) -> bytes:
    return _U32.pack(i)


def _sum_slots(m: BpfMap, raw: bytes, fmt: str) -> list[int]:
    s = struct.Struct(fmt)
    totals = [0] * len(s.unpack(bytes(s.size)))
    for slot in percpu_slots(m.params, raw, m.ncpus):
        for i, v in enumerate(s.unpack(slot)):
            totals[i] += v
    return totals


def read_rule(m: BpfMap, counter_id: int) -> tuple[int, int]:
    """(packets, bytes) of one rule counter, summed over CPUs."""
    raw = m.lookup(encode_index(counter_id))
    return tuple(_sum_slots(m, raw, "=QQ")) if raw else (0, 0)  # type: ignore[return-value]


def read_endpoint(m: BpfMap, endpoint_id: int) -> dict[str, dict[str, int]]:
    """{"ingress_allowed": {"packets": n, "bytes": n}, ...} summed over CPUs."""
    raw = m.lookup(encode_index(endpoint_id))
    vals = _sum_slots(m, raw, "=8Q") if raw else [0] * 8
    return {d: {"packets": vals[i], "bytes": vals[4 + i]} for i, d in enumerate(EP_DIRECTIONS)}


def read_globals(m: BpfMap) -> dict[str, int]:
    """{"ct_hit": n, ...} for every GlobalCounter, summed over CPUs."""
    out = {}
    for c in GlobalCounter:
        raw = m.lookup(encode_index(int(c)))
        out[c.name.lower()] = _sum_slots(m, raw, "=Q")[0] if raw else 0
    return out


def zero_index(m: BpfMap, index: int) -> None:
    """Reset one slot (when an id is given to a new owner)."""
    m.update(encode_index(index), bytes(m.value_blob_size))


def open_pinned(params: MapParams, pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(params, pin_dir)


def dump_rules(m: BpfMap) -> list[dict]:
    """Non-zero rule counters: [{"counter_id": n, "packets": n, "bytes": n}]."""
    rows = []
    for k, v in m.items():
        packets, nbytes = _sum_slots(m, v, "=QQ")
        if packets or nbytes:
            rows.append({"counter_id": _U32.unpack(k)[0], "packets": packets, "bytes": nbytes})
    return sorted(rows, key=lambda r: r["counter_id"])


def dump_endpoints(m: BpfMap) -> list[dict]:
    """Non-zero endpoint counters: [{"endpoint_id": n, "ingress_allowed_packets": n, ...}]."""
    rows = []
    for k, v in m.items():
        vals = _sum_slots(m, v, "=8Q")
        if any(vals):
            row: dict = {"endpoint_id": _U32.unpack(k)[0]}
            for i, d in enumerate(EP_DIRECTIONS):
                row[f"{d}_packets"] = vals[i]
                row[f"{d}_bytes"] = vals[4 + i]
            rows.append(row)
    return sorted(rows, key=lambda r: r["endpoint_id"])


def dump_spoofed(m: BpfMap) -> list[dict]:
    """Non-zero spoofed-source drops: [{"endpoint_id": n, "packets": n, "bytes": n}]."""
    return [{"endpoint_id": r["counter_id"], "packets": r["packets"], "bytes": r["bytes"]}
            for r in dump_rules(m)]


def dump_globals(m: BpfMap) -> list[dict]:
    return [{"counter": k, "value": v} for k, v in read_globals(m).items()]

"""The `flow_events` ring buffer's records (bpf/include/flow_events.h): one per policy
decision of the tc programs, rate-limited in the kernel (GCNT_FLOW_EVENTS_DROPPED counts
what was not sent). Not a pinned map: the agent reads its own build's ring buffer through
BCC (`agent.dataplane.managers.flow_logs`); this module only decodes the records.
"""

from __future__ import annotations

import ctypes
import struct

from pyfelix.agent.bpf.maps.base import PfAddr, addr16_to_ip

HOOK_FROM_WEP = 0  # the source pod's egress policy decided
HOOK_TO_WEP = 1  # the destination pod's ingress policy decided


class Event(ctypes.Structure):
    """must match struct flow_event in bpf/include/flow_events.h"""

    _fields_ = [("ts_ns", ctypes.c_uint64), ("src", PfAddr), ("dst", PfAddr),
                ("sport", ctypes.c_uint16), ("dport", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("hook", ctypes.c_uint8),
                ("allowed", ctypes.c_uint8), ("family", ctypes.c_uint8),
                ("counter_id", ctypes.c_uint32), ("endpoint_id", ctypes.c_uint32),
                ("len", ctypes.c_uint32)]


_EVENT = struct.Struct("=Q16s16sHHBBBBIII")
SIZE = ctypes.sizeof(Event)  # the C struct, 4 bytes of tail padding included


def decode(raw: bytes) -> dict:
    """{"ts_ns", "src", "dst", "sport", "dport", "proto", "hook", "allowed", "family",
    "counter_id", "endpoint_id", "len"} (addresses as text of their family)."""
    (ts, src, dst, sport, dport, proto, hook, allowed, family, counter_id, endpoint_id,
     length) = _EVENT.unpack_from(raw)
    return {"ts_ns": ts, "src": addr16_to_ip(family, src), "dst": addr16_to_ip(family, dst),
            "sport": sport, "dport": dport, "proto": proto, "hook": hook,
            "allowed": bool(allowed), "family": family, "counter_id": counter_id,
            "endpoint_id": endpoint_id, "len": length}

"""The `verdict_trace` map: the policy decision of the last `pyfelix explain` packet
(bpf/include/verdict_trace.h).

One array entry. The tc programs write it only for a packet whose skb->mark is `MARK_TRACE`
(BPF_PROG_TEST_RUN by `agent.bpf.explain`; such a packet counts nothing and creates no
conntrack entry); `reason` 0 means not written (the verdict came before policy). Read and
zeroed by `agent.bpf.explain`, never by the agent.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

MARK_TRACE = 0x7E5A1C0D  # must match PF_MARK_TRACE


class Reason(enum.IntEnum):
    """must match VT_* in bpf/include/verdict_trace.h"""

    NONE = 0
    RULE = 1
    NO_MATCH = 2
    EP_TO_HOST = 3


class Value(ctypes.Structure):
    """must match struct verdict_trace in bpf/include/verdict_trace.h"""

    _fields_ = [("chain_start", ctypes.c_uint32), ("chain_len", ctypes.c_uint32),
                ("record", ctypes.c_uint32), ("counter_id", ctypes.c_uint32),
                ("endpoint_id", ctypes.c_uint32), ("hook", ctypes.c_uint8),
                ("allowed", ctypes.c_uint8), ("reason", ctypes.c_uint8),
                ("pad", ctypes.c_uint8)]


PARAMS = MapParams(
    name="verdict_trace", map_type=MapType.ARRAY, key_type=ctypes.c_uint32, value_type=Value,
    max_entries=1, version=1, header="verdict_trace.h",
)

KEY = struct.pack("=I", 0)
EMPTY = bytes(ctypes.sizeof(Value))
_VALUE = struct.Struct("=IIIIIBBBB")


def decode_value(raw: bytes) -> dict:
    (chain_start, chain_len, record, counter_id, endpoint_id, hook, allowed, reason,
     _) = _VALUE.unpack(raw)
    return {"chain_start": chain_start, "chain_len": chain_len, "record": record,
            "counter_id": counter_id, "endpoint_id": endpoint_id, "hook": hook,
            "allowed": bool(allowed), "reason": Reason(reason).name.lower()}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    raw = m.lookup(KEY)
    if raw is None or raw == EMPTY:
        return []
    return [decode_value(raw)]

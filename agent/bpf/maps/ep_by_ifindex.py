"""The `ep_by_ifindex` map: an array mirror of `endpoints` for small ifindexes
(bpf/include/endpoints.h).

Role: the established-packet path looks its endpoint up by ifindex on every packet. A hash
lookup costs ~27 ns on this machine kind; an array lookup is inlined by the verifier (a few
ns). So every endpoint whose ifindex is below this array's size is ALSO written here, its
value flagged FLAG_PRESENT; `lookup_endpoint()` in the C takes a PRESENT slot and otherwise
falls back to the `endpoints` hash (larger ifindexes, or a slot not written yet).

Invariants (kept by the BPF policy manager, which writes both maps): a PRESENT slot always
equals the hash entry of that ifindex plus FLAG_PRESENT, it is written in the same phase as
the hash entry (adds/changes), and it is cleared (all zeros) in the same phase as the hash
entry's delete. The hash stays the map of record: adoption after a restart, dumps and
`pyfelix bpf endpoints` read it. Key = ifindex (u32); value = struct endpoint_value.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Mapping

from pyfelix.agent.bpf.maps import endpoints
from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

FLAG_PRESENT = 0x02  # must match EP_F_PRESENT

PARAMS = MapParams(
    name="ep_by_ifindex", map_type=MapType.ARRAY, key_type=ctypes.c_uint32,
    value_type=endpoints.Value, max_entries=65536, version=1, header="endpoints.h",
)

EMPTY = bytes(ctypes.sizeof(endpoints.Value))
_INDEX = struct.Struct("=I")
_FLAGS = struct.Struct("=I")  # the second u32 of struct endpoint_value


def encode_index(ifindex: int) -> bytes:
    return _INDEX.pack(ifindex)


def decode_index(raw: bytes) -> int:
    return _INDEX.unpack(raw)[0]


def slots_for(endpoint_entries: Mapping[bytes, bytes], size: int) -> dict[bytes, bytes]:
    """The PRESENT slots mirroring `endpoint_entries` (endpoints-map key -> value) for every
    ifindex below `size`."""
    slots: dict[bytes, bytes] = {}
    for key, value in endpoint_entries.items():
        ifindex = endpoints.decode_key(key)
        if ifindex < size:
            flags = _FLAGS.unpack_from(value, 4)[0] | FLAG_PRESENT
            slots[encode_index(ifindex)] = value[:4] + _FLAGS.pack(flags) + value[8:]
    return slots


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """The PRESENT slots, as `endpoints.dump` rows, sorted by ifindex."""
    rows = [{"ifindex": decode_index(k), **endpoints.decode_value(v)} for k, v in m.items()
            if _FLAGS.unpack_from(v, 4)[0] & FLAG_PRESENT]
    return sorted(rows, key=lambda r: r["ifindex"])

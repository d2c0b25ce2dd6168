"""The `cls_chains` map: chain start -> its classifier instance (bpf/include/classifier.h).

Key = the chain's start index in the `rules` array (u32); value = the instance (u32), which
is the base of the instance's block in `cls_words`; 0 = no classifier (the programs drop,
GCNT_CLASSIFIER_ERROR). An array sized like `rules` (a chain start is a rules index).
Written by the BPF policy manager after the instance's whole block and lookup entries, and
before any endpoint points at the chain; one u32 store switches a chain to a new instance.
"""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

PARAMS = MapParams(
    name="cls_chains", map_type=MapType.ARRAY, key_type=ctypes.c_uint32,
    value_type=ctypes.c_uint32, max_entries=32768, version=1, header="classifier.h",
    sized_like="rules",
)

_U32 = struct.Struct("=I")
EMPTY = _U32.pack(0)


def encode_index(start: int) -> bytes:
    return _U32.pack(start)


def encode_value(instance: int) -> bytes:
    return _U32.pack(instance)


def decode_u32(raw: bytes) -> int:
    return _U32.unpack(raw)[0]


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """Chains that have a classifier: [{"chain_start", "instance"}], by start."""
    rows = [{"chain_start": decode_u32(k), "instance": decode_u32(v)} for k, v in m.items()
            if decode_u32(v)]
    return sorted(rows, key=lambda r: r["chain_start"])

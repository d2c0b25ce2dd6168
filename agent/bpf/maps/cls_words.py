"""The `cls_words` map: every classifier instance's block of u64 words
(bpf/include/classifier.h): the instance header, then its sparse bitvectors.

Block of an instance at base B: word B = n_words | flags << 32; words B+1..B+4 = the seven
fields' fixed/default vector ids (two u32 per word, even field in the low half) and, in
the last high half, the block's size in words (for adoption after a restart); then the
vectors, each [summary x S][rank x S][non-zero words], S = ceil(n_words / 64). Instance ids
are block bases (never 0). Written whole before `cls_chains` points a chain at it.
`dump()` decodes the headers of the blocks `cls_chains` references (the vectors are opaque
bits; `pyfelix bpf cls_words dump` shows sizes).
"""

from __future__ import annotations

import ctypes
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

HEADER_WORDS = 5
VEC_ALL = 0xFFFFFFFF  # must match CLS_VEC_ALL
FIELDS = ("l4", "sport", "dport", "saddr", "daddr", "snamed", "dnamed")  # CLS_F_* order

PARAMS = MapParams(
    name="cls_words", map_type=MapType.ARRAY, key_type=ctypes.c_uint32,
    value_type=ctypes.c_uint64, max_entries=1048576, version=1, header="classifier.h",
)

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")


def encode_index(i: int) -> bytes:
    return _U32.pack(i)


def encode_word(w: int) -> bytes:
    return _U64.pack(w)


def decode_word(raw: bytes) -> int:
    return _U64.unpack(raw)[0]


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def read_header(m: BpfMap, base: int) -> dict:
    words = []
    for i in range(HEADER_WORDS):
        raw = m.lookup(encode_index(base + i))
        words.append(decode_word(raw) if raw is not None else 0)
    fixed = []
    for i in range(len(FIELDS)):
        w = words[1 + i // 2]
        fixed.append((w >> 32) & 0xFFFFFFFF if i % 2 else w & 0xFFFFFFFF)
    flags = words[0] >> 32
    return {"instance": base, "n_words": words[0] & 0xFFFFFFFF,
            "block_words": words[HEADER_WORDS - 1] >> 32,
            "looked_up": [f for i, f in enumerate(FIELDS) if flags >> i & 1],
            "fixed": {f: ("all" if v == VEC_ALL else v) for f, v in zip(FIELDS, fixed,
                                                                        strict=True)}}


def dump(m: BpfMap, instances: list[int] | None = None) -> list[dict]:
    """Headers of `instances` (default: none known without cls_chains; the CLI passes
    them)."""
    return [read_header(m, base) for base in sorted(set(instances or []))]

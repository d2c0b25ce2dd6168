"""The `nat_vip_filter` map: one bit per hash of a service VIP (bpf/include/nat_vip_filter.h),
so packets to addresses that are no VIP skip the frontend hash lookup. Written by
`BpfNatManager` (bits set before a frontend is written, cleared after it is gone)."""

from __future__ import annotations

import ctypes
import ipaddress
import struct
from collections.abc import Iterable

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

PARAMS = MapParams(
    name="nat_vip_filter", map_type=MapType.ARRAY, key_type=ctypes.c_uint32,
    value_type=ctypes.c_uint64, max_entries=1024, version=1, header="nat_vip_filter.h",
)

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")


def bit_of(vip: str, words: int) -> int:
    """The filter bit of `vip` (must match nat_maybe_vip in the header)."""
    return (((int(ipaddress.IPv4Address(vip)) * 2654435761) & 0xFFFFFFFF) >> 16) % (words * 64)


def contents(vips: Iterable[str], words: int) -> dict[bytes, bytes]:
    """The whole array for these VIPs: every word, zero where no VIP has a bit."""
    values = [0] * words
    for vip in vips:
        bit = bit_of(vip, words)
        values[bit // 64] |= 1 << (bit % 64)
    return {_U32.pack(i): _U64.pack(v) for i, v in enumerate(values)}


def dump(m: BpfMap) -> list[dict]:
    """The non-zero words: [{"word": i, "bits": [bit numbers set]}]."""
    rows = []
    for k, v in m.items():
        word, value = _U32.unpack(k)[0], _U64.unpack(v)[0]
        if value:
            rows.append({"word": word, "bits": [word * 64 + b for b in range(64)
                                                if value >> b & 1]})
    return sorted(rows, key=lambda r: r["word"])

"""The `wep_sources` map: the source prefixes each workload may send from
(bpf/include/sources.h).

Key = (ifindex of the workload's host-side interface, source prefix); the value is reserved.
The compiler writes, per programmed workload endpoint, its IPv4 `ipNetworks` and IPv4
`allowSpoofedSourcePrefixes`; calico_from_wep drops an IPv4 packet whose source matches none
of its interface's entries (global counter `spoofed_dropped`, the endpoint's `ep_spoofed`
entry).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32

KEY_FIXED_BITS = 32  # must match WEP_SOURCE_KEY_FIXED_BITS


class Key(ctypes.Structure):
    """must match struct wep_source_key in bpf/include/sources.h"""

    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("saddr", ctypes.c_uint32),
    ]


class Value(ctypes.Structure):
    """must match struct wep_source_value in bpf/include/sources.h"""

    _fields_ = [("flags", ctypes.c_uint32)]


PARAMS = MapParams(
    name="wep_sources", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=65536, version=1, flags=1, header="sources.h",
)

_KEY = struct.Struct("=III")
_VALUE = struct.Struct("=I")
VALUE = _VALUE.pack(0)


def encode_key(ifindex: int, src: str | ipaddress.IPv4Network) -> bytes:
    net = ipaddress.IPv4Network(src, strict=False)
    return _KEY.pack(KEY_FIXED_BITS + net.prefixlen, ifindex, ip_to_be32(net.network_address))


def decode_key(raw: bytes) -> dict:
    plen, ifindex, addr = _KEY.unpack(raw)
    return {"ifindex": ifindex, "src": f"{be32_to_ip(addr)}/{plen - KEY_FIXED_BITS}"}


def entries_for(ifindex: int, prefixes: list[str]) -> dict[bytes, bytes]:
    """The map entries allowing `prefixes` (IPv4 CIDRs; IPv6 ones are skipped: IPv6 from a
    workload is dropped before this check) as sources on `ifindex`. Raises ValueError
    naming the prefix that does not parse."""
    out = {}
    for prefix in prefixes:
        net = ipaddress.ip_network(prefix, strict=False)
        if net.version == 4:
            out[encode_key(ifindex, net)] = VALUE
    return out


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    rows = [decode_key(k) for k, _ in m.items()]
    return sorted(rows, key=lambda r: (r["ifindex"], ipaddress.IPv4Network(r["src"])))

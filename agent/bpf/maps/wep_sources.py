"""The `wep_sources` map: the source prefixes each workload may send from
(bpf/include/sources.h).

Key = (ifindex of the workload's host-side interface, family, source prefix: 16 bytes, IPv4
in the first 4); the value is reserved. The compiler writes, per programmed workload
endpoint, its `ipNetworks` and `allowSpoofedSourcePrefixes` of both families;
calico_from_wep drops a packet whose source matches none of its interface's entries of its
family (global counter `spoofed_dropped`, the endpoint's `ep_spoofed` entry).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import (
    BpfMap,
    MapParams,
    MapType,
    PfAddr,
    addr16_to_ip,
    net16,
    net_sort_key,
    parse_net,
)

KEY_FIXED_BITS = 64  # must match WEP_SOURCE_KEY_FIXED_BITS


class Key(ctypes.Structure):
    """must match struct wep_source_key in bpf/include/sources.h"""

    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("family", ctypes.c_uint32),
        ("saddr", PfAddr),
    ]


class Value(ctypes.Structure):
    """must match struct wep_source_value in bpf/include/sources.h"""

    _fields_ = [("flags", ctypes.c_uint32)]


PARAMS = MapParams(
    name="wep_sources", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=65536, version=2, flags=1, header="sources.h",
)

_KEY = struct.Struct("=III16s")
_VALUE = struct.Struct("=I")
VALUE = _VALUE.pack(0)


def encode_key(ifindex: int,
               src: str | ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    net = parse_net(src)
    family, addr = net16(net)
    return _KEY.pack(KEY_FIXED_BITS + net.prefixlen, ifindex, family, addr)


def decode_key(raw: bytes) -> dict:
    plen, ifindex, family, addr = _KEY.unpack(raw)
    return {"ifindex": ifindex, "family": family,
            "src": f"{addr16_to_ip(family, addr)}/{plen - KEY_FIXED_BITS}"}


def entries_for(ifindex: int, prefixes: list[str]) -> dict[bytes, bytes]:
    """The map entries allowing `prefixes` (CIDRs of either family) as sources on
    `ifindex`. Raises ValueError naming the prefix that does not parse."""
    out = {}
    for prefix in prefixes:
        out[encode_key(ifindex, ipaddress.ip_network(prefix, strict=False))] = VALUE
    return out


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    rows = [decode_key(k) for k, _ in m.items()]
    return sorted(rows, key=lambda r: (r["ifindex"], net_sort_key(r["src"])))

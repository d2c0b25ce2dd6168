"""The `untracked` map: XDP early-drop prefixes per host interface (bpf/include/untracked.h).

Key = (ifindex, source prefix); ifindex 0 applies to every interface running calico_xdp.
Value = the counter id of the deny rule it came from. Filled by the compiler from the
leading source-only deny rules of host endpoints' untracked (doNotTrack) inbound policy.
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

KEY_FIXED_BITS = 64  # must match UNTRACKED_KEY_FIXED_BITS


class Key(ctypes.Structure):
    """must match struct untracked_key in bpf/include/untracked.h"""

    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("family", ctypes.c_uint32),
        ("saddr", PfAddr),
    ]


class Value(ctypes.Structure):
    """must match struct untracked_value in bpf/include/untracked.h"""

    _fields_ = [("counter_id", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


PARAMS = MapParams(
    name="untracked", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=65536, version=2, flags=1, header="untracked.h",
)

_KEY = struct.Struct("=III16s")
_VALUE = struct.Struct("=II")


def encode_key(ifindex: int,
               src: str | ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    net = parse_net(src)
    family, addr = net16(net)
    return _KEY.pack(KEY_FIXED_BITS + net.prefixlen, ifindex, family, addr)


def decode_key(raw: bytes) -> dict:
    plen, ifindex, family, addr = _KEY.unpack(raw)
    return {"ifindex": ifindex, "family": family,
            "src": f"{addr16_to_ip(family, addr)}/{plen - KEY_FIXED_BITS}"}


def encode_value(counter_id: int) -> bytes:
    return _VALUE.pack(counter_id, 0)


def decode_value(raw: bytes) -> dict:
    counter_id, _flags = _VALUE.unpack(raw)
    return {"counter_id": counter_id}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (r["ifindex"], net_sort_key(r["src"])))

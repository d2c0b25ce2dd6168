"""The `cls_tries` map: per classifier instance, LPM lookups of addresses, named ports and
ports -> vector id (bpf/include/classifier.h, fields SADDR/DADDR/SNAMED/DNAMED/SPORT/DPORT).

Key = {prefixlen, instance, side, proto, port, addr (16 bytes)}; the first 64 bits after
prefixlen (instance, side, proto, port) always match exactly (prefixlen = 64 + prefix
length), so a lookup only ever finds entries of its own instance and side. One trie keyed by
family: an IPv6 address entry has SIDE_V6 in its side byte (IPv4 addresses use the first 4
bytes of addr, the rest 0). Address sides (proto = port =
0) hold the member prefixes of the sets the chain checks on that side; named-port sides
carry the member's protocol and port; port sides put the port in the address's first 16
bits (network order), so a port prefix is an address prefix. A miss means the field's
default vector (in the instance header).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr

FIXED_BITS = 64  # must match CLS_TRIE_FIXED_BITS
SIDE_SADDR = 0  # must match CLS_SIDE_*
SIDE_DADDR = 1
SIDE_SNAMED = 2
SIDE_DNAMED = 3
SIDE_SPORT = 4
SIDE_DPORT = 5
SIDE_V6 = 0x80  # must match CLS_SIDE_V6
SIDE_NAMES = {0: "saddr", 1: "daddr", 2: "snamed", 3: "dnamed", 4: "sport", 5: "dport"}
LPM_F_NO_PREALLOC = 1


class Key(ctypes.Structure):
    """must match struct cls_trie_key"""

    _fields_ = [("prefixlen", ctypes.c_uint32), ("instance", ctypes.c_uint32),
                ("side", ctypes.c_uint8), ("proto", ctypes.c_uint8),
                ("port", ctypes.c_uint16), ("addr", PfAddr)]


class Value(ctypes.Structure):
    """must match struct cls_vec_value"""

    _fields_ = [("vec", ctypes.c_uint32)]


PARAMS = MapParams(
    name="cls_tries", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=1048576, version=2, flags=LPM_F_NO_PREALLOC, header="classifier.h",
)

_KEY = struct.Struct("=IIBBH16s")
_VALUE = struct.Struct("=I")


def encode_key(instance: int, side: int, proto: int, port: int, addr: int, plen: int) -> bytes:
    """addr: the address as an integer (10.0.0.1 = 0x0a000001; IPv6: the 128-bit value,
    with SIDE_V6 in `side`); written in network order. For port sides addr = port << 16."""
    raw = addr.to_bytes(16 if side & SIDE_V6 else 4, "big")
    return _KEY.pack(FIXED_BITS + plen, instance, side, proto, port, raw)


def decode_key(raw: bytes) -> dict:
    prefixlen, inst, side, proto, port, addr = _KEY.unpack(raw)
    plen = prefixlen - FIXED_BITS
    v6 = bool(side & SIDE_V6)
    side &= ~SIDE_V6
    row: dict = {"instance": inst, "side": SIDE_NAMES.get(side, str(side))}
    if side in (SIDE_SPORT, SIDE_DPORT):
        first = int.from_bytes(addr[:4], "big") >> 16
        row["ports"] = f"{first}-{first + (1 << (16 - plen)) - 1}" if plen < 16 else str(first)
    else:
        ip = ipaddress.IPv6Address(addr) if v6 else ipaddress.IPv4Address(addr[:4])
        row["family"] = 6 if v6 else 4
        row["prefix"] = f"{ip}/{plen}"
        if side in (SIDE_SNAMED, SIDE_DNAMED):
            row["proto"], row["port"] = proto, port
    return row


def encode_value(vec: int) -> bytes:
    return _VALUE.pack(vec)


def decode_value(raw: bytes) -> int:
    return _VALUE.unpack(raw)[0]


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    rows = [{**decode_key(k), "vec": decode_value(v)} for k in m.iter_keys()
            if (v := m.lookup(k)) is not None]
    return sorted(rows, key=lambda r: (r["instance"], r["side"], str(r.get("prefix", "")),
                                       str(r.get("ports", ""))))

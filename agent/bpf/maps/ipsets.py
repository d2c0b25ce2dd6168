"""The `ipsets` map: every IP set's members in one LPM trie (bpf/include/ipsets.h).

Key = (set id, proto, family, port, prefix: 16 bytes, IPv4 in the first 4), trie
prefixlen = 64 + address prefix length, so a lookup can only match members of its own set
and family (one trie keyed by family). "net" sets have proto = port = 0; "ip_port"
(named port) sets carry the member's protocol and port. Numeric set ids come from the ids
map (agent.bpf.maps.ids); 0 means "no set" and is never used.

Members are the calc graph's strings: "10.0.0.0/24", "10.0.0.1" (= /32),
"10.0.0.1/32,tcp:8080", "fd00::/64", "fd00::1,tcp:8080" (both families); malformed
members raise ValueError naming them.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr, addr16_to_ip, net16

KEY_FIXED_BITS = 64  # must match IPSET_KEY_FIXED_BITS
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}


class Key(ctypes.Structure):
    """must match struct ipset_key in bpf/include/ipsets.h"""

    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("set_id", ctypes.c_uint32),
        ("proto", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("port", ctypes.c_uint16),
        ("addr", PfAddr),  # network byte order; IPv4 in the first 4 bytes
    ]


class Value(ctypes.Structure):
    """must match struct ipset_value in bpf/include/ipsets.h"""

    _fields_ = [("flags", ctypes.c_uint32)]


PARAMS = MapParams(
    name="ipsets", map_type=MapType.LPM_TRIE, key_type=Key, value_type=Value,
    max_entries=1 << 20, version=2, flags=1, header="ipsets.h",
)

VALUE = bytes(Value())
_KEY = struct.Struct("=IIBBH16s")


def parse_member(member: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int, int]:
    """'cidr[,proto:port]' -> (network, proto number, port). Raises ValueError."""
    text = member.strip()
    proto = port = 0
    if "," in text:
        text, _, pp = text.partition(",")
        pname, _, pstr = pp.partition(":")
        if pname.lower() not in PROTOCOLS:
            raise ValueError(f"IP set member {member!r}: unknown protocol {pname!r}")
        proto = PROTOCOLS[pname.lower()]
        if not pstr.isdigit() or not 0 <= int(pstr) <= 65535:
            raise ValueError(f"IP set member {member!r}: bad port {pstr!r}")
        port = int(pstr)
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError as e:
        raise ValueError(f"IP set member {member!r}: {e}") from None
    return net, proto, port


def key_for(set_id: int, net: ipaddress.IPv4Network | ipaddress.IPv6Network, proto: int = 0,
            port: int = 0) -> bytes:
    family, addr = net16(net)
    return _KEY.pack(KEY_FIXED_BITS + net.prefixlen, set_id, proto, family, port, addr)


def _fast_v4_key(set_id: int, member: str) -> bytes | None:
    """The key of a plain "a.b.c.d[/n]" member without the ipaddress module (about 20x
    faster: IP sets reach hundreds of thousands of members), or None if `member` is
    anything else (the general path then parses it or reports it)."""
    addr, slash, plen_text = member.partition("/")
    try:
        packed = socket.inet_pton(socket.AF_INET, addr)  # strict dotted quad only
    except OSError:
        return None
    if slash:
        if not plen_text.isdigit() or len(plen_text) > 2:
            return None
        plen = int(plen_text)
        if plen > 32:
            return None
    else:
        plen = 32
    value = int.from_bytes(packed, "big") & ((0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF)
    return _KEY.pack(KEY_FIXED_BITS + plen, set_id, 0, 4, 0, value.to_bytes(4, "big"))


def member_key(set_id: int, member: str) -> bytes | None:
    """The trie key of one member string (either family)."""
    if "," not in member and ":" not in member:
        key = _fast_v4_key(set_id, member.strip())
        if key is not None:
            return key
    net, proto, port = parse_member(member)
    return key_for(set_id, net, proto, port)


def decode_key(raw: bytes) -> dict:
    prefixlen, set_id, proto, family, port, addr = _KEY.unpack(raw)
    plen = prefixlen - KEY_FIXED_BITS
    member = f"{addr16_to_ip(family, addr)}/{plen}"
    if proto:
        member += f",{PROTOCOL_NAMES.get(proto, str(proto))}:{port}"
    return {"set_id": set_id, "family": family, "member": member}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"set_id": n, "family": 4, "member": "10.0.0.1/32[,tcp:80]"}], sorted by set id,
    family, then member."""
    rows = [decode_key(k) for k, _ in m.items()]
    return sorted(rows, key=lambda r: (r["set_id"], r["family"], r["member"]))

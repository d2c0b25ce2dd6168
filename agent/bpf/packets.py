"""Packet builders for BPF_PROG_TEST_RUN: Ethernet + IPv4 + TCP/UDP/SCTP/ICMP, Ethernet +
IPv6 (with extension headers: hop-by-hop, routing, destination options, fragment, AH, or
any type number) + TCP/UDP/ICMPv6, and ARP frames. Pure functions returning bytes; IPv4
header checksums are correct, L4 checksums are left 0 (the programs never check them).

Inputs are address strings and ints; a bad address raises ValueError (ipaddress).
"""

from __future__ import annotations

import ipaddress
import struct

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ARP = 0x0806
SRC_MAC = bytes.fromhex("02000000aa01")
DST_MAC = bytes.fromhex("02000000bb02")

TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10
_TCP_FLAG_LETTERS = {"F": TCP_FIN, "S": TCP_SYN, "R": TCP_RST, "P": TCP_PSH, "A": TCP_ACK}


def ethernet(ethertype: int, payload: bytes) -> bytes:
    return DST_MAC + SRC_MAC + struct.pack("!H", ethertype) + payload


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of `data`: 0 over a header with its checksum in place."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_header(src: str, dst: str, proto: int, payload_len: int, *, ttl: int = 64,
                frag_off: int = 0, options: bytes = b"") -> bytes:
    """An IPv4 header; frag_off is the raw 16-bit field (flags << 13 | offset)."""
    if len(options) % 4:
        raise ValueError("IPv4 options must be a multiple of 4 bytes")
    ihl = 5 + len(options) // 4
    hdr = struct.pack(
        "!BBHHHBBH4s4s", (4 << 4) | ihl, 0, ihl * 4 + payload_len, 0x1234, frag_off, ttl,
        proto, 0, ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed,
    ) + options
    csum = checksum(hdr)
    return hdr[:10] + struct.pack("!H", csum) + hdr[12:]


def ipv4(src: str, dst: str, proto: int, l4: bytes, **kw: object) -> bytes:
    """Ethernet + IPv4 + the given L4 bytes."""
    return ethernet(ETH_P_IP, ipv4_header(src, dst, proto, len(l4), **kw) + l4)  # type: ignore[arg-type]


def tcp_flags(flags: str | int) -> int:
    if isinstance(flags, int):
        return flags
    out = 0
    for letter in flags.upper():
        out |= _TCP_FLAG_LETTERS[letter]
    return out


def tcp_segment(sport: int, dport: int, flags: str | int = "S", payload: bytes = b"") -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1000, 0, 5 << 4, tcp_flags(flags),
                       65535, 0, 0) + payload


def tcp(src: str, dst: str, sport: int, dport: int, flags: str | int = "S",
        payload: bytes = b"", **kw: object) -> bytes:
    return ipv4(src, dst, 6, tcp_segment(sport, dport, flags, payload), **kw)


def udp(src: str, dst: str, sport: int, dport: int, payload: bytes = b"x", **kw: object) -> bytes:
    return ipv4(src, dst, 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload,
                **kw)


def sctp(src: str, dst: str, sport: int, dport: int, **kw: object) -> bytes:
    # common header (ports, verification tag, checksum) + an empty DATA-less INIT stub
    return ipv4(src, dst, 132, struct.pack("!HHII", sport, dport, 0, 0) + bytes(4), **kw)


def icmp(src: str, dst: str, icmp_type: int = 8, code: int = 0, ident: int = 7,
         seq: int = 1, payload: bytes = b"ping", **kw: object) -> bytes:
    body = struct.pack("!BBHHH", icmp_type, code, 0, ident, seq) + payload
    return ipv4(src, dst, 1, body, **kw)


def icmp_error(src: str, dst: str, inner: bytes, icmp_type: int = 3, code: int = 3,
               **kw: object) -> bytes:
    """An ICMP error from src to dst quoting `inner` (an Ethernet frame as built here: its
    IP header and first 8 L4 bytes are quoted)."""
    ip_start = 14
    ihl = (inner[ip_start] & 0x0F) * 4
    quoted = inner[ip_start: ip_start + ihl + 8]
    body = struct.pack("!BBHI", icmp_type, code, 0, 0) + quoted
    return ipv4(src, dst, 1, body, **kw)


# IPv6 extension header types
EXT_HOP_BY_HOP, EXT_ROUTING, EXT_FRAGMENT, EXT_AH, EXT_DSTOPTS = 0, 43, 44, 51, 60


def ext_fragment(offset: int = 0, more: bool = False, ident: int = 0x1234) -> tuple[int, bytes]:
    """A fragment header's (type, body after the next-header byte); offset in bytes (a
    multiple of 8)."""
    if offset % 8:
        raise ValueError("fragment offsets are multiples of 8 bytes")
    return EXT_FRAGMENT, struct.pack("!BHI", 0, offset | int(more), ident)


def ext_header(kind: int, units: int = 1) -> tuple[int, bytes]:
    """An extension header of type `kind`, filled with padding (PadN / zeros): AH is
    4 * (units + 2) bytes (its Payload Len = units), any other type 8 * units bytes (Hdr Ext
    Len = units - 1)."""
    if kind == EXT_AH:
        size = 4 * (units + 2)  # Payload Len = units
        return kind, struct.pack("!B", units) + bytes(size - 2)
    size = 8 * units
    body = struct.pack("!B", units - 1) + bytes([1, size - 4]) + bytes(size - 4)
    return kind, body


def ipv6(src: str, dst: str, proto: int, l4: bytes, *, hop_limit: int = 64,
         ext: tuple[tuple[int, bytes], ...] = ()) -> bytes:
    """Ethernet + IPv6 + extension headers `ext` ((type, body after the next-header byte)
    each, in order, as ext_header / ext_fragment make them) + the L4 bytes of `proto`."""
    chain = b""
    types = [kind for kind, _ in ext] + [proto]
    for (_, body), nxt in zip(ext, types[1:], strict=True):
        chain += bytes([nxt]) + body
    payload = chain + l4
    hdr = struct.pack("!IHBB16s16s", 6 << 28, len(payload), types[0], hop_limit,
                      ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed)
    return ethernet(ETH_P_IPV6, hdr + payload)


def tcp6(src: str, dst: str, sport: int, dport: int, flags: str | int = "S",
         payload: bytes = b"", **kw: object) -> bytes:
    return ipv6(src, dst, 6, tcp_segment(sport, dport, flags, payload), **kw)  # type: ignore[arg-type]


def udp6(src: str, dst: str, sport: int, dport: int, payload: bytes = b"x",
         **kw: object) -> bytes:
    return ipv6(src, dst, 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload,
                **kw)  # type: ignore[arg-type]


def ipv6_udp(src: str, dst: str, sport: int, dport: int, payload: bytes = b"x") -> bytes:
    return udp6(src, dst, sport, dport, payload)


def icmp6(src: str, dst: str, icmp_type: int = 128, code: int = 0, ident: int = 7,
          seq: int = 1, payload: bytes = b"ping", **kw: object) -> bytes:
    """An ICMPv6 echo request (128) / reply (129), or any type with the same layout."""
    body = struct.pack("!BBHHH", icmp_type, code, 0, ident, seq) + payload
    return ipv6(src, dst, 58, body, **kw)  # type: ignore[arg-type]


def icmp6_error(src: str, dst: str, inner: bytes, icmp_type: int = 1, code: int = 4,
                **kw: object) -> bytes:
    """An ICMPv6 error from src to dst quoting `inner` (an IPv6 frame as built here without
    extension headers: its IPv6 header and first 8 L4 bytes are quoted)."""
    quoted = inner[14: 14 + 40 + 8]
    body = struct.pack("!BBHI", icmp_type, code, 0, 0) + quoted
    return ipv6(src, dst, 58, body, **kw)  # type: ignore[arg-type]


def icmpv6(src: str, dst: str, icmp_type: int, code: int = 0, *, hop_limit: int = 255,
           hop_by_hop: bool = False, body: bytes = bytes(20)) -> bytes:
    """An ICMPv6 message (checksum left 0: the programs do not check it); `hop_by_hop`
    puts an 8-byte hop-by-hop header (router alert) in front, as MLD reports carry."""
    l4 = struct.pack("!BBH", icmp_type, code, 0) + body
    next_header = 58
    if hop_by_hop:
        l4 = struct.pack("!BBHHH", 58, 0, 0x0502, 0, 0x0100) + l4  # router alert, PadN
        next_header = 0
    hdr = struct.pack("!IHBB16s16s", 6 << 28, len(l4), next_header, hop_limit,
                      ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed)
    return ethernet(ETH_P_IPV6, hdr + l4)


def raw_ethertype(ethertype: int, payload: bytes = bytes(46)) -> bytes:
    return ethernet(ethertype, payload)


def arp_request(sender: str, target: str) -> bytes:
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, SRC_MAC,
                       ipaddress.IPv4Address(sender).packed, bytes(6),
                       ipaddress.IPv4Address(target).packed)
    return ethernet(ETH_P_ARP, body)

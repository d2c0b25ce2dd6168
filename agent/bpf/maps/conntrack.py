"""The `conntrack` map: per-interface flow table, LRU hash (bpf/include/conntrack.h).

Key = (ifindex, 5-tuple normalised so side A is the smaller (address, port) as host-order
numbers, family). Both families in one map: addresses are 16 bytes (IPv4 in the first 4).
Value = timestamps (CLOCK_MONOTONIC_COARSE ns: the programs' bpf_ktime_get_coarse_ns,
`now_ns()` here), packet/byte counts, CT_F_* flags, the counter id of the allowing rule.
`Timeouts` holds the timeout table; the loader passes it to the C (-DCT_TIMEOUT_*) so the
programs and the cleaner (agent.bpf.conntrack) always agree on what has expired.
"""

from __future__ import annotations

import ctypes
import enum
import ipaddress
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr, addr16, addr16_to_ip

IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMPV6 = 1, 6, 17, 58
NS_PER_S = 1_000_000_000
# Linux's clock id (include/uapi/linux/time.h); Python's time module does not name it.
CLOCK_MONOTONIC_COARSE = 6


def now_ns() -> int:
    """The conntrack clock as the programs read it (ct_now_ns() in conntrack.h)."""
    return time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)


class CtFlags(enum.IntFlag):
    """must match CT_F_* in bpf/include/conntrack.h"""

    ORIG_A_TO_B = 0x01
    ORIG_TO_WEP = 0x02
    SEEN_REPLY = 0x04
    FIN_ORIG = 0x08
    FIN_REPLY = 0x10
    RST = 0x20
    SVC_NAT = 0x40  # a service flow: its replies get the VIP back (nat.h)


class Key(ctypes.Structure):
    """must match struct ct_key in bpf/include/conntrack.h"""

    _fields_ = [
        ("ifindex", ctypes.c_uint32),
        ("addr_a", PfAddr),
        ("addr_b", PfAddr),
        ("port_a", ctypes.c_uint16),
        ("port_b", ctypes.c_uint16),
        ("proto", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
    ]


class Value(ctypes.Structure):
    """must match struct ct_value in bpf/include/conntrack.h"""

    _fields_ = [
        ("created_ns", ctypes.c_uint64),
        ("last_seen_ns", ctypes.c_uint64),
        ("packets", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("counter_id", ctypes.c_uint32),
    ]


PARAMS = MapParams(
    name="conntrack", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=262144, version=2, header="conntrack.h",
)

_KEY = struct.Struct("=I16s16sHHBB2x")
_VALUE = struct.Struct("=QQQQII")


@dataclass(frozen=True)
class Timeouts:
    """Seconds since an entry's last packet after which it is dead (see conntrack.h)."""

    tcp_syn: int = 20
    tcp_est: int = 3600
    tcp_fin: int = 30
    tcp_rst: int = 10
    udp: int = 60
    icmp: int = 5
    other: int = 60

    def cflags(self) -> list[str]:
        """-D flags that make the C use these values."""
        return [f"-DCT_TIMEOUT_{k.upper()}={v}" for k, v in asdict(self).items()]

    def timeout_ns(self, proto: int, flags: int) -> int:
        """Mirror of ct_timeout_ns() in conntrack.h."""
        if proto == IPPROTO_TCP:
            if flags & CtFlags.RST:
                secs = self.tcp_rst
            elif flags & CtFlags.FIN_ORIG and flags & CtFlags.FIN_REPLY:
                secs = self.tcp_fin
            elif flags & CtFlags.SEEN_REPLY:
                secs = self.tcp_est
            else:
                secs = self.tcp_syn
        elif proto == IPPROTO_UDP:
            secs = self.udp
        elif proto in (IPPROTO_ICMP, IPPROTO_ICMPV6):
            secs = self.icmp
        else:
            secs = self.other
        return secs * NS_PER_S


DEFAULT_TIMEOUTS = Timeouts()

# Felix's BPFConntrackTimeouts keys (agent.config validates them and their durations) ->
# Timeouts fields. CreationGracePeriod (how young an entry Felix's cleaner leaves alone) has
# no field: this cleaner deletes only entries whose own last packet is older than their
# timeout, so a new entry is never at risk.
FELIX_TIMEOUT_FIELDS = {
    "TCPSynSent": "tcp_syn",
    "TCPEstablished": "tcp_est",
    "TCPFinsSeen": "tcp_fin",
    "TCPResetSeen": "tcp_rst",
    "UDPTimeout": "udp",
    "ICMPTimeout": "icmp",
    "GenericTimeout": "other",
}


def timeouts_from_felix(seconds_by_key: Iterable[tuple[str, int]]) -> Timeouts:
    """DEFAULT_TIMEOUTS with BPFConntrackTimeouts' given (key, whole seconds) pairs over it
    (agent.config's parse: keys known, `Auto` left out, durations >= 1 s)."""
    fields = {FELIX_TIMEOUT_FIELDS[key]: seconds for key, seconds in seconds_by_key
              if key in FELIX_TIMEOUT_FIELDS}
    return replace(DEFAULT_TIMEOUTS, **fields)


@dataclass(frozen=True)
class FlowKey:
    ifindex: int
    addr_a: str
    addr_b: str
    port_a: int
    port_b: int
    proto: int
    family: int = 4


def normalise(ifindex: int, src: str, dst: str, sport: int, dport: int, proto: int
              ) -> tuple[FlowKey, bool]:
    """(key, src_is_a) exactly as ct_fill_key() builds it."""
    sa, da = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if sa.version != da.version:
        raise ValueError(f"flow {src} -> {dst}: addresses of two families")
    s, d, fam = int(sa), int(da), sa.version
    src, dst = str(sa), str(da)
    src_is_a = s < d or (s == d and sport <= dport)
    if src_is_a:
        return FlowKey(ifindex, src, dst, sport, dport, proto, fam), True
    return FlowKey(ifindex, dst, src, dport, sport, proto, fam), False


def encode_key(k: FlowKey) -> bytes:
    return _KEY.pack(k.ifindex, addr16(k.addr_a)[1], addr16(k.addr_b)[1], k.port_a, k.port_b,
                     k.proto, k.family)


def decode_key(raw: bytes) -> FlowKey:
    ifindex, a, b, pa, pb, proto, family = _KEY.unpack(raw)
    return FlowKey(ifindex, addr16_to_ip(family, a), addr16_to_ip(family, b), pa, pb, proto,
                   family)


@dataclass(frozen=True)
class FlowValue:
    created_ns: int
    last_seen_ns: int
    packets: int
    bytes: int
    flags: int
    counter_id: int


def encode_value(v: FlowValue) -> bytes:
    return _VALUE.pack(v.created_ns, v.last_seen_ns, v.packets, v.bytes, v.flags, v.counter_id)


def decode_value(raw: bytes) -> FlowValue:
    return FlowValue(*_VALUE.unpack(raw))


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap, *, now_ns: int | None = None,
         timeouts: Timeouts = DEFAULT_TIMEOUTS) -> list[dict]:
    """One dict per flow, with "expires_in_s" when now_ns (`now_ns()`) is given."""
    rows = []
    for kraw, vraw in m.items():
        k, v = decode_key(kraw), decode_value(vraw)
        row = {**asdict(k), **asdict(v),
               "flag_names": sorted(f.name.lower() for f in CtFlags if f & v.flags and f.name)}
        if now_ns is not None:
            left = v.last_seen_ns + timeouts.timeout_ns(k.proto, v.flags) - now_ns
            row["expires_in_s"] = round(left / NS_PER_S, 3)
        rows.append(row)
    return sorted(rows, key=lambda r: (r["ifindex"], r["family"], r["addr_a"], r["addr_b"],
                                       r["port_a"], r["port_b"], r["proto"]))

"""The `nat_ct6` map: each IPv6 service flow's translation, both ways
(bpf/include/nat_ct6.h), the IPv6 twin of `nat_ct`.

FWD entries: (client, VIP, client port, service port, proto) -> backend address and port;
REV entries: (backend, client, backend port, client port, proto) -> VIP and service port.
NodePort flows (flag NODEPORT) are keyed at the host interface, and a flow source-NATed to
the node (flag SNAT: a backend on another node) carries the client in `peer_addr`/`peer_port`
of its REV entry and the node's (address, SNAT port) in its FWD entry's.
Written by the programs (an LRU: never full, it evicts); read by the CLI. Addresses print as
`[addr]:port`.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, PfAddr
from pyfelix.agent.bpf.maps.nat_ct import HAIRPIN, NODEPORT, SNAT, Kind
from pyfelix.agent.bpf.maps.nat_frontend import PROTOCOL_NAMES


class Key(ctypes.Structure):
    """must match struct nat_ct6_key in bpf/include/nat_ct6.h"""

    _fields_ = [("saddr", PfAddr), ("daddr", PfAddr),
                ("sport", ctypes.c_uint16), ("dport", ctypes.c_uint16),
                ("proto", ctypes.c_uint8), ("kind", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 2)]


class Value(ctypes.Structure):
    """must match struct nat_ct6_value in bpf/include/nat_ct6.h"""

    _fields_ = [("addr", PfAddr), ("port", ctypes.c_uint16), ("flags", ctypes.c_uint16),
                ("peer_port", ctypes.c_uint16), ("pad", ctypes.c_uint16),
                ("created_ns", ctypes.c_uint64), ("last_seen_ns", ctypes.c_uint64),
                ("peer_addr", PfAddr)]


PARAMS = MapParams(
    name="nat_ct6", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=262144, version=2, header="nat_ct6.h",
)

_KEY = struct.Struct("=16s16sHHBBxx")
_VALUE = struct.Struct("=16sHHHxxQQ16s")


def _ip(raw: bytes) -> str:
    return str(ipaddress.IPv6Address(raw))


def encode_key(saddr: str, daddr: str, sport: int, dport: int, proto: int,
               kind: Kind) -> bytes:
    return _KEY.pack(ipaddress.IPv6Address(saddr).packed, ipaddress.IPv6Address(daddr).packed,
                     sport, dport, proto, int(kind))


def decode_key(raw: bytes) -> dict:
    saddr, daddr, sport, dport, proto, kind = _KEY.unpack(raw)
    return {"kind": Kind(kind).name.lower() if kind in (1, 2) else str(kind),
            "src": f"[{_ip(saddr)}]:{sport}", "dst": f"[{_ip(daddr)}]:{dport}",
            "protocol": PROTOCOL_NAMES.get(proto, str(proto))}


def decode_value(raw: bytes) -> dict:
    addr, port, flags, peer_port, created, last, peer_addr = _VALUE.unpack(raw)
    out = {"to": f"[{_ip(addr)}]:{port}", "hairpin": bool(flags & HAIRPIN),
           "nodeport": bool(flags & NODEPORT), "created_ns": created, "last_seen_ns": last}
    if flags & SNAT:
        out["snat_peer"] = f"[{_ip(peer_addr)}]:{peer_port}"
    return out


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"kind": "fwd"|"rev", "src", "dst", "protocol", "to", "created_ns", "last_seen_ns"}]."""
    rows = [{**decode_key(k), **decode_value(v)} for k, v in m.items()]
    return sorted(rows, key=lambda r: (r["kind"], r["src"], r["dst"], r["protocol"]))

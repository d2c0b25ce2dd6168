"""The `ctlb_rev` map: connect-time load balancing's reverse translations (bpf/include/ctlb.h).

(socket cookie, backend address, backend port, protocol) -> (service VIP, service port), written
by calico_connect4 / calico_sendmsg4 when they send a host-networked socket to a backend and
read by calico_getpeername4 / calico_recvmsg4 so the application sees the address it asked
for. Written only by the programs (an LRU map: closed sockets' entries age out); Python dumps
it. Ports are kept in network byte order, as struct bpf_sock_addr holds them.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType, be32_to_ip, ip_to_be32


class Key(ctypes.Structure):
    """must match struct ctlb_rev_key in bpf/include/ctlb.h"""

    _fields_ = [("cookie", ctypes.c_uint64), ("addr", ctypes.c_uint32),
                ("port", ctypes.c_uint16), ("proto", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class Value(ctypes.Structure):
    """must match struct ctlb_rev_value in bpf/include/ctlb.h"""

    _fields_ = [("vip", ctypes.c_uint32), ("vport", ctypes.c_uint16), ("pad", ctypes.c_uint16)]


PARAMS = MapParams(
    name="ctlb_rev", map_type=MapType.LRU_HASH, key_type=Key, value_type=Value,
    max_entries=65536, version=1, header="ctlb.h",
)

_KEY = struct.Struct("=QIHBx")
_VALUE = struct.Struct("=IHxx")


def encode_key(cookie: int, addr: str, port: int, proto: int) -> bytes:
    return _KEY.pack(cookie, ip_to_be32(addr), socket.htons(port), proto)


def decode_key(raw: bytes) -> tuple[int, str, int, int]:
    cookie, addr, port, proto = _KEY.unpack(raw)
    return cookie, be32_to_ip(addr), socket.ntohs(port), proto


def encode_value(vip: str, vport: int) -> bytes:
    return _VALUE.pack(ip_to_be32(vip), socket.htons(vport))


def decode_value(raw: bytes) -> tuple[str, int]:
    vip, vport = _VALUE.unpack(raw)
    return be32_to_ip(vip), socket.ntohs(vport)


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    """[{"cookie", "backend", "backend_port", "proto", "vip", "vport"}], sorted."""
    rows = []
    for k, v in m.items():
        cookie, addr, port, proto = decode_key(k)
        vip, vport = decode_value(v)
        rows.append({"cookie": cookie, "backend": addr, "backend_port": port, "proto": proto,
                     "vip": vip, "vport": vport})
    return sorted(rows, key=lambda r: (r["cookie"], r["backend"], r["backend_port"]))

"""Packet tools for the fail-closed tests: forged IPv4 packets and a sniffer.

- `forged_ipv4(src, dst, proto, dport)`: a whole IPv4 packet (header and L4 checksums right:
  iptables' conntrack takes a bad L4 checksum as INVALID) carrying a TCP SYN or a UDP
  datagram, for a raw socket with IP_HDRINCL (`send_raw`).
- `Sniffer`: an AF_PACKET capture of what an interface RECEIVES, as (source, protocol,
  destination port) of every IPv4/IPv6 TCP or UDP packet. "Did not arrive" is judged against
  a genuine packet sent after the forged one on the same path (`wait_for`).
Both open their sockets inside a namespace, given as a name (`in_netns`) or a running
`NetnsThread`.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time
from collections.abc import Callable

from pyfelix.agent.bpf import packets
from pyfelix.agent.shims.netns import NetnsThread
from pyfelix.lab.netns import in_netns

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4

Namespace = str | NetnsThread


def _open(where: Namespace, make: Callable[[], socket.socket]) -> socket.socket:
    if isinstance(where, NetnsThread):
        return where.call(make)
    with in_netns(where):
        return make()


def forged_ipv4(src: str, dst: str, proto: int, dport: int, sport: int = 40000) -> bytes:
    if proto == UDP:
        segment = struct.pack("!HHHH", sport, dport, 8 + 7, 0) + b"pyfelix"
        offset = 6
    else:
        segment = packets.tcp_segment(sport, dport, "S")
        offset = 16
    pseudo = (ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed
              + struct.pack("!BBH", 0, proto, len(segment)))
    csum = packets.checksum(pseudo + segment)
    segment = segment[:offset] + struct.pack("!H", csum) + segment[offset + 2:]
    return packets.ipv4_header(src, dst, proto, len(segment)) + segment


class RawSender:
    """A raw IPv4 socket (IP_HDRINCL) inside a namespace."""

    def __init__(self, where: Namespace) -> None:
        self.sock = _open(where, lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW,
                                                        socket.IPPROTO_RAW))

    def send(self, src: str, dst: str, proto: int, dport: int, sport: int = 40000) -> None:
        self.sock.sendto(forged_ipv4(src, dst, proto, dport, sport), (dst, 0))

    def close(self) -> None:
        self.sock.close()


def _parse(frame: bytes) -> tuple[str, int, int] | None:
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == 0x0800 and len(frame) >= 34:
        l4 = 14 + (frame[14] & 0x0F) * 4
        src, proto = str(ipaddress.IPv4Address(frame[26:30])), frame[23]
    elif ethertype == 0x86DD and len(frame) >= 54:
        l4 = 54
        src, proto = str(ipaddress.IPv6Address(frame[22:38])), frame[20]
    else:
        return None
    if proto not in (TCP, UDP) or len(frame) < l4 + 4:
        return None
    return src, proto, int.from_bytes(frame[l4 + 2:l4 + 4], "big")


class Sniffer:
    """What `iface` of a namespace receives: (source, protocol, destination port)."""

    def __init__(self, where: Namespace, iface: str = "eth0") -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((iface, 0))
            return s

        self.sock = _open(where, make)
        self.sock.settimeout(0.2)
        self.seen: set[tuple[str, int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            key = _parse(frame)
            if key is not None:
                with self._lock:
                    self.seen.add(key)

    def saw(self, src: str, proto: int, dport: int) -> bool:
        with self._lock:
            return (src, proto, dport) in self.seen

    def wait_for(self, src: str, proto: int, dport: int, timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.saw(src, proto, dport):
                return True
            time.sleep(0.02)
        return self.saw(src, proto, dport)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()

"""Conformance probes: TCP, UDP and ICMP echo from a pod's namespace, never reusing a flow.

Role: decide `allow` / `deny` for one matrix cell. Verdicts as the lab's probes
(`lab.probe`): TCP allows when a random token echoes back over the connection; UDP when
the token echoes back (sent up to 3 times within the timeout); ICMP when an echo reply with
our identifier, sequence and token comes back. Anything else before the deadline is deny.

Why every probe is a new flow: the suite runs ~90 cases back to back against the same pods,
and a stateful firewall (conntrack, in the iptables and the BPF dataplane alike) rightly lets
a packet of an EXISTING flow through after the policy changed. A UDP probe whose source port
repeats an earlier allowed probe's is such a packet, and comes out `allow` under a deny
policy. So every probe here takes the next source port (ICMP: identifier) from `FlowIds`,
which never hands out the same one twice for a source pod within a lab.

Shared with the lab's probes: the TCP and UDP verdicts on a bound socket
(`tcp_echo_verdict`, `udp_echo_verdict`). This module's own: `FlowIds` (per source pod,
also the ICMP identifiers; the lab's prober takes ports from one process-wide counter and
retries a port in use, here a bind failure is a deny naming the errno) and ICMP echo.

IPv6 (`--ip-family ipv6|dual`): the socket family follows the target address; ICMP is
ICMPv6 echo (types 128/129) on a raw ICMPv6 socket, whose checksum the kernel computes.

Inputs: source namespace, target address, port/protocol, a timeout, a `FlowIds`.
Outputs: `(verdict, detail)`: ("allow", "echoed"), ("deny", "timeout" | "refused" |
"unreachable" | ...).

Invariants: bounded by the timeout; sockets closed on every path. Source ports come from
10000-29999, outside the kernel's ephemeral range (32768-60999), so they never collide
with the kernel's own choices. A raw ICMP socket sees every ICMP packet reaching the
namespace, so replies are matched on source address, identifier, sequence and token.
"""

from __future__ import annotations

import ipaddress
import secrets
import select
import socket
import struct
import threading
import time
from typing import Protocol

from pyfelix.agent.bpf.packets import checksum
from pyfelix.lab.netns import in_netns
from pyfelix.lab.probe import ALLOW, DENY, deny_for, tcp_echo_verdict, udp_echo_verdict

FIRST_SOURCE_PORT = 10000
LAST_SOURCE_PORT = 29999
TOKEN_PREFIX = b"pyfelix-conformance-"
ICMP_ECHO_REPLY = 0
ICMP_DEST_UNREACHABLE = 3
ICMP_ECHO_REQUEST = 8
ICMPV6_DEST_UNREACHABLE = 1
ICMPV6_ECHO_REQUEST = 128
ICMPV6_ECHO_REPLY = 129


class EchoVerdict(Protocol):
    def __call__(self, sock: socket.socket, address: tuple[str, int], deadline: float, *,
                 token_prefix: bytes) -> tuple[str, str]: ...


class FlowIds:
    """Hands out source ports / ICMP identifiers per source namespace, each at most once
    per `LAST_SOURCE_PORT - FIRST_SOURCE_PORT + 1` probes (thread-safe)."""

    def __init__(self, first: int = FIRST_SOURCE_PORT, last: int = LAST_SOURCE_PORT) -> None:
        if not 0 < first <= last <= 65535:
            raise ValueError(f"bad source port range {first}-{last}")
        self.first = first
        self.size = last - first + 1
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, source: str) -> int:
        with self._lock:
            used = self._used.get(source, 0)
            self._used[source] = used + 1
        return self.first + used % self.size


# --- TCP and UDP --------------------------------------------------------------------------

def _probe_from_port(kind: int, netns: str, target: str, port: int, source_port: int,
                     timeout: float, verdict_on: EchoVerdict) -> tuple[str, str]:
    """Create a `kind` socket in `netns`, bind it to `source_port` (a bind failure is a
    deny with its errno word) and let `verdict_on` decide."""
    deadline = time.monotonic() + timeout
    ipv6 = ":" in target
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET,
                             kind | socket.SOCK_CLOEXEC)
    try:
        try:
            sock.bind(("::" if ipv6 else "0.0.0.0", source_port))
        except OSError as exc:
            return deny_for(exc)
        return verdict_on(sock, (target, port), deadline, token_prefix=TOKEN_PREFIX)
    finally:
        sock.close()


def probe_tcp(netns: str, target: str, port: int, source_port: int,
              timeout: float) -> tuple[str, str]:
    return _probe_from_port(socket.SOCK_STREAM, netns, target, port, source_port, timeout,
                            tcp_echo_verdict)


def probe_udp(netns: str, target: str, port: int, source_port: int,
              timeout: float) -> tuple[str, str]:
    return _probe_from_port(socket.SOCK_DGRAM, netns, target, port, source_port, timeout,
                            udp_echo_verdict)


# --- ICMP ---------------------------------------------------------------------------------

def echo_request(identifier: int, sequence: int, payload: bytes) -> bytes:
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, identifier, sequence)
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, checksum(header + payload),
                       identifier, sequence) + payload


def classify(packet: bytes, target: str, identifier: int, sequence: int,
             payload: bytes) -> str | None:
    """What a received IPv4 packet (raw socket: IP header included) says about our echo:
    "echoed", "unreachable", or None when it is not about our request."""
    if len(packet) < 20:
        return None
    icmp = packet[(packet[0] & 0x0F) * 4:]
    if len(icmp) < 8:
        return None
    if icmp[0] == ICMP_ECHO_REPLY:
        source = socket.inet_ntoa(packet[12:16])
        got_id, got_seq = struct.unpack("!HH", icmp[4:8])
        if (source, got_id, got_seq, icmp[8:]) == (target, identifier, sequence, payload):
            return "echoed"
        return None
    if icmp[0] == ICMP_DEST_UNREACHABLE and len(icmp) >= 8 + 20 + 8:
        inner = icmp[8:]  # the offending IP header + the first 8 bytes of our request
        inner_icmp = inner[(inner[0] & 0x0F) * 4:]
        if (socket.inet_ntoa(inner[16:20]) == target and len(inner_icmp) >= 8
                and inner_icmp[0] == ICMP_ECHO_REQUEST
                and struct.unpack("!HH", inner_icmp[4:8]) == (identifier, sequence)):
            return "unreachable"
    return None


def echo_request6(identifier: int, sequence: int, payload: bytes) -> bytes:
    """An ICMPv6 echo request; its checksum is left 0: the kernel fills it in on a raw
    ICMPv6 socket (RFC 3542), since it covers the IPv6 pseudo-header."""
    return struct.pack("!BBHHH", ICMPV6_ECHO_REQUEST, 0, 0, identifier, sequence) + payload


def classify6(icmp: bytes, source: str, target: str, identifier: int, sequence: int,
              payload: bytes) -> str | None:
    """What a received ICMPv6 message (raw ICMPv6 sockets get no IPv6 header; `source` is
    the sender's address) says about our echo: "echoed", "unreachable", or None."""
    if len(icmp) < 8:
        return None
    if icmp[0] == ICMPV6_ECHO_REPLY:
        got_id, got_seq = struct.unpack("!HH", icmp[4:8])
        if ipaddress.ip_address(source.split("%")[0]) == ipaddress.ip_address(target) and (
                got_id, got_seq, icmp[8:]) == (identifier, sequence, payload):
            return "echoed"
        return None
    if icmp[0] == ICMPV6_DEST_UNREACHABLE and len(icmp) >= 8 + 40 + 8:
        inner = icmp[8:]  # the offending IPv6 header + the start of our request
        inner_icmp = inner[40:]
        if (ipaddress.IPv6Address(inner[24:40]) == ipaddress.ip_address(target)
                and inner_icmp[0] == ICMPV6_ECHO_REQUEST
                and struct.unpack("!HH", inner_icmp[4:8]) == (identifier, sequence)):
            return "unreachable"
    return None


def probe_icmp(netns: str, target: ipaddress.IPv4Address | ipaddress.IPv6Address | str,
               identifier: int, timeout: float) -> tuple[str, str]:
    """Ping `target` once from namespace `netns` (ICMPv6 echo for an IPv6 target)."""
    deadline = time.monotonic() + timeout
    target_text = str(target)
    ipv6 = ":" in target_text
    sequence = secrets.randbelow(0xFFFF) + 1
    payload = b"pyfelix-icmp-" + secrets.token_hex(8).encode()
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET,
                             socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                             socket.IPPROTO_ICMPV6 if ipv6 else socket.IPPROTO_ICMP)
    try:
        sock.setblocking(False)
        try:
            request = (echo_request6 if ipv6 else echo_request)(identifier, sequence, payload)
            sock.sendto(request, (target_text, 0))
        except OSError as exc:
            return deny_for(exc)
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([sock], [], [], left)
            if not readable:
                break
            try:
                packet, sender = sock.recvfrom(2048)
            except BlockingIOError:
                continue
            detail = (classify6(packet, str(sender[0]), target_text, identifier, sequence,
                                payload) if ipv6 else
                      classify(packet, target_text, identifier, sequence, payload))
            if detail == "echoed":
                return ALLOW, detail
            if detail is not None:
                return DENY, detail
        return DENY, "timeout"
    finally:
        sock.close()

"""Conformance probes: TCP, UDP and ICMP echo from a pod's namespace, never reusing a flow.

Role: decide `allow` / `deny` for one matrix cell. Verdicts as the lab's probes
(`agent.lab.probe`): TCP allows when a random token echoes back over the connection; UDP when
the token echoes back (sent up to 3 times within the timeout); ICMP when an echo reply with
our identifier, sequence and token comes back. Anything else before the deadline is deny.

Why not the lab's probes as they are: they let the kernel pick the source port. The suite
runs ~90 cases back to back against the same pods, and a stateful firewall (conntrack, in
the iptables and the BPF dataplane alike) rightly lets a packet of an EXISTING flow through
after the policy changed. A UDP probe whose random source port happens to repeat an earlier
allowed probe's (about one in a thousand per deny probe with ~30 live entries per pair) is
such a packet, and comes out `allow` under a deny policy. So every probe here takes the next
source port (ICMP: identifier) from `FlowIds`, which never hands out the same one twice for
a source pod within a lab: every probe is a new flow, as the expectation assumes.

Inputs: source namespace, target address, port/protocol, a timeout, a `FlowIds`.
Outputs: `(verdict, detail)`: ("allow", "echoed"), ("deny", "timeout" | "refused" |
"unreachable" | ...).

Invariants: bounded by the timeout; sockets closed on every path. Source ports come from
10000-29999, outside the kernel's ephemeral range (32768-60999), so they never collide
with the kernel's own choices. A raw ICMP socket sees every ICMP packet reaching the
namespace, so replies are matched on source address, identifier, sequence and token.
"""

from __future__ import annotations

import errno
import ipaddress
import secrets
import select
import socket
import struct
import threading
import time

from agent.lab.netns import in_netns

ALLOW = "allow"
DENY = "deny"
FIRST_SOURCE_PORT = 10000
LAST_SOURCE_PORT = 29999
UDP_ATTEMPTS = 3
ICMP_ECHO_REPLY = 0
ICMP_DEST_UNREACHABLE = 3
ICMP_ECHO_REQUEST = 8


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

def _deny_for(exc: OSError) -> tuple[str, str]:
    if isinstance(exc, ConnectionRefusedError):
        return DENY, "refused"
    if isinstance(exc, TimeoutError):
        return DENY, "timeout"
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return DENY, "unreachable"
    return DENY, errno.errorcode.get(exc.errno or 0, str(exc)).lower()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def probe_tcp(netns: str, target: str, port: int, source_port: int,
              timeout: float) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    token = b"pyfelix-conformance-" + secrets.token_hex(8).encode()
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(("0.0.0.0", source_port))
        sock.settimeout(_left(deadline) or 0.001)
        sock.connect((target, port))
        sock.sendall(token)
        received = b""
        while len(received) < len(token):
            left = _left(deadline)
            if left == 0:
                return DENY, "connected, no echo"
            sock.settimeout(left)
            chunk = sock.recv(len(token) - len(received))
            if not chunk:
                return DENY, "connected, closed"
            received += chunk
    except OSError as exc:
        return _deny_for(exc)
    finally:
        sock.close()
    return (ALLOW, "echoed") if received == token else (DENY, "connected, wrong echo")


def probe_udp(netns: str, target: str, port: int, source_port: int,
              timeout: float) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    token = b"pyfelix-conformance-" + secrets.token_hex(8).encode()
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(("0.0.0.0", source_port))
        sock.setblocking(False)
        sock.connect((target, port))
        attempts_left = UDP_ATTEMPTS
        while attempts_left > 0 and _left(deadline) > 0:
            sock.send(token)
            attempts_left -= 1
            wait_until = time.monotonic() + _left(deadline) / (attempts_left + 1)
            while (left := wait_until - time.monotonic()) > 0:
                readable, _, _ = select.select([sock], [], [], left)
                if not readable:
                    break
                if sock.recv(len(token) + 64) == token:
                    return ALLOW, "echoed"
    except OSError as exc:
        return _deny_for(exc)
    finally:
        sock.close()
    return DENY, "timeout"


# --- ICMP ---------------------------------------------------------------------------------

def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of `data`."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


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


def probe_icmp(netns: str, target: ipaddress.IPv4Address | str, identifier: int,
               timeout: float) -> tuple[str, str]:
    """Ping `target` once from namespace `netns`."""
    deadline = time.monotonic() + timeout
    target_text = str(target)
    sequence = secrets.randbelow(0xFFFF) + 1
    payload = b"pyfelix-icmp-" + secrets.token_hex(8).encode()
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                             socket.IPPROTO_ICMP)
    try:
        sock.setblocking(False)
        try:
            sock.sendto(echo_request(identifier, sequence, payload), (target_text, 0))
        except OSError as exc:
            return _deny_for(exc)
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([sock], [], [], left)
            if not readable:
                break
            try:
                packet = sock.recv(2048)
            except BlockingIOError:
                continue
            detail = classify(packet, target_text, identifier, sequence, payload)
            if detail == "echoed":
                return ALLOW, detail
            if detail is not None:
                return DENY, detail
        return DENY, "timeout"
    finally:
        sock.close()

"""nfnetlink_log reader: the packets iptables' NFLOG target copies to a netlink group.

Role: the iptables dataplane's source of flow-log events (Felix's Prometheus reporter and
flow logs read the same groups). `NflogSocket(groups)` opens a NETLINK_NETFILTER socket in
the calling thread's network namespace, binds each group (one reader per group per
namespace: the kernel answers EBUSY to a second), asks for the packet's first `copy_range`
bytes, and `read()` returns the decoded `NflogPacket`s of one receive (possibly several
netlink messages). `parse_messages(data)` is the pure decoder the tests feed with bytes.

Outputs of a packet: the group, the rule's prefix, the family and the IPv4/IPv6 5-tuple and
length read from the copied network header (ports of TCP/UDP/SCTP; an ICMP echo's id as the
source port, as the BPF events carry it).

Overload: the kernel queues messages in the socket's receive buffer; what does not fit is
dropped and counted in the socket's `sk_drops`, which `/proc/net/netlink` shows per socket
(`kernel_drops()` reads it: exact, unlike counting ENOBUFS errors, each of which stands for
one or many lost messages). The socket is set NETLINK_NO_ENOBUFS so an overrun never
surfaces as a read error.

Invariants: nothing outside the namespace the socket was opened in is read; a message that
does not parse is skipped and counted (`malformed`), never raised.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from pyfelix.agent.shims.nfnetlink import (
    NFGENMSG,
    NLATTR,
    NLMSGHDR,
    NetfilterSocket,
    attributes,
    messages,
)

NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET = 0
NFULNL_MSG_CONFIG = 1
NFULA_CFG_CMD = 1
NFULA_CFG_MODE = 2
NFULA_CFG_QTHRESH = 5
NFULNL_CFG_CMD_BIND = 1
NFULNL_COPY_PACKET = 2
NFULA_PAYLOAD = 9
NFULA_PREFIX = 10
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLMSG_DONE = 3
PORT_PROTOCOLS = frozenset({6, 17, 132, 136})

@dataclass(frozen=True, slots=True)
class NflogPacket:
    group: int
    prefix: str
    family: int  # 4 | 6
    src: str
    dst: str
    proto: int
    sport: int
    dport: int
    length: int  # the IP packet's length from its header


def _attr(kind: int, payload: bytes) -> bytes:
    body = NLATTR.pack(4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def config_message(group: int, attrs: bytes, seq: int) -> bytes:
    """One NFULNL_MSG_CONFIG request for `group` (family AF_UNSPEC), asking for an ack."""
    body = NFGENMSG.pack(socket.AF_UNSPEC, 0, group) + attrs
    return NLMSGHDR.pack(16 + len(body), (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
                          NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def decode_payload(payload: bytes) -> tuple[int, str, str, int, int, int, int] | None:
    """Network header (+ transport) -> (family, src, dst, proto, sport, dport, length), or
    None when too short or neither IPv4 nor IPv6."""
    if not payload:
        return None
    version = payload[0] >> 4
    if version == 4 and len(payload) >= 20:
        ihl = (payload[0] & 0xF) * 4
        length = struct.unpack_from("!H", payload, 2)[0]
        proto = payload[9]
        src, dst = socket.inet_ntoa(payload[12:16]), socket.inet_ntoa(payload[16:20])
        l4 = ihl
        icmp_echo = proto == 1
    elif version == 6 and len(payload) >= 40:
        length = 40 + struct.unpack_from("!H", payload, 4)[0]
        proto = payload[6]
        src = str(ipaddress.IPv6Address(payload[8:24]))
        dst = str(ipaddress.IPv6Address(payload[24:40]))
        l4 = 40
        icmp_echo = proto == 58
    else:
        return None
    sport = dport = 0
    if proto in PORT_PROTOCOLS and len(payload) >= l4 + 4:
        sport, dport = struct.unpack_from("!HH", payload, l4)
    elif icmp_echo and len(payload) >= l4 + 6:
        sport = struct.unpack_from("!H", payload, l4 + 4)[0]  # the echo id, as BPF events
    return (4 if version == 4 else 6, src, dst, proto, sport, dport, length)


def parse_messages(data: bytes) -> tuple[list[NflogPacket], int]:
    """The NFULNL_MSG_PACKET messages of one receive -> (packets, malformed count)."""
    packets: list[NflogPacket] = []
    received, malformed = messages(data)
    for msg_type, body in received:
        if msg_type != (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET or len(body) < 4:
            continue
        _family, _version, group = NFGENMSG.unpack_from(body)
        attrs = attributes(body[4:])
        decoded = decode_payload(attrs.get(NFULA_PAYLOAD, b""))
        if decoded is None:
            malformed += 1
        else:
            prefix = attrs.get(NFULA_PREFIX, b"").split(b"\0", 1)[0]
            packets.append(NflogPacket(group, prefix.decode("utf-8", "replace"), *decoded))
    return packets, malformed


class NflogSocket(NetfilterSocket):
    """A nfnetlink_log socket in the calling thread's network namespace, bound to `groups`."""

    def __init__(self, groups: tuple[int, ...], *, copy_range: int = 128,
                 rcvbuf: int = 4 << 20) -> None:
        super().__init__(0, rcvbuf)
        self.groups = groups
        try:
            seq = 1
            for group in groups:
                for attrs in (_attr(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_BIND])),
                              _attr(NFULA_CFG_MODE, struct.pack("!IBx", copy_range,
                                                                NFULNL_COPY_PACKET)),
                              _attr(NFULA_CFG_QTHRESH, struct.pack("!I", 1))):
                    self._request(config_message(group, attrs, seq), seq, group)
                    seq += 1
        except BaseException:
            self.close()
            raise

    def _request(self, message: bytes, seq: int, group: int) -> None:
        self.sock.send(message)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type, _flags, reply_seq, _pid = NLMSGHDR.unpack_from(data, offset)
                if msg_type == NLMSG_ERROR and reply_seq == seq:
                    code = -struct.unpack_from("=i", data, offset + 16)[0]
                    if code:
                        busy = (" (another reader holds it)"
                                if code in (errno.EBUSY, errno.EPERM) else "")
                        raise OSError(code, f"nfnetlink_log group {group}: "
                                            f"{os.strerror(code)}{busy}")
                    return
                offset += max((length + 3) & ~3, 16)

    def read(self, bufsize: int = 1 << 18) -> tuple[list[NflogPacket], int]:
        """One receive (blocking unless a timeout is set) -> (packets, malformed)."""
        return parse_messages(self.sock.recv(bufsize))

"""Kernel conntrack destroy events: which flows ended, with their packet and byte counts.

Role: the iptables dataplane's flow-end source for the flow logs. `ConntrackEndSocket()`
opens a NETLINK_NETFILTER socket in the calling thread's network namespace subscribed to
NFNLGRP_CONNTRACK_DESTROY; `read()` decodes the IPCTNL_MSG_CT_DELETE messages of one
receive into `FlowEnd`s (the original direction's 5-tuple, packets and bytes of both
directions). `enable_accounting()` turns on net.netfilter.nf_conntrack_acct in the
namespace: conntrack counts only flows created after it is set (the counters are an
extension added at creation), so the reader sets it before the first flow it reports.
`parse_messages(data)` is the pure decoder the tests feed.

Outputs of an ICMP flow: the echo id as the source port and 0 as the destination port (as
the NFLOG reader and the BPF events carry them).

Invariants: nothing outside the socket's namespace is read; a message that does not parse
is skipped and counted; an overrun drops messages in the kernel (counted in the socket's
sk_drops, `kernel_drops()`), never raises (NETLINK_NO_ENOBUFS).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from pyfelix.agent.shims.nfnetlink import NetfilterSocket, attributes, messages

NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_DELETE = 2
NFNLGRP_CONNTRACK_DESTROY = 3
CTA_TUPLE_ORIG = 1
CTA_COUNTERS_ORIG = 9
CTA_COUNTERS_REPLY = 10
CTA_TUPLE_IP = 1
CTA_TUPLE_PROTO = 2
CTA_IP_V4_SRC, CTA_IP_V4_DST, CTA_IP_V6_SRC, CTA_IP_V6_DST = 1, 2, 3, 4
CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT, CTA_PROTO_ICMP_ID = 1, 2, 3, 4
CTA_PROTO_ICMPV6_ID = 7
CTA_COUNTERS_PACKETS, CTA_COUNTERS_BYTES = 1, 2
ACCT_SYSCTL = "/proc/sys/net/netfilter/nf_conntrack_acct"

@dataclass(frozen=True, slots=True)
class FlowEnd:
    src: str
    dst: str
    proto: int
    sport: int
    dport: int
    packets: int  # both directions (0 without accounting)
    bytes: int


def _counters(raw: bytes | None) -> tuple[int, int]:
    if not raw:
        return 0, 0
    attrs = attributes(raw)
    packets, octets = attrs.get(CTA_COUNTERS_PACKETS), attrs.get(CTA_COUNTERS_BYTES)
    return (struct.unpack("!Q", packets)[0] if packets and len(packets) == 8 else 0,
            struct.unpack("!Q", octets)[0] if octets and len(octets) == 8 else 0)


def decode_delete(body: bytes) -> FlowEnd | None:
    """The attributes of one IPCTNL_MSG_CT_DELETE (after its nfgenmsg) -> FlowEnd."""
    attrs = attributes(body)
    tuple_attrs = attributes(attrs.get(CTA_TUPLE_ORIG, b""))
    ip = attributes(tuple_attrs.get(CTA_TUPLE_IP, b""))
    l4 = attributes(tuple_attrs.get(CTA_TUPLE_PROTO, b""))
    if CTA_IP_V4_SRC in ip and CTA_IP_V4_DST in ip:
        src, dst = socket.inet_ntoa(ip[CTA_IP_V4_SRC]), socket.inet_ntoa(ip[CTA_IP_V4_DST])
    elif CTA_IP_V6_SRC in ip and CTA_IP_V6_DST in ip:
        src = str(ipaddress.IPv6Address(ip[CTA_IP_V6_SRC]))
        dst = str(ipaddress.IPv6Address(ip[CTA_IP_V6_DST]))
    else:
        return None
    if CTA_PROTO_NUM not in l4:
        return None
    proto = l4[CTA_PROTO_NUM][0]
    sport = dport = 0
    if CTA_PROTO_SRC_PORT in l4 and CTA_PROTO_DST_PORT in l4:
        sport = struct.unpack("!H", l4[CTA_PROTO_SRC_PORT])[0]
        dport = struct.unpack("!H", l4[CTA_PROTO_DST_PORT])[0]
    elif CTA_PROTO_ICMP_ID in l4:
        sport = struct.unpack("!H", l4[CTA_PROTO_ICMP_ID])[0]
    elif CTA_PROTO_ICMPV6_ID in l4:
        sport = struct.unpack("!H", l4[CTA_PROTO_ICMPV6_ID])[0]
    orig, reply = _counters(attrs.get(CTA_COUNTERS_ORIG)), _counters(attrs.get(CTA_COUNTERS_REPLY))
    return FlowEnd(src, dst, proto, sport, dport, orig[0] + reply[0], orig[1] + reply[1])


def parse_messages(data: bytes) -> tuple[list[FlowEnd], int]:
    """The delete messages of one receive -> (flow ends, malformed count)."""
    ends: list[FlowEnd] = []
    received, malformed = messages(data)
    for msg_type, body in received:
        if msg_type != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE or len(body) < 4:
            continue
        end = decode_delete(body[4:])
        if end is None:
            malformed += 1
        else:
            ends.append(end)
    return ends, malformed


def enable_accounting(path: str = ACCT_SYSCTL) -> None:
    """nf_conntrack_acct = 1 in this thread's namespace (OSError if it cannot be set)."""
    with open(path, "w") as f:
        f.write("1")


class ConntrackEndSocket(NetfilterSocket):
    """Subscribed to this namespace's conntrack destroy events."""

    def __init__(self, *, rcvbuf: int = 4 << 20) -> None:
        super().__init__(1 << (NFNLGRP_CONNTRACK_DESTROY - 1), rcvbuf)

    def read(self, bufsize: int = 1 << 18) -> tuple[list[FlowEnd], int]:
        return parse_messages(self.sock.recv(bufsize))

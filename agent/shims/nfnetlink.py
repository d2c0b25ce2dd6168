"""NETLINK_NETFILTER plumbing shared by the nfnetlink readers (NFLOG packets, conntrack events).

Role: the parts of a netfilter netlink reader that do not depend on the subsystem: the
socket (opened in the calling thread's network namespace, large receive buffer,
NETLINK_NO_ENOBUFS so an overrun is counted by the kernel instead of failing a read), the
message walk of one receive, the attribute walk of one message, and the socket's drop
count from /proc/net/netlink.

Inputs: raw bytes of one `recv()`; a multicast group mask to bind.
Outputs: `messages(data)` -> ([(message type, body)], malformed count), where body is what
follows the 16-byte netlink header; `attributes(data)` -> {type: payload};
`NetfilterSocket.kernel_drops()` -> the socket's `sk_drops`.

Invariants: nothing here raises on bad bytes: a truncated message ends the walk and counts
as malformed; an attribute shorter than its header ends the attribute walk.
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NLA_TYPE_MASK = 0x3FFF

NLMSGHDR = struct.Struct("=IHHII")
NFGENMSG = struct.Struct("!BBH")
NLATTR = struct.Struct("=HH")


def attributes(data: bytes) -> dict[int, bytes]:
    """The netlink attributes packed in `data` -> {type (flags masked off): payload}."""
    out: dict[int, bytes] = {}
    offset = 0
    while offset + 4 <= len(data):
        length, kind = NLATTR.unpack_from(data, offset)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out


def messages(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """The netlink messages of one receive -> ([(type, body after the header)], malformed)."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type, _flags, _seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if length < 16 or offset + length > len(data):
            return out, 1
        out.append((msg_type, data[offset + 16:offset + length]))
        offset += (length + 3) & ~3
    return out, 0


def netlink_socket_drops(inode: int, proc_file: str = "/proc/thread-self/net/netlink") -> int:
    """The Drops column of /proc/net/netlink (this thread's namespace) for the socket with
    this inode; 0 if it is not listed."""
    with open(proc_file) as f:
        header = f.readline().split()
        drops_col, inode_col = header.index("Drops"), header.index("Inode")
        for line in f:
            fields = line.split()
            if len(fields) > max(drops_col, inode_col) and int(fields[inode_col]) == inode:
                return int(fields[drops_col])
    return 0


class NetfilterSocket:
    """A NETLINK_NETFILTER socket in the calling thread's namespace, bound to `groups_mask`
    (0: no multicast group). Subclasses add their subsystem's set-up and decoding."""

    def __init__(self, groups_mask: int, rcvbuf: int) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            self.sock.bind((0, groups_mask))
            self.inode = os.fstat(self.sock.fileno()).st_ino
        except BaseException:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def kernel_drops(self) -> int:
        """Messages the kernel could not queue for this socket (its `sk_drops`)."""
        return netlink_socket_drops(self.inode)

    def close(self) -> None:
        self.sock.close()

"""Loopback TCP ports for the lab's helper servers (etcd, typha, health endpoints).

Role: hand out ports that nothing else on the machine will take between "picked" and
"the server listens on it". Binding port 0 is not enough for that: the kernel draws such a
port from the ephemeral range (`net.ipv4.ip_local_port_range`), the same range every
outgoing connection draws its source port from, so a client that keeps reconnecting
(a syncer waiting for etcd) can occupy the port picked for the server it waits for.

`free_ports(n)` therefore draws from below the ephemeral range, checks each by binding it,
and holds all n sockets until it returns, so the n ports are distinct.

Invariant: returned ports are outside the ephemeral range and were bindable on 127.0.0.1
at the moment of return (a port another process binds afterwards is still possible, but no
connect() will pick it as a source port).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below this sit well-known service ports; stay clear of them


def _ephemeral_low() -> int:
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # the kernel's default lower bound


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports below the ephemeral range, bindable right now."""
    high = _ephemeral_low() - 1
    if high - _LOWEST < count * 4:
        raise RuntimeError(f"ip_local_port_range starts at {high + 1}: too few ports below it "
                           f"for {count} test servers")
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", random.randint(_LOWEST, high)))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    """One loopback TCP port below the ephemeral range (see `free_ports`)."""
    return free_ports(1)[0]

"""Netlink shim: links, addresses and routes of one network namespace, plus an event socket.

Role: the route manager's, the interface monitor's and the BPF managers' netlink access.
Real implementations use pyroute2, bound to a namespace given by name (/run/netns/NAME) or path:
- `PyRoute2Netlink(netns)`: requests (dump links/addresses/routes, add/replace/delete route);
- `PyRoute2Events(netns)`: a raw NETLINK_ROUTE socket subscribed to link and address groups,
  created inside the namespace, parsed with pyroute2's marshal; `poll(timeout)` returns the
  events that arrived (select()-able, so the monitor thread can stop and resync on time);
- `netlink_lister(netns)`: a one-shot dump of interfaces and their addresses, for the BPF
  managers' interface tables.

Outputs are plain frozen dataclasses (`Link`, `Address`, `Route`, `LinkEvent`, `AddrEvent`),
so managers and fakes never see pyroute2 objects. Errors become `NetlinkError` (an OSError
with the kernel's errno and the operation named).

Invariants: with `netns` given, nothing is ever done in the caller's namespace (the namespace
must already exist: it is opened without O_CREAT). Not thread-safe: one instance per thread.
"""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6

RT_TABLE_MAIN = 254
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RTN_UNICAST = 1
RTN_BLACKHOLE = 6

_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000

ROUTE_TYPE_NAMES = {RTN_UNICAST: "unicast", RTN_BLACKHOLE: "blackhole"}


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    admin_up: bool
    lower_up: bool  # carrier (IFF_LOWER_UP)

    @property
    def up(self) -> bool:
        return self.admin_up and self.lower_up


@dataclass(frozen=True)
class Address:
    ifindex: int
    cidr: str  # "10.0.0.1/24"
    family: int


@dataclass(frozen=True, order=True)
class Route:
    dst: str  # CIDR; "0.0.0.0/0" for default
    type: str = "unicast"  # "unicast" | "blackhole" | other kernel type names
    ifindex: int = 0
    protocol: int = 0
    scope: int = RT_SCOPE_UNIVERSE
    table: int = RT_TABLE_MAIN
    gateway: str = ""
    family: int = AF_INET


@dataclass(frozen=True)
class LinkEvent:
    link: Link
    removed: bool


@dataclass(frozen=True)
class AddrEvent:
    addr: Address
    removed: bool


NetlinkEvent = LinkEvent | AddrEvent


class NetlinkError(OSError):
    """A netlink request failed; errno is the kernel's."""


class EventsOverflow(Exception):
    """The kernel dropped events (ENOBUFS): the listener must resync from a full dump."""


class Netlink(Protocol):
    def list_links(self) -> list[Link]: ...

    def list_addrs(self) -> list[Address]: ...

    def list_routes(self, *, family: int = AF_INET, table: int = RT_TABLE_MAIN) -> list[Route]: ...

    def add_route(self, route: Route, *, replace: bool = False) -> None: ...

    def delete_route(self, route: Route) -> None: ...

    def close(self) -> None: ...


class NetlinkEvents(Protocol):
    def poll(self, timeout: float) -> list[NetlinkEvent]: ...

    def close(self) -> None: ...


# --- pyroute2 message -> dataclass ----------------------------------------------------------


def _link_from_msg(msg) -> Link:  # type: ignore[no-untyped-def]
    flags = int(msg.get("flags", 0))
    return Link(
        index=int(msg["index"]),
        name=str(msg.get_attr("IFLA_IFNAME") or ""),
        admin_up=bool(flags & _IFF_UP),
        lower_up=bool(flags & _IFF_LOWER_UP),
    )


def _addr_from_msg(msg) -> Address | None:  # type: ignore[no-untyped-def]
    family = int(msg["family"])
    addr = msg.get_attr("IFA_LOCAL") if family == AF_INET else None
    addr = addr or msg.get_attr("IFA_ADDRESS")
    if not addr:
        return None
    return Address(ifindex=int(msg["index"]), cidr=f"{addr}/{msg['prefixlen']}", family=family)


def _route_from_msg(msg) -> Route:  # type: ignore[no-untyped-def]
    family = int(msg["family"])
    dst = msg.get_attr("RTA_DST")
    if not dst:
        dst = "0.0.0.0" if family == AF_INET else "::"
    rtype = int(msg["type"])
    return Route(
        dst=f"{dst}/{msg['dst_len']}",
        type=ROUTE_TYPE_NAMES.get(rtype, str(rtype)),
        ifindex=int(msg.get_attr("RTA_OIF") or 0),
        protocol=int(msg["proto"]),
        scope=int(msg["scope"]),
        table=int(msg.get_attr("RTA_TABLE") or msg["table"]),
        gateway=str(msg.get_attr("RTA_GATEWAY") or ""),
        family=family,
    )


def _netlink_error(op: str, exc: Exception) -> NetlinkError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None) or errno.EIO
    return NetlinkError(code, f"netlink {op}: {errno.errorcode.get(code, code)} ({exc})")


class PyRoute2Netlink:
    """Real netlink requests through pyroute2's IPRoute, in `netns` (None: own namespace)."""

    def __init__(self, netns: str | None = None) -> None:
        from pyroute2 import IPRoute  # imported here: only the real shim needs pyroute2

        self.netns = netns
        if netns is None:
            self._ipr = IPRoute()
        else:
            from pyfelix.agent.shims.cmd import netns_path

            self._ipr = IPRoute(netns=netns_path(netns), flags=0)  # flags=0: never create it

    def list_links(self) -> list[Link]:
        try:
            return [_link_from_msg(m) for m in self._ipr.get_links()]
        except Exception as exc:
            raise _netlink_error("dump links", exc) from exc

    def list_addrs(self) -> list[Address]:
        try:
            msgs = self._ipr.get_addr()
        except Exception as exc:
            raise _netlink_error("dump addresses", exc) from exc
        return [a for a in (_addr_from_msg(m) for m in msgs) if a is not None]

    def list_routes(self, *, family: int = AF_INET, table: int = RT_TABLE_MAIN) -> list[Route]:
        try:
            msgs = self._ipr.get_routes(family=family, table=table)
        except Exception as exc:
            raise _netlink_error("dump routes", exc) from exc
        return [r for r in (_route_from_msg(m) for m in msgs) if r.table == table]

    def _route_args(self, route: Route) -> dict[str, object]:
        args: dict[str, object] = {
            "dst": route.dst,
            "table": route.table,
            "proto": route.protocol,
            "scope": route.scope,
            "type": route.type,
            "family": route.family,
        }
        if route.ifindex:
            args["oif"] = route.ifindex
        if route.gateway:
            args["gateway"] = route.gateway
        return args

    def add_route(self, route: Route, *, replace: bool = False) -> None:
        op = "replace" if replace else "add"
        try:
            self._ipr.route(op, **self._route_args(route))
        except Exception as exc:
            raise _netlink_error(f"{op} route {route.dst}", exc) from exc

    def delete_route(self, route: Route) -> None:
        try:
            self._ipr.route("del", **self._route_args(route))
        except Exception as exc:
            raise _netlink_error(f"delete route {route.dst}", exc) from exc

    def close(self) -> None:
        self._ipr.close()


# rtnetlink multicast groups (linux/rtnetlink.h)
_RTMGRP_LINK = 0x1
_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV6_IFADDR = 0x100
_NETLINK_ROUTE = 0


class PyRoute2Events:
    """Link and address events from a raw rtnetlink socket opened inside `netns`."""

    def __init__(self, netns: str | None = None, *, rcvbuf: int = 4 * 1024 * 1024) -> None:
        from pyroute2.netlink.rtnl.marshal import MarshalRtnl

        if netns is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE)
        else:
            from pyroute2 import netns as pyroute2_netns

            from pyfelix.agent.shims.cmd import netns_path

            sock = pyroute2_netns.create_socket(
                netns_path(netns), socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE, flags=0
            )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, _RTMGRP_LINK | _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR))
        self._sock = sock
        self._marshal = MarshalRtnl()

    def poll(self, timeout: float) -> list[NetlinkEvent]:
        """Wait up to `timeout` s for events; return all that are readable now (maybe none)."""
        events: list[NetlinkEvent] = []
        wait = timeout
        while True:
            ready, _, _ = select.select([self._sock], [], [], wait)
            if not ready:
                return events
            try:
                data = self._sock.recv(1024 * 1024)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    raise EventsOverflow("netlink event socket overflowed") from exc
                raise
            for msg in self._marshal.parse(data):
                event = self._event_from_msg(msg)
                if event is not None:
                    events.append(event)
            wait = 0.0

    @staticmethod
    def _event_from_msg(msg) -> NetlinkEvent | None:  # type: ignore[no-untyped-def]
        kind = msg.get("event")
        if kind in ("RTM_NEWLINK", "RTM_DELLINK"):
            return LinkEvent(_link_from_msg(msg), removed=kind == "RTM_DELLINK")
        if kind in ("RTM_NEWADDR", "RTM_DELADDR"):
            addr = _addr_from_msg(msg)
            return None if addr is None else AddrEvent(addr, removed=kind == "RTM_DELADDR")
        return None

    def close(self) -> None:
        self._sock.close()


def netlink_lister(netns: str | None = None
                   ) -> Callable[[], tuple[dict[str, int], dict[str, frozenset[str]]]]:
    """A function dumping ({name: ifindex}, {name: addresses as CIDRs}) with pyroute2 (in
    `netns`, None: our own), for managers that re-seed their interface table at a resync
    (agent.dataplane.managers.bpf_ifaces.InterfaceTable.replace_all)."""

    def dump() -> tuple[dict[str, int], dict[str, frozenset[str]]]:
        netlink = PyRoute2Netlink(netns)
        try:
            links = netlink.list_links()
            addrs = netlink.list_addrs()
        finally:
            netlink.close()
        names = {link.index: link.name for link in links}
        by_name: dict[str, set[str]] = {}
        for addr in addrs:
            if addr.ifindex in names:
                by_name.setdefault(names[addr.ifindex], set()).add(addr.cidr)
        return ({link.name: link.index for link in links},
                {name: frozenset(a) for name, a in by_name.items()})

    return dump

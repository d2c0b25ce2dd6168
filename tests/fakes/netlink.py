"""FakeNetlink: links, addresses and routes of an imaginary namespace, with kernel behaviour.

Behaves like the kernel where the managers care: adding an existing route without `replace`
fails with EEXIST; deleting a route matches dst, table, type, protocol and (if given) oif,
and fails with ESRCH when nothing matches; removing a link removes its addresses and every
route through it; routes need an existing link. `fail_next(n, errno, op=...)` makes the
next n requests (of a kind) fail. `events()` returns an event source fed by link/address changes.
`requests` counts write requests (add/replace/delete), for "nothing written" assertions.
"""

from __future__ import annotations

import errno
from dataclasses import replace

from pyfelix.agent.shims.netlink import (
    AF_INET,
    Address,
    AddrEvent,
    EventsOverflow,
    Link,
    LinkEvent,
    NetlinkError,
    NetlinkEvent,
    Route,
)


class FakeNetlinkEvents:
    def __init__(self) -> None:
        self.pending: list[NetlinkEvent] = []
        self.overflow_next = False
        self.closed = False

    def poll(self, timeout: float) -> list[NetlinkEvent]:
        if self.overflow_next:
            self.overflow_next = False
            self.pending.clear()
            raise EventsOverflow("fake overflow")
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        self.closed = True


class FakeNetlink:
    def __init__(self) -> None:
        self.links: dict[int, Link] = {}
        self.addrs: set[Address] = set()
        self.routes: set[Route] = set()
        self.requests = 0
        self._next_index = 2
        self._failures: list[tuple[int, str]] = []
        self._sources: list[FakeNetlinkEvents] = []
        self.closed = False

    # --- test controls -----------------------------------------------------------------

    def fail_next(self, count: int = 1, code: int = errno.EBUSY, *, op: str = "") -> None:
        """Fail the next `count` requests whose description starts with `op` ("" = any;
        e.g. "dump", "add route", "delete route")."""
        self._failures.extend([(code, op)] * count)

    def events(self) -> FakeNetlinkEvents:
        source = FakeNetlinkEvents()
        self._sources.append(source)
        return source

    def _emit(self, event: NetlinkEvent) -> None:
        for source in self._sources:
            source.pending.append(event)

    def add_link(self, name: str, *, up: bool = True, index: int | None = None) -> Link:
        if any(link.name == name for link in self.links.values()):
            raise NetlinkError(errno.EEXIST, f"link {name} exists")
        if index is None:
            index = self._next_index
        self._next_index = max(self._next_index, index) + 1
        link = Link(index=index, name=name, admin_up=up, lower_up=up)
        self.links[index] = link
        self._emit(LinkEvent(link, removed=False))
        return link

    def set_link_up(self, name: str, up: bool) -> None:
        link = self.link_by_name(name)
        link = replace(link, admin_up=up, lower_up=up)
        self.links[link.index] = link
        if not up:
            self.routes = {r for r in self.routes if r.ifindex != link.index}
        self._emit(LinkEvent(link, removed=False))

    def remove_link(self, name: str) -> None:
        link = self.link_by_name(name)
        del self.links[link.index]
        for addr in [a for a in self.addrs if a.ifindex == link.index]:
            self.addrs.discard(addr)
            self._emit(AddrEvent(addr, removed=True))
        self.routes = {r for r in self.routes if r.ifindex != link.index}
        self._emit(LinkEvent(link, removed=True))

    def add_addr(self, name: str, cidr: str, family: int = AF_INET) -> None:
        addr = Address(self.link_by_name(name).index, cidr, family)
        self.addrs.add(addr)
        self._emit(AddrEvent(addr, removed=False))

    def remove_addr(self, name: str, cidr: str, family: int = AF_INET) -> None:
        addr = Address(self.link_by_name(name).index, cidr, family)
        self.addrs.discard(addr)
        self._emit(AddrEvent(addr, removed=True))

    def link_by_name(self, name: str) -> Link:
        for link in self.links.values():
            if link.name == name:
                return link
        raise KeyError(name)

    def routes_to(self, dst: str) -> list[Route]:
        return sorted(r for r in self.routes if r.dst == dst)

    # --- the Netlink protocol ----------------------------------------------------------

    def _maybe_fail(self, op: str) -> None:
        for i, (code, prefix) in enumerate(self._failures):
            if op.startswith(prefix):
                del self._failures[i]
                raise NetlinkError(code, f"fake netlink {op}: injected {errno.errorcode[code]}")

    def list_links(self) -> list[Link]:
        self._maybe_fail("dump links")
        return sorted(self.links.values(), key=lambda link: link.index)

    def list_addrs(self) -> list[Address]:
        self._maybe_fail("dump addresses")
        return sorted(self.addrs, key=lambda a: (a.ifindex, a.cidr))

    def list_routes(self, *, family: int = AF_INET, table: int = 254) -> list[Route]:
        self._maybe_fail("dump routes")
        return sorted(r for r in self.routes if r.family == family and r.table == table)

    def add_route(self, route: Route, *, replace: bool = False) -> None:
        self.requests += 1
        self._maybe_fail(f"add route {route.dst}")
        if route.ifindex and route.ifindex not in self.links:
            raise NetlinkError(errno.ENODEV, f"no device {route.ifindex}")
        existing = [
            r for r in self.routes if r.dst == route.dst and r.table == route.table
        ]
        if existing and not replace:
            raise NetlinkError(errno.EEXIST, f"route {route.dst} exists")
        for r in existing:
            self.routes.discard(r)
        self.routes.add(route)

    def delete_route(self, route: Route) -> None:
        self.requests += 1
        self._maybe_fail(f"delete route {route.dst}")
        for r in sorted(self.routes):
            if (
                r.dst == route.dst
                and r.table == route.table
                and r.type == route.type
                and (not route.protocol or r.protocol == route.protocol)
                and (not route.ifindex or r.ifindex == route.ifindex)
            ):
                self.routes.discard(r)
                return
        raise NetlinkError(errno.ESRCH, f"no such route {route.dst}")

    def close(self) -> None:
        self.closed = True

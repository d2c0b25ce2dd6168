"""FakeLinkNetlink: links, addresses, neighbours and routes of an imaginary namespace, with the
kernel behaviour the VXLAN and route managers rely on.

- creating a link whose name exists fails EEXIST; a VXLAN link needs an existing parent
  (ENODEV); deleting a link removes its addresses, neighbours and routes;
- neighbours need their link (ENODEV); an ARP/NDP entry is keyed by IP, an FDB entry by MAC
  (replace overwrites); deleting a missing one fails ENOENT;
- a route needs its link to exist (ENODEV) and, when `onlink`, to be up (ENETDOWN); without
  onlink its gateway must be inside a subnet of the link's addresses (ENETUNREACH); replace
  is keyed by (dst, table); deleting a missing route fails ESRCH;
- `fail_next(n, errno, op=prefix)` fails the next n requests whose description starts with
  `op`; `requests` counts writes (for "nothing written" checks).
"""

from __future__ import annotations

import errno
import ipaddress
from dataclasses import replace

from pyfelix.agent.shims.link_netlink import (
    AF_BRIDGE,
    AF_INET,
    AF_INET6,
    LinkDetail,
    Neighbour,
    OverlayRoute,
    VXLANInfo,
)
from pyfelix.agent.shims.netlink import NetlinkError


class FakeLinkNetlink:
    def __init__(self) -> None:
        self.links: dict[int, LinkDetail] = {}
        self.addrs: dict[int, set[str]] = {}
        self.neighbours: dict[tuple[int, int, str], Neighbour] = {}
        self.routes: dict[tuple[str, int], OverlayRoute] = {}
        self.requests = 0
        self._next_index = 2
        self._failures: list[tuple[int, str]] = []
        self.closed = False

    # --- test controls -----------------------------------------------------------------

    def fail_next(self, count: int = 1, code: int = errno.EBUSY, *, op: str = "") -> None:
        self._failures.extend([(code, op)] * count)

    def _maybe_fail(self, op: str) -> None:
        for i, (code, prefix) in enumerate(self._failures):
            if op.startswith(prefix):
                del self._failures[i]
                raise NetlinkError(code, f"fake netlink {op}: injected {errno.errorcode[code]}")

    def add_link(self, name: str, *, kind: str = "veth", mtu: int = 1500,
                 mac: str = "aa:bb:cc:00:00:01", up: bool = True,
                 index: int | None = None) -> LinkDetail:
        if self.by_name(name) is not None:
            raise NetlinkError(errno.EEXIST, f"link {name} exists")
        if index is None:
            index = self._next_index
        self._next_index = max(self._next_index, index) + 1
        link = LinkDetail(index, name, kind, mtu, mac, up)
        self.links[link.index] = link
        self.addrs[link.index] = set()
        return link

    def by_name(self, name: str) -> LinkDetail | None:
        return next((link for link in self.links.values() if link.name == name), None)

    def arp(self, ifindex: int) -> dict[str, str]:
        return {n.ip: n.mac for n in self.neighbours.values()
                if n.family == AF_INET and n.ifindex == ifindex}

    def ndp(self, ifindex: int) -> dict[str, str]:
        return {n.ip: n.mac for n in self.neighbours.values()
                if n.family == AF_INET6 and n.ifindex == ifindex}

    def fdb(self, ifindex: int) -> dict[str, str]:
        return {n.mac: n.ip for n in self.neighbours.values()
                if n.family == AF_BRIDGE and n.ifindex == ifindex}

    def routes_via(self, ifindex: int) -> dict[str, str]:
        return {r.dst: r.gateway for r in self.routes.values() if r.ifindex == ifindex}

    # --- links ---------------------------------------------------------------------------

    def list_links(self) -> list[LinkDetail]:
        self._maybe_fail("dump links")
        return sorted(self.links.values(), key=lambda link: link.index)

    def add_vxlan(self, name: str, info: VXLANInfo, *, mac: str, mtu: int) -> None:
        self.requests += 1
        self._maybe_fail(f"add vxlan {name}")
        if info.parent_index not in self.links:
            raise NetlinkError(errno.ENODEV, f"no parent device {info.parent_index}")
        link = self.add_link(name, kind="vxlan", mtu=mtu, mac=mac, up=False)
        self.links[link.index] = replace(link, vxlan=info)

    def add_ipip(self, name: str, *, mtu: int) -> None:
        self.requests += 1
        self._maybe_fail(f"add ipip {name}")
        if self.by_name(name) is not None:
            raise NetlinkError(errno.EEXIST, f"{name} exists")
        self.add_link(name, kind="ipip", mtu=mtu, mac="00:00:00:00", up=False)

    def set_link(self, index: int, *, mtu: int | None = None, mac: str | None = None,
                 up: bool | None = None) -> None:
        self.requests += 1
        self._maybe_fail(f"set link {index}")
        link = self._link(index)
        self.links[index] = replace(
            link, mtu=link.mtu if mtu is None else mtu, mac=link.mac if mac is None else mac,
            admin_up=link.admin_up if up is None else up)
        if up is False:
            self.routes = {k: r for k, r in self.routes.items() if r.ifindex != index}

    def delete_link(self, index: int) -> None:
        self.requests += 1
        self._maybe_fail(f"delete link {index}")
        self._link(index)
        del self.links[index]
        self.addrs.pop(index, None)
        self.neighbours = {k: n for k, n in self.neighbours.items() if n.ifindex != index}
        self.routes = {k: r for k, r in self.routes.items() if r.ifindex != index}

    def _link(self, index: int) -> LinkDetail:
        link = self.links.get(index)
        if link is None:
            raise NetlinkError(errno.ENODEV, f"no device {index}")
        return link

    # --- addresses -----------------------------------------------------------------------

    def list_addrs(self, index: int) -> set[str]:
        self._maybe_fail("dump addresses")
        return set(self.addrs.get(index, set()))

    def addresses_by_link(self) -> dict[int, set[str]]:
        self._maybe_fail("dump addresses")
        return {index: set(addrs) for index, addrs in self.addrs.items() if addrs}

    def add_addr(self, index: int, cidr: str) -> None:
        self.requests += 1
        self._maybe_fail(f"add address {cidr}")
        self._link(index)
        if cidr in self.addrs[index]:
            raise NetlinkError(errno.EEXIST, f"address {cidr} exists")
        self.addrs[index].add(cidr)

    def delete_addr(self, index: int, cidr: str) -> None:
        self.requests += 1
        self._maybe_fail(f"delete address {cidr}")
        if cidr not in self.addrs.get(index, set()):
            raise NetlinkError(errno.EADDRNOTAVAIL, f"no address {cidr}")
        self.addrs[index].discard(cidr)

    # --- neighbours ----------------------------------------------------------------------

    def list_neighbours(self, family: int, ifindex: int | None = None) -> list[Neighbour]:
        self._maybe_fail("dump neighbours")
        return sorted(n for n in self.neighbours.values() if n.family == family
                      and (ifindex is None or n.ifindex == ifindex))

    def replace_neighbour(self, neighbour: Neighbour) -> None:
        self.requests += 1
        self._maybe_fail(f"replace neighbour {neighbour.ip} {neighbour.mac}")
        self._link(neighbour.ifindex)
        self.neighbours[neighbour.key] = replace(neighbour, permanent=True)

    def delete_neighbour(self, neighbour: Neighbour) -> None:
        self.requests += 1
        self._maybe_fail(f"delete neighbour {neighbour.ip} {neighbour.mac}")
        if self.neighbours.pop(neighbour.key, None) is None:
            raise NetlinkError(errno.ENOENT, f"no neighbour {neighbour.key}")

    # --- routes --------------------------------------------------------------------------

    def list_routes(self, protocol: int, family: int = AF_INET) -> list[OverlayRoute]:
        self._maybe_fail("dump routes")
        version = 6 if family == AF_INET6 else 4
        return sorted(r for r in self.routes.values() if r.protocol == protocol
                      and ipaddress.ip_network(r.dst, strict=False).version == version)

    def replace_route(self, route: OverlayRoute) -> None:
        self.requests += 1
        self._maybe_fail(f"replace route {route.dst}")
        link = self._link(route.ifindex)
        if route.onlink and not link.admin_up:
            raise NetlinkError(errno.ENETDOWN, f"nexthop device {link.name} is not up")
        if route.gateway and not route.onlink:
            gateway = ipaddress.ip_address(route.gateway)
            if not any(gateway in ipaddress.ip_interface(a).network
                       for a in self.addrs.get(route.ifindex, ())):
                raise NetlinkError(errno.ENETUNREACH, f"gateway {route.gateway} unreachable")
        self.routes[(route.dst, route.table)] = route

    def delete_route(self, route: OverlayRoute) -> None:
        self.requests += 1
        self._maybe_fail(f"delete route {route.dst}")
        found = self.routes.get((route.dst, route.table))
        if found is None or found.protocol != route.protocol:
            raise NetlinkError(errno.ESRCH, f"no such route {route.dst}")
        del self.routes[(route.dst, route.table)]

    def close(self) -> None:
        self.closed = True

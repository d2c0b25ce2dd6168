"""LinkNetlink shim: VXLAN links, addresses, neighbours (ARP + bridge FDB), onlink routes.

Role: the kernel access of the VXLAN manager and of the route manager's static ARP entries,
beside `agent.shims.netlink` (which the route manager and interface monitor use for plain
links/routes). Same rules: a real implementation on pyroute2 bound to a namespace given by
name or path (`PyRoute2LinkNetlink(netns)`, never created, never the caller's by accident),
plain frozen dataclasses out, `NetlinkError` (with the kernel's errno) for failures, and a
stateful fake in `tests/fakes/link_netlink.py`. Not thread-safe: one instance per thread.

Kernel objects, as `ip`/`bridge` would show them:
- `LinkDetail`: a link with its kind, MTU, MAC, admin state and, for VXLAN, its VNI, local
  address, parent link, UDP port and learning flag;
- `Neighbour`: family AF_INET = an ARP entry (`ip neigh ... lladdr MAC nud permanent`),
  AF_INET6 = its IPv6 counterpart (a static NDP entry, for vxlan-v6.calico),
  family AF_BRIDGE = a VXLAN FDB entry (`bridge fdb ... MAC dst IP self permanent`: frames
  for MAC are sent to underlay address IP);
- `OverlayRoute`: `dst via gateway dev IF [onlink] proto P` (onlink: the gateway is reachable
  through the device without a covering route, as VXLAN and same-subnet routes need).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Protocol

from pyfelix.agent.shims.netlink import NetlinkError

AF_INET = socket.AF_INET
AF_INET6 = socket.AF_INET6
AF_BRIDGE = socket.AF_BRIDGE
NUD_PERMANENT = 0x80
NUD_NOARP = 0x40
NTF_SELF = 0x02
RTNH_F_ONLINK = 0x04
RT_TABLE_MAIN = 254
_IFF_UP = 0x1


@dataclass(frozen=True)
class VXLANInfo:
    vni: int
    local: str
    parent_index: int
    port: int
    learning: bool


@dataclass(frozen=True)
class LinkDetail:
    index: int
    name: str
    kind: str  # "vxlan", "veth", ... ("" when the kernel does not say)
    mtu: int
    mac: str
    admin_up: bool
    vxlan: VXLANInfo | None = None


@dataclass(frozen=True, order=True)
class Neighbour:
    family: int  # AF_INET/AF_INET6: ARP/NDP entry; AF_BRIDGE: FDB entry of a VXLAN device
    ifindex: int
    ip: str  # ARP: the neighbour's IP; FDB: the remote VTEP's underlay IP
    mac: str
    permanent: bool = True

    @property
    def key(self) -> tuple[int, int, str]:
        """What identifies the entry in the kernel: ARP/NDP by IP, FDB by MAC."""
        return (self.family, self.ifindex, self.mac if self.family == AF_BRIDGE else self.ip)


@dataclass(frozen=True, order=True)
class OverlayRoute:
    dst: str
    gateway: str
    ifindex: int
    protocol: int
    onlink: bool = True
    table: int = RT_TABLE_MAIN


class LinkNetlink(Protocol):
    def list_links(self) -> list[LinkDetail]: ...

    def add_vxlan(self, name: str, info: VXLANInfo, *, mac: str, mtu: int) -> None: ...

    def add_ipip(self, name: str, *, mtu: int) -> None: ...

    def set_link(self, index: int, *, mtu: int | None = None, mac: str | None = None,
                 up: bool | None = None) -> None: ...

    def delete_link(self, index: int) -> None: ...

    def list_addrs(self, index: int) -> set[str]: ...

    def addresses_by_link(self) -> dict[int, set[str]]: ...

    def add_addr(self, index: int, cidr: str) -> None: ...

    def delete_addr(self, index: int, cidr: str) -> None: ...

    def list_neighbours(self, family: int, ifindex: int | None = None) -> list[Neighbour]: ...

    def replace_neighbour(self, neighbour: Neighbour) -> None: ...

    def delete_neighbour(self, neighbour: Neighbour) -> None: ...

    def list_routes(self, protocol: int, family: int = AF_INET) -> list[OverlayRoute]: ...

    def replace_route(self, route: OverlayRoute) -> None: ...

    def delete_route(self, route: OverlayRoute) -> None: ...

    def close(self) -> None: ...


def _error(op: str, exc: Exception) -> NetlinkError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None) or errno.EIO
    return NetlinkError(code, f"netlink {op}: {errno.errorcode.get(code, code)} ({exc})")


class PyRoute2LinkNetlink:
    """Real requests through pyroute2's IPRoute, in `netns` (None: our own namespace)."""

    def __init__(self, netns: str | None = None) -> None:
        from pyroute2 import IPRoute

        if netns is None:
            self._ipr = IPRoute()
        else:
            from pyfelix.agent.shims.cmd import netns_path

            self._ipr = IPRoute(netns=netns_path(netns), flags=0)  # flags=0: never create

    def _call(self, op: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _error(op, exc) from exc

    # --- links ---------------------------------------------------------------------------

    @staticmethod
    def _link(msg) -> LinkDetail:  # type: ignore[no-untyped-def]
        info = msg.get_attr("IFLA_LINKINFO")
        kind = str(info.get_attr("IFLA_INFO_KIND") or "") if info is not None else ""
        vxlan = None
        if kind == "vxlan" and info is not None:
            data = info.get_attr("IFLA_INFO_DATA")
            if data is not None:
                vxlan = VXLANInfo(
                    vni=int(data.get_attr("IFLA_VXLAN_ID") or 0),
                    local=str(data.get_attr("IFLA_VXLAN_LOCAL")
                              or data.get_attr("IFLA_VXLAN_LOCAL6") or ""),
                    parent_index=int(data.get_attr("IFLA_VXLAN_LINK") or 0),
                    port=int(data.get_attr("IFLA_VXLAN_PORT") or 0),
                    learning=bool(data.get_attr("IFLA_VXLAN_LEARNING")))
        return LinkDetail(index=int(msg["index"]), name=str(msg.get_attr("IFLA_IFNAME") or ""),
                          kind=kind, mtu=int(msg.get_attr("IFLA_MTU") or 0),
                          mac=str(msg.get_attr("IFLA_ADDRESS") or ""),
                          admin_up=bool(int(msg["flags"]) & _IFF_UP), vxlan=vxlan)

    def list_links(self) -> list[LinkDetail]:
        return [self._link(m) for m in self._call("dump links", self._ipr.get_links)]

    def add_vxlan(self, name: str, info: VXLANInfo, *, mac: str, mtu: int) -> None:
        local = {"vxlan_local6" if ":" in info.local else "vxlan_local": info.local}
        self._call(f"add vxlan {name}", self._ipr.link, "add", ifname=name, kind="vxlan",
                   vxlan_id=info.vni, vxlan_link=info.parent_index, **local,
                   vxlan_port=info.port, vxlan_learning=int(info.learning), address=mac,
                   mtu=mtu)

    def add_ipip(self, name: str, *, mtu: int) -> None:
        """An IPIP device without fixed endpoints (like the kernel's own tunl0): any
        remote, chosen per packet by the route's onlink gateway."""
        self._call(f"add ipip {name}", self._ipr.link, "add", ifname=name, kind="ipip",
                   mtu=mtu)

    def set_link(self, index: int, *, mtu: int | None = None, mac: str | None = None,
                 up: bool | None = None) -> None:
        args: dict[str, object] = {}
        if mtu is not None:
            args["mtu"] = mtu
        if mac is not None:
            args["address"] = mac
        if up is not None:
            args["state"] = "up" if up else "down"
        if args:
            self._call(f"set link {index}", self._ipr.link, "set", index=index, **args)

    def delete_link(self, index: int) -> None:
        self._call(f"delete link {index}", self._ipr.link, "del", index=index)

    # --- addresses -----------------------------------------------------------------------

    def list_addrs(self, index: int) -> set[str]:
        out = set()
        for msg in self._call("dump addresses", self._ipr.get_addr, index=index):
            address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
            if address:
                out.add(f"{address}/{msg['prefixlen']}")
        return out

    def addresses_by_link(self) -> dict[int, set[str]]:
        """Every link's addresses, in one dump."""
        out: dict[int, set[str]] = {}
        for msg in self._call("dump addresses", self._ipr.get_addr):
            address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
            if address:
                out.setdefault(int(msg["index"]), set()).add(f"{address}/{msg['prefixlen']}")
        return out

    def add_addr(self, index: int, cidr: str) -> None:
        address, _, length = cidr.partition("/")
        self._call(f"add address {cidr}", self._ipr.addr, "add", index=index, address=address,
                   prefixlen=int(length or (128 if ":" in address else 32)))

    def delete_addr(self, index: int, cidr: str) -> None:
        address, _, length = cidr.partition("/")
        self._call(f"delete address {cidr}", self._ipr.addr, "del", index=index,
                   address=address, prefixlen=int(length or (128 if ":" in address else 32)))

    # --- neighbours ----------------------------------------------------------------------

    def list_neighbours(self, family: int, ifindex: int | None = None) -> list[Neighbour]:
        kwargs: dict[str, object] = {"family": family}
        if ifindex is not None:
            kwargs["ifindex"] = ifindex
        out = []
        for msg in self._call("dump neighbours", self._ipr.get_neighbours, **kwargs):
            mac = msg.get_attr("NDA_LLADDR")
            ip = msg.get_attr("NDA_DST")
            if not mac or not ip or int(msg["family"]) != family:
                continue
            if ifindex is not None and int(msg["ifindex"]) != ifindex:
                continue
            out.append(Neighbour(family=family, ifindex=int(msg["ifindex"]), ip=str(ip),
                                 mac=str(mac).lower(),
                                 permanent=bool(int(msg["state"]) & NUD_PERMANENT)))
        return out

    def _neigh_args(self, n: Neighbour) -> dict[str, object]:
        args: dict[str, object] = {"family": n.family, "ifindex": n.ifindex, "dst": n.ip,
                                   "lladdr": n.mac, "state": NUD_PERMANENT}
        if n.family == AF_BRIDGE:
            args["flags"] = NTF_SELF
        return args

    def replace_neighbour(self, neighbour: Neighbour) -> None:
        self._call(f"replace neighbour {neighbour.ip} {neighbour.mac}", self._ipr.neigh,
                   "replace", **self._neigh_args(neighbour))

    def delete_neighbour(self, neighbour: Neighbour) -> None:
        self._call(f"delete neighbour {neighbour.ip} {neighbour.mac}", self._ipr.neigh,
                   "del", **self._neigh_args(neighbour))

    # --- routes --------------------------------------------------------------------------

    def list_routes(self, protocol: int, family: int = AF_INET) -> list[OverlayRoute]:
        """Our routes (`protocol`) of one family: the IPv4 and IPv6 VXLAN managers share
        protocol 81 and each lists only its own family's."""
        out = []
        for msg in self._call("dump routes", self._ipr.get_routes, family=family,
                              table=RT_TABLE_MAIN):
            if int(msg["proto"]) != protocol:
                continue
            dst = msg.get_attr("RTA_DST") or ("::" if family == AF_INET6 else "0.0.0.0")
            out.append(OverlayRoute(dst=f"{dst}/{msg['dst_len']}",
                                    gateway=str(msg.get_attr("RTA_GATEWAY") or ""),
                                    ifindex=int(msg.get_attr("RTA_OIF") or 0),
                                    protocol=int(msg["proto"]),
                                    onlink=bool(int(msg["flags"]) & RTNH_F_ONLINK)))
        return out

    def _route_args(self, route: OverlayRoute) -> dict[str, object]:
        args: dict[str, object] = {"dst": route.dst, "oif": route.ifindex,
                                   "proto": route.protocol, "table": route.table,
                                   "family": AF_INET6 if ":" in route.dst else AF_INET}
        if route.gateway:
            args["gateway"] = route.gateway
        if route.onlink:
            args["flags"] = RTNH_F_ONLINK
        return args

    def replace_route(self, route: OverlayRoute) -> None:
        self._call(f"replace route {route.dst}", self._ipr.route, "replace",
                   **self._route_args(route))

    def delete_route(self, route: OverlayRoute) -> None:
        self._call(f"delete route {route.dst}", self._ipr.route, "del",
                   **self._route_args(route))

    def close(self) -> None:
        self._ipr.close()

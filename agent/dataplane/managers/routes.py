"""Route manager: a route per local workload IP to its interface (plus a static ARP entry
when the workload's MAC is known), blackholes for local blocks.

Role: Felix's route table for workload interfaces. Inputs (`on_update`):
- `WorkloadEndpointUpdate/Remove`: each endpoint's interface name and IPv4/IPv6 nets; every
  address gets a host route (/32 or /128) `dev <iface> scope link proto ROUTE_PROTOCOL`,
  and so does each floating IP (`ipv4_nat`; `ipv6_nat` too unless Ipv6Support is false)
  when FloatingIPs is Enabled (`floating_ips`: BIRD learns it and advertises it like a pod
  address);
  when the endpoint's MAC is known (WorkloadEndpoint `spec.mac`), each IPv4 address also
  gets a permanent neighbour entry beside its route (`ip neigh replace <ip> lladdr <mac>
  dev <iface> nud permanent`, Felix's static ARP), so the host never ARPs for its pods;
- `InterfaceUpdate` (from the interface monitor): the route exists only while its interface
  exists and is up; an interface that goes down/away makes the kernel drop its routes, so
  the manager re-reads them;
- `RouteUpdate(type="local_workload", local_workload_iface="")` for a block (prefix shorter
  than a host route): a blackhole route for the node's IPAM block, so traffic to unassigned
  addresses of the block is dropped here instead of bouncing to the default route;
  `RouteRemove(dst)` removes it;
- `InSync`: from now on, stale routes of ours may be deleted. Each resync also seeds the
  interfaces the monitor has not reported yet from the kernel's link dump, so a restarted
  agent whose InSync comes before the monitor's first dump deletes no pod route.

Output (`apply`): the main table holds exactly the desired routes among those carrying our
protocol number. Remote routes (`RouteUpdate` remote_workload / remote_host) are left to BIRD,
which learns and programs them from BGP, as in Calico.

Invariants:
- permanent IPv4 neighbour entries on workload interfaces (`interface_prefixes`) are ours:
  one that no endpoint wants is deleted after InSync; other entries are never touched.
  Static ARP needs the neighbour shim (`neighbours`): it is created with the real netlink
  shim; a test that injects only a `Netlink` fake runs without static ARP;
- routes with another protocol number are never replaced or deleted: we add with
  NLM_F_EXCL; if a foreign route holds the destination we log a conflict and leave it;
  deletes carry our protocol number, so the kernel itself refuses to delete anything else;
- before InSync nothing is deleted (a restarted agent does not remove routes it has not yet
  heard about); after it, routes of ours that nobody wants are removed;
- a failed write stays pending (DeltaTracker) and `apply()` raises after trying the rest.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from dataclasses import dataclass

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.events import IFACE_UP, InterfaceUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import (
    InSync,
    RouteRemove,
    RouteUpdate,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.link_netlink import AF_INET as NEIGH_AF_INET
from pyfelix.agent.shims.link_netlink import LinkNetlink, Neighbour
from pyfelix.agent.shims.netlink import (
    AF_INET,
    AF_INET6,
    RT_SCOPE_LINK,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_MAIN,
    Netlink,
    NetlinkError,
    Route,
)

log = logging.getLogger(__name__)

# THE routing protocol number that marks a route as ours (rtnetlink `rtm_protocol`; Felix's
# workload routes use 80). Everything with another number belongs to someone else.
ROUTE_PROTOCOL = 80


@dataclass(frozen=True)
class _Iface:
    index: int
    up: bool


class RouteError(RuntimeError):
    """Some route writes failed; they stay pending and are retried by the next apply."""


def _host_route_dst(net: str) -> tuple[str, int] | None:
    """Normalise an endpoint address ("10.65.0.1/32" or "10.65.0.1") to (cidr, family)."""
    try:
        parsed = ipaddress.ip_network(net, strict=False)
    except ValueError:
        return None
    family = AF_INET if parsed.version == 4 else AF_INET6
    return str(parsed), family


class RouteManager(ManagerBase):
    """Keeps our routes in one namespace's main table equal to what local endpoints need."""

    name = "routes"

    def __init__(
        self,
        *,
        netns: str | None = None,
        netlink: Netlink | None = None,
        neighbours: LinkNetlink | None = None,
        protocol: int = ROUTE_PROTOCOL,
        interface_prefixes: tuple[str, ...] = ("cali",),
        ipv6: bool = True,
        floating_ips: bool = False,
    ) -> None:
        super().__init__()
        self._ipv6 = ipv6  # Ipv6Support: False programs no IPv6 route
        self._floating_ips = floating_ips
        self._netns = netns
        self._netlink = netlink
        self._neighbours = neighbours
        self._static_arp = neighbours is not None or netlink is None
        self._protocol = protocol
        self._prefixes = tuple(interface_prefixes)
        self._endpoints: dict[WorkloadEndpointID, tuple[str, tuple[str, ...], str]] = {}
        self._arp: DeltaTracker[tuple[int, str], Neighbour] = DeltaTracker()
        self._blocks: set[str] = set()
        self._ifaces: dict[str, _Iface] = {}
        self._tracker: DeltaTracker[str, Route] = DeltaTracker()
        self._desired_dirty = True
        self.conflicts: dict[str, Route] = {}  # dst -> our wanted route a foreign one blocks

    @property
    def netlink(self) -> Netlink:
        if self._netlink is None:
            from pyfelix.agent.shims.netlink import PyRoute2Netlink

            self._netlink = PyRoute2Netlink(self._netns)
        return self._netlink

    @property
    def neighbours(self) -> LinkNetlink:
        if self._neighbours is None:
            from pyfelix.agent.shims.link_netlink import PyRoute2LinkNetlink

            self._neighbours = PyRoute2LinkNetlink(self._netns)
        return self._neighbours

    # --- on_update: desired state only ------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, WorkloadEndpointUpdate):
            nets = tuple(msg.endpoint.ipv4_nets)
            if self._ipv6:
                nets += tuple(msg.endpoint.ipv6_nets)
            if self._floating_ips:  # each floating IP is routed to its workload too (Felix)
                nets += tuple(f"{n.ext_ip}/32" for n in msg.endpoint.ipv4_nat)
                if self._ipv6:
                    nets += tuple(f"{n.ext_ip}/128" for n in msg.endpoint.ipv6_nat)
            self._endpoints[msg.id] = (msg.endpoint.name, nets, msg.endpoint.mac.lower())
            self._desired_dirty = True
        elif isinstance(msg, WorkloadEndpointRemove):
            if self._endpoints.pop(msg.id, None) is not None:
                self._desired_dirty = True
        elif isinstance(msg, InterfaceUpdate):
            self._on_interface(msg)
        elif isinstance(msg, RouteUpdate):
            if msg.type == "local_workload" and not msg.local_workload_iface:
                dst = _host_route_dst(msg.dst)
                if dst is None:
                    log.error("RouteUpdate %r: dst is not a CIDR; ignored", msg.dst)
                elif dst[1] == AF_INET6 and not self._ipv6:
                    pass
                elif dst[0] not in self._blocks:
                    self._blocks.add(dst[0])
                    self._desired_dirty = True
        elif isinstance(msg, RouteRemove):
            dst = _host_route_dst(msg.dst)
            if dst is not None and dst[0] in self._blocks:
                self._blocks.discard(dst[0])
                self._desired_dirty = True
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _on_interface(self, msg: InterfaceUpdate) -> None:
        old = self._ifaces.get(msg.name)
        if msg.state == "absent":
            self._ifaces.pop(msg.name, None)
        else:
            self._ifaces[msg.name] = _Iface(msg.index, msg.state == IFACE_UP)
        new = self._ifaces.get(msg.name)
        if old == new:
            return
        self._desired_dirty = True
        if old is not None and (new is None or not new.up or new.index != old.index):
            # The kernel dropped (or will drop) routes through the old interface.
            self._resync_requested = True

    # --- desired routes ---------------------------------------------------------------------

    def _recompute_desired(self) -> None:
        wanted: dict[str, Route] = {}
        for dst in sorted(self._blocks):
            family = AF_INET if ":" not in dst else AF_INET6
            wanted[dst] = Route(
                dst=dst, type="blackhole", protocol=self._protocol,
                scope=RT_SCOPE_UNIVERSE, table=RT_TABLE_MAIN, family=family,
            )
        arp: dict[tuple[int, str], Neighbour] = {}
        for ep_id in sorted(self._endpoints):
            iface_name, nets, mac = self._endpoints[ep_id]
            iface = self._ifaces.get(iface_name)
            if iface is None or not iface.up:
                continue
            for net in nets:
                parsed = _host_route_dst(net)
                if parsed is None:
                    log.error("endpoint %s: address %r is not an IP or CIDR; no route",
                              ep_id, net)
                    continue
                dst, family = parsed
                route = Route(
                    dst=dst, type="unicast", ifindex=iface.index, protocol=self._protocol,
                    scope=RT_SCOPE_LINK, table=RT_TABLE_MAIN, family=family,
                )
                if dst in wanted and wanted[dst].type == "unicast":
                    log.warning("endpoint %s: %s already routed to another interface", ep_id, dst)
                    continue
                wanted[dst] = route
                if mac and family == AF_INET and dst.endswith("/32"):
                    ip = dst[:-3]
                    arp[(iface.index, ip)] = Neighbour(NEIGH_AF_INET, iface.index, ip, mac)
        for dst in self._tracker.desired_keys() - set(wanted):
            self._tracker.delete_desired(dst)
        for dst, route in wanted.items():
            self._tracker.set_desired(dst, route)
        if self._static_arp:
            for key in self._arp.desired_keys() - set(arp):
                self._arp.delete_desired(key)
            for key, neighbour in arp.items():
                self._arp.set_desired(key, neighbour)
        self._desired_dirty = False

    # --- apply ------------------------------------------------------------------------------

    def _resync(self) -> None:
        ours: dict[str, Route] = {}
        for family in (AF_INET, AF_INET6):
            for route in self.netlink.list_routes(family=family, table=RT_TABLE_MAIN):
                if route.protocol == self._protocol:
                    ours[route.dst] = route
        self._tracker.replace_all_dataplane(ours)
        if self._static_arp:
            workload_ifaces = {i.index for name, i in self._ifaces.items()
                               if name.startswith(self._prefixes)}
            self._arp.replace_all_dataplane({
                (n.ifindex, n.ip): n
                for n in self.neighbours.list_neighbours(NEIGH_AF_INET)
                if n.permanent and n.ifindex in workload_ifaces})
        self.conflicts.clear()
        self._resync_requested = False

    def _seed_interfaces(self) -> None:
        """Learn interfaces the monitor has not reported yet from the kernel's link dump.

        A restarted agent can see InSync before the interface monitor's first dump; without
        this, no interface would be known, no route desired, and every pod route deleted as
        stale (then re-added when the dump arrives). The monitor stays authoritative for
        changes: only interfaces it has not reported are seeded."""
        for link in self.netlink.list_links():
            if link.name not in self._ifaces:
                self._ifaces[link.name] = _Iface(link.index, link.up)
                self._desired_dirty = True

    def apply(self) -> None:
        if self._resync_requested:
            self._seed_interfaces()
        if self._desired_dirty:
            self._recompute_desired()
        if self._resync_requested:
            self._resync()
        errors: list[str] = []
        if self._datastore_in_sync:
            for dst in self._tracker.pending_deletions():
                route = self._tracker.get_dataplane(dst)
                assert route is not None
                try:
                    self.netlink.delete_route(route)
                except NetlinkError as exc:
                    if exc.errno != errno.ESRCH:
                        errors.append(str(exc))
                        continue
                self._tracker.mark_deletion_applied(dst)
        for dst, route in self._tracker.pending_updates():
            if dst in self.conflicts:
                continue
            ours_present = self._tracker.get_dataplane(dst) is not None
            try:
                self.netlink.add_route(route, replace=ours_present)
            except NetlinkError as exc:
                if exc.errno == errno.EEXIST:
                    log.warning("route %s: held by a route that is not ours; left alone", dst)
                    self.conflicts[dst] = route
                    continue
                if exc.errno in (errno.ENODEV, errno.ENETDOWN):
                    self._resync_requested = True  # the interface went away meanwhile
                errors.append(str(exc))
                continue
            self._tracker.mark_update_applied(dst)
        if self._static_arp:
            errors += self._apply_arp()
        if errors:
            self._resync_requested = True
            raise RouteError(f"{len(errors)} route write(s) failed: {'; '.join(errors[:5])}")

    def _apply_arp(self) -> list[str]:
        errors: list[str] = []
        if self._datastore_in_sync:
            for key in self._arp.pending_deletions():
                neighbour = self._arp.get_dataplane(key)
                assert neighbour is not None
                try:
                    self.neighbours.delete_neighbour(neighbour)
                except NetlinkError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENODEV):
                        errors.append(str(exc))
                        continue
                self._arp.mark_deletion_applied(key)
        for key, neighbour in self._arp.pending_updates():
            try:
                self.neighbours.replace_neighbour(neighbour)
            except NetlinkError as exc:
                if exc.errno in (errno.ENODEV, errno.ENETDOWN):
                    self._resync_requested = True
                errors.append(str(exc))
                continue
            self._arp.mark_update_applied(key)
        return errors

    def close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None
        if self._neighbours is not None:
            self._neighbours.close()
            self._neighbours = None

    # --- introspection (tests, debug dumps) ------------------------------------------------

    def desired_routes(self) -> dict[str, Route]:
        return dict(self._tracker.iter_desired())

    def desired_arp(self) -> dict[str, str]:
        """IP -> MAC of the static ARP entries wanted."""
        return {n.ip: n.mac for _, n in self._arp.iter_desired()}

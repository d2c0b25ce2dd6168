"""VXLAN manager: the `vxlan.calico` device, its FDB and ARP entries, routes via remote VTEPs.

Role: Felix's vxlan manager. Inputs (`on_update`):
- `VXLANTunnelEndpointUpdate/Remove` (the calc graph's VXLANResolver: every node's VTEP
  address, MAC and parent device IP, sent while a VXLAN pool exists);
- `RouteUpdate/Remove`: routes of type `remote_workload` with `ip_pool_type == "vxlan"`
  (remote blocks, or remote workload /32s when there are no blocks), via `dst_node`;
- `IPAMPoolUpdate/Remove`: a pool's `vxlan_mode` (CrossSubnet routes to a node in our own
  subnet go straight over the underlay, without encapsulation);
- the interface monitor's `InterfaceAddrsUpdate`: which interface is the parent (the one that
  holds this node's VTEP parent device IP - that is also how this manager recognises the
  LOCAL VTEP, so it needs no hostname), and its subnet; interfaces the monitor has not
  reported yet are seeded from the kernel on each resync (a restarted agent's InSync may
  come before the monitor's first dump);
- `InSync`.

Kernel state it owns (in its namespace):

    vxlan.calico   type vxlan id <VNI> local <parent IP> dev <parent> dstport <port>
                   nolearning, MAC = our VTEP MAC, MTU = VXLANMTU or parent MTU - 50, up;
                   address <our VTEP IP>/32
    per remote VTEP  ARP  <VTEP IP> lladdr <VTEP MAC> dev vxlan.calico nud permanent
                     FDB  <VTEP MAC> dst <its parent IP> dev vxlan.calico self permanent
    per VXLAN route  <dst> via <VTEP IP> dev vxlan.calico onlink proto 81
                     (CrossSubnet, same subnet: <dst> via <node IP> dev <parent> proto 81)

Routes carry protocol `VXLAN_ROUTE_PROTOCOL` (81), not the workload routes' 80, so the
route manager and this one never delete each other's routes. Any address on vxlan.calico
and any ARP/FDB entry on it is ours. With no local VTEP (no VXLAN pool, or this node has no
host IP yet) the device is removed - but, like every deletion, only after InSync.

Both dataplane modes: plain Linux networking, `linux_managers()` adds it in iptables and BPF
mode. Apply is a diff against what the kernel holds (read on the first apply, after a
failure and on periodic resync); applying the same state twice writes nothing.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from dataclasses import dataclass

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import (
    InSync,
    IPAMPoolRemove,
    IPAMPoolUpdate,
    RouteRemove,
    RouteUpdate,
    VXLANTunnelEndpointRemove,
    VXLANTunnelEndpointUpdate,
)
from pyfelix.agent.shims.link_netlink import (
    AF_BRIDGE,
    AF_INET,
    LinkDetail,
    LinkNetlink,
    Neighbour,
    OverlayRoute,
    VXLANInfo,
)
from pyfelix.agent.shims.netlink import NetlinkError

log = logging.getLogger(__name__)

VXLAN_DEVICE = "vxlan.calico"
VXLAN_ROUTE_PROTOCOL = 81
DEFAULT_VNI = 4096
DEFAULT_PORT = 4789
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8


class VXLANError(RuntimeError):
    """Some VXLAN writes failed; they stay pending and the kernel is re-read next apply."""


@dataclass(frozen=True)
class DeviceSpec:
    info: VXLANInfo
    mac: str
    mtu: int
    address: str  # "<VTEP IP>/32"


class VXLANManager(ManagerBase):
    name = "vxlan"

    def __init__(self, *, netns: str | None = None, netlink: LinkNetlink | None = None,
                 vni: int = DEFAULT_VNI, port: int = DEFAULT_PORT, mtu: int = 0,
                 device: str = VXLAN_DEVICE, protocol: int = VXLAN_ROUTE_PROTOCOL) -> None:
        super().__init__()
        if not 0 < vni < 1 << 24:
            raise ValueError(f"VXLANVNI: {vni} is not 1..16777215")
        if not 0 < port < 65536:
            raise ValueError(f"VXLANPort: {port} is not 1..65535")
        if mtu and not 68 <= mtu <= 65535:
            raise ValueError(f"VXLANMTU: {mtu} is not 0 (auto) or 68..65535")
        self._netns = netns
        self._netlink = netlink
        self._vni = vni
        self._port = port
        self._mtu = mtu
        self._device = device
        self._protocol = protocol
        self._vteps: dict[str, VXLANTunnelEndpointUpdate] = {}
        self._routes: dict[str, RouteUpdate] = {}
        self._pools: dict[str, tuple[ipaddress.IPv4Network, str]] = {}
        self._iface_addrs: dict[str, frozenset[str]] = {}
        self._neighbours: DeltaTracker[tuple[int, int, str], Neighbour] = DeltaTracker()
        self._kernel_routes: DeltaTracker[str, OverlayRoute] = DeltaTracker()
        self._device_link: LinkDetail | None = None
        self._device_addrs: set[str] = set()
        self._dirty = True
        self.device_index = 0

    @property
    def netlink(self) -> LinkNetlink:
        if self._netlink is None:
            from pyfelix.agent.shims.link_netlink import PyRoute2LinkNetlink

            self._netlink = PyRoute2LinkNetlink(self._netns)
        return self._netlink

    # --- on_update: desired state only ------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, VXLANTunnelEndpointUpdate):
            self._vteps[msg.node] = msg
        elif isinstance(msg, VXLANTunnelEndpointRemove):
            if self._vteps.pop(msg.node, None) is None:
                return
        elif isinstance(msg, RouteUpdate):
            if msg.type == "remote_workload" and msg.ip_pool_type == "vxlan":
                self._routes[msg.dst] = msg
            elif self._routes.pop(msg.dst, None) is None:
                return
        elif isinstance(msg, RouteRemove):
            if self._routes.pop(msg.dst, None) is None:
                return
        elif isinstance(msg, IPAMPoolUpdate):
            try:
                net = ipaddress.ip_network(msg.cidr, strict=False)
            except ValueError:
                log.error("IPAMPoolUpdate %s: cidr %r is not a CIDR; ignored", msg.id, msg.cidr)
                return
            if isinstance(net, ipaddress.IPv4Network):
                self._pools[msg.id] = (net, msg.vxlan_mode)
        elif isinstance(msg, IPAMPoolRemove):
            if self._pools.pop(msg.id, None) is None:
                return
        elif isinstance(msg, InterfaceAddrsUpdate):
            if msg.name == self._device:
                return  # our own device's addresses are ours to manage
            if msg.addrs is None:
                self._iface_addrs.pop(msg.name, None)
            else:
                self._iface_addrs[msg.name] = msg.addrs
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True
            return
        else:
            return
        self._dirty = True

    # --- desired state ----------------------------------------------------------------------

    def local_vtep(self) -> tuple[VXLANTunnelEndpointUpdate, str, str] | None:
        """(our VTEP, parent interface, parent CIDR): the VTEP whose parent IP is ours."""
        for vtep in sorted(self._vteps.values(), key=lambda v: v.node):
            for iface, cidrs in sorted(self._iface_addrs.items()):
                for cidr in cidrs:
                    if cidr.split("/")[0] == vtep.parent_device_ip:
                        return vtep, iface, cidr
        return None

    def _parent_link(self, links: list[LinkDetail], iface: str) -> LinkDetail | None:
        return next((link for link in links if link.name == iface), None)

    def _desired_device(self, links: list[LinkDetail]) -> tuple[DeviceSpec | None, str]:
        local = self.local_vtep()
        if local is None:
            return None, ""
        vtep, iface, cidr = local
        parent = self._parent_link(links, iface)
        if parent is None:
            return None, ""
        mtu = self._mtu or max(68, parent.mtu - VXLAN_OVERHEAD)
        info = VXLANInfo(vni=self._vni, local=vtep.parent_device_ip,
                         parent_index=parent.index, port=self._port, learning=False)
        return DeviceSpec(info, vtep.mac.lower(), mtu, f"{vtep.ipv4_addr}/32"), cidr

    def _desired_neighbours(self, index: int, local_node: str) -> dict:
        wanted: dict[tuple[int, int, str], Neighbour] = {}
        for vtep in self._vteps.values():
            if vtep.node == local_node:
                continue
            mac = vtep.mac.lower()
            for n in (Neighbour(AF_INET, index, vtep.ipv4_addr, mac),
                      Neighbour(AF_BRIDGE, index, vtep.parent_device_ip, mac)):
                wanted[n.key] = n
        return wanted

    def _pool_mode(self, dst: str) -> str:
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            return ""
        modes = [(pool.prefixlen, mode) for pool, mode in self._pools.values()
                 if net.version == 4 and net.subnet_of(pool)]  # type: ignore[arg-type]
        return max(modes)[1] if modes else ""

    def _desired_routes(self, index: int, local_node: str, parent_cidr: str,
                        parent_index: int) -> dict[str, OverlayRoute]:
        wanted: dict[str, OverlayRoute] = {}
        local_subnet = ipaddress.ip_interface(parent_cidr).network
        for dst, route in self._routes.items():
            vtep = self._vteps.get(route.dst_node)
            if route.dst_node == local_node:
                continue
            if vtep is None:
                log.debug("route %s: node %s has no VTEP (yet); not programmed", dst,
                          route.dst_node)
                continue
            same_subnet = ipaddress.ip_address(vtep.parent_device_ip) in local_subnet
            if self._pool_mode(dst) == "CrossSubnet" and same_subnet:
                wanted[dst] = OverlayRoute(dst, vtep.parent_device_ip, parent_index,
                                           self._protocol, onlink=False)
            else:
                wanted[dst] = OverlayRoute(dst, vtep.ipv4_addr, index, self._protocol)
        return wanted

    # --- apply ------------------------------------------------------------------------------

    def _seed_interfaces(self, links: list[LinkDetail]) -> None:
        """Addresses of interfaces the monitor has not reported yet, from the kernel.

        A restarted agent can see InSync before the interface monitor's first dump: without
        this it would not find its parent interface, and remove (then recreate) the device."""
        unknown = {link.index: link.name for link in links
                   if link.name not in self._iface_addrs and link.name != self._device}
        if not unknown:
            return
        for index, cidrs in self.netlink.addresses_by_link().items():
            if index in unknown:
                self._iface_addrs[unknown[index]] = frozenset(cidrs)
                self._dirty = True

    def _read_kernel(self, links: list[LinkDetail]) -> None:
        nl = self.netlink
        self._seed_interfaces(links)
        self._device_link = next((link for link in links if link.name == self._device), None)
        neighbours: dict[tuple[int, int, str], Neighbour] = {}
        self._device_addrs = set()
        if self._device_link is not None:
            index = self._device_link.index
            self._device_addrs = nl.list_addrs(index)
            for family in (AF_INET, AF_BRIDGE):
                for n in nl.list_neighbours(family, index):
                    if n.permanent:
                        neighbours[n.key] = n
        self._neighbours.replace_all_dataplane(neighbours)
        self._kernel_routes.replace_all_dataplane({r.dst: r for r in nl.list_routes(
            self._protocol)})
        self._resync_requested = False

    def apply(self) -> None:
        if not (self._dirty or self._resync_requested or not self._neighbours.in_sync
                or not self._kernel_routes.in_sync):
            return
        links = self.netlink.list_links()
        if self._resync_requested:
            self._read_kernel(links)
        else:
            self._device_link = next((lk for lk in links if lk.name == self._device), None)
        errors: list[str] = []
        spec, parent_cidr = self._desired_device(links)
        try:
            self._ensure_device(spec)
        except NetlinkError as exc:
            self._resync_requested = True
            raise VXLANError(f"{self._device}: {exc}") from exc
        if spec is None or self._device_link is None:
            self._neighbours.delete_all_desired()
            for dst in self._kernel_routes.desired_keys():
                self._kernel_routes.delete_desired(dst)
        else:
            index = self._device_link.index
            local = self.local_vtep()
            assert local is not None
            self._set_desired(self._neighbours, self._desired_neighbours(index, local[0].node))
            self._set_desired(self._kernel_routes, self._desired_routes(
                index, local[0].node, parent_cidr, spec.info.parent_index))
        self._dirty = False
        errors += self._apply_neighbours()
        errors += self._apply_routes()
        if errors:
            self._resync_requested = True
            raise VXLANError(f"{len(errors)} VXLAN write(s) failed: {'; '.join(errors[:5])}")

    @staticmethod
    def _set_desired(tracker: DeltaTracker, wanted: dict) -> None:  # type: ignore[type-arg]
        for key in tracker.desired_keys() - wanted.keys():
            tracker.delete_desired(key)
        for key, value in wanted.items():
            tracker.set_desired(key, value)

    def _ensure_device(self, spec: DeviceSpec | None) -> None:
        nl = self.netlink
        link = self._device_link
        if spec is None:
            if link is not None and self._datastore_in_sync:
                log.info("no local VXLAN tunnel endpoint: removing %s", self._device)
                nl.delete_link(link.index)
                self._device_link = None
                self._forget_device_state(link.index)
            return
        if link is not None and (link.kind != "vxlan" or link.vxlan != spec.info):
            log.info("%s has other VXLAN settings (%s, want %s): recreating it",
                     self._device, link.vxlan, spec.info)
            nl.delete_link(link.index)
            self._forget_device_state(link.index)
            link = None
        if link is None:
            nl.add_vxlan(self._device, spec.info, mac=spec.mac, mtu=spec.mtu)
            link = next(lk for lk in nl.list_links() if lk.name == self._device)
            self._device_addrs = set()
        if link.mtu != spec.mtu or link.mac.lower() != spec.mac:
            nl.set_link(link.index, mtu=spec.mtu, mac=spec.mac)
        if not link.admin_up:
            nl.set_link(link.index, up=True)
        for cidr in sorted(self._device_addrs - {spec.address}):
            nl.delete_addr(link.index, cidr)
        if spec.address not in self._device_addrs:
            nl.add_addr(link.index, spec.address)
        self._device_addrs = {spec.address}
        self._device_link = next(lk for lk in nl.list_links() if lk.name == self._device)
        self.device_index = self._device_link.index

    def _forget_device_state(self, index: int) -> None:
        """The kernel dropped the deleted device's neighbours and routes with it."""
        for key, n in self._neighbours.iter_dataplane():
            if n.ifindex == index:
                self._neighbours.delete_dataplane(key)
        for dst, route in self._kernel_routes.iter_dataplane():
            if route.ifindex == index:
                self._kernel_routes.delete_dataplane(dst)

    def _apply_neighbours(self) -> list[str]:
        errors = []
        nl = self.netlink
        if self._datastore_in_sync:
            for key in self._neighbours.pending_deletions():
                n = self._neighbours.get_dataplane(key)
                assert n is not None
                try:
                    nl.delete_neighbour(n)
                except NetlinkError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENODEV):
                        errors.append(str(exc))
                        continue
                self._neighbours.mark_deletion_applied(key)
        for key, n in self._neighbours.pending_updates():
            try:
                nl.replace_neighbour(n)
            except NetlinkError as exc:
                errors.append(str(exc))
                continue
            self._neighbours.mark_update_applied(key)
        return errors

    def _apply_routes(self) -> list[str]:
        errors = []
        nl = self.netlink
        if self._datastore_in_sync:
            for dst in self._kernel_routes.pending_deletions():
                route = self._kernel_routes.get_dataplane(dst)
                assert route is not None
                try:
                    nl.delete_route(route)
                except NetlinkError as exc:
                    if exc.errno != errno.ESRCH:
                        errors.append(str(exc))
                        continue
                self._kernel_routes.mark_deletion_applied(dst)
        for dst, route in self._kernel_routes.pending_updates():
            try:
                nl.replace_route(route)
            except NetlinkError as exc:
                errors.append(str(exc))
                continue
            self._kernel_routes.mark_update_applied(dst)
        return errors

    def close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None

    # --- introspection ----------------------------------------------------------------------

    def desired_routes(self) -> dict[str, OverlayRoute]:
        return dict(self._kernel_routes.iter_desired())

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

IPv6 (`ip_version=6`, Felix's second manager instance): device `vxlan-v6.calico`, `local`
= the node's host IPv6 (`parent_device_ipv6`), parent = the interface holding it, MTU =
VXLANMTUV6 or the parent's MTU - 70 (outer IPv6 header is 40 bytes), address `<ipv6_addr>/128`,
MAC `mac_v6`; per remote VTEP an NDP entry (AF_INET6 neighbour) and an FDB entry to its host
IPv6; per IPv6 VXLAN route `<dst> via <VTEP IPv6> dev vxlan-v6.calico onlink proto 81`. Same
protocol as the IPv4 manager: each lists and deletes only its own family's routes. The
kernel's own link-local address on the device is left alone.

Both dataplane modes: plain Linux networking, `linux_managers()` adds it in iptables and BPF
mode. Apply is a diff against what the kernel holds (read on the first apply, after a
failure and on periodic resync); applying the same state twice writes nothing. The inputs
and the route programming are the IPIP manager's too (managers/overlay.py).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from dataclasses import dataclass

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.managers.overlay import OverlayManagerBase
from pyfelix.agent.proto import (
    IPAMPoolUpdate,
    VXLANTunnelEndpointRemove,
    VXLANTunnelEndpointUpdate,
)
from pyfelix.agent.shims.link_netlink import (
    AF_BRIDGE,
    AF_INET,
    AF_INET6,
    LinkDetail,
    LinkNetlink,
    Neighbour,
    OverlayRoute,
    VXLANInfo,
)
from pyfelix.agent.shims.netlink import NetlinkError

log = logging.getLogger(__name__)

VXLAN_DEVICE = "vxlan.calico"
VXLAN_DEVICE_V6 = "vxlan-v6.calico"
VXLAN_ROUTE_PROTOCOL = 81
DEFAULT_VNI = 4096
DEFAULT_PORT = 4789
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
VXLAN_OVERHEAD_V6 = 70  # outer Ethernet 14 + IPv6 40 + UDP 8 + VXLAN 8


class VXLANError(RuntimeError):
    """Some VXLAN writes failed; they stay pending and the kernel is re-read next apply."""


@dataclass(frozen=True)
class DeviceSpec:
    info: VXLANInfo
    mac: str
    mtu: int
    address: str  # "<VTEP IP>/32" ("/128" for IPv6)


class VXLANManager(OverlayManagerBase):
    name = "vxlan"
    TUNNEL_UPDATE = VXLANTunnelEndpointUpdate
    TUNNEL_REMOVE = VXLANTunnelEndpointRemove
    POOL_TYPE = "vxlan"

    def __init__(self, *, netns: str | None = None, netlink: LinkNetlink | None = None,
                 vni: int = DEFAULT_VNI, port: int = DEFAULT_PORT, mtu: int = 0,
                 device: str | None = None, protocol: int = VXLAN_ROUTE_PROTOCOL,
                 ip_version: int = 4) -> None:
        if device is None:
            device = VXLAN_DEVICE if ip_version == 4 else VXLAN_DEVICE_V6
        super().__init__(netns=netns, netlink=netlink, mtu=mtu, device=device,
                         protocol=protocol, ip_version=ip_version)
        if ip_version == 6:
            self.name = "vxlan-v6"
        if not 0 < vni < 1 << 24:
            raise ValueError(f"VXLANVNI: {vni} is not 1..16777215")
        if not 0 < port < 65536:
            raise ValueError(f"VXLANPort: {port} is not 1..65535")
        if mtu and not 68 <= mtu <= 65535:
            raise ValueError(f"VXLANMTU: {mtu} is not 0 (auto) or 68..65535")
        self._vni = vni
        self._port = port
        self._neighbours: DeltaTracker[tuple[int, int, str], Neighbour] = DeltaTracker()

    @staticmethod
    def pool_mode(msg: IPAMPoolUpdate) -> str:
        return msg.vxlan_mode

    # the VTEP's fields of this manager's family
    # IPv6 addresses in the kernel's spelling, so what we ask for compares equal to what
    # we read back (device `local`, FDB and NDP entries, route gateways)
    def tunnel_parent_ip(self, tunnel: VXLANTunnelEndpointUpdate) -> str:
        if self.ip_version == 4:
            return tunnel.parent_device_ip
        return _canonical(tunnel.parent_device_ipv6)

    def _vtep_addr(self, vtep: VXLANTunnelEndpointUpdate) -> str:
        return vtep.ipv4_addr if self.ip_version == 4 else _canonical(vtep.ipv6_addr)

    def _vtep_mac(self, vtep: VXLANTunnelEndpointUpdate) -> str:
        return (vtep.mac if self.ip_version == 4 else vtep.mac_v6).lower()

    @property
    def _neighbour_family(self) -> int:
        return AF_INET if self.ip_version == 4 else AF_INET6

    # --- desired state ----------------------------------------------------------------------

    def _parent_link(self, links: list[LinkDetail], iface: str) -> LinkDetail | None:
        return next((link for link in links if link.name == iface), None)

    def _desired_device(self, links: list[LinkDetail]) -> tuple[DeviceSpec | None, str]:
        local = self.local_tunnel()
        if local is None:
            return None, ""
        vtep, iface, cidr = local
        parent = self._parent_link(links, iface)
        if parent is None:
            return None, ""
        if self.ip_version == 4:
            mtu = self._mtu or max(68, parent.mtu - VXLAN_OVERHEAD)
        else:  # IPv6 needs at least 1280 on a link
            mtu = self._mtu or max(1280, parent.mtu - VXLAN_OVERHEAD_V6)
        info = VXLANInfo(vni=self._vni, local=self.tunnel_parent_ip(vtep),
                         parent_index=parent.index, port=self._port, learning=False)
        length = 32 if self.ip_version == 4 else 128
        return DeviceSpec(info, self._vtep_mac(vtep), mtu,
                          f"{self._vtep_addr(vtep)}/{length}"), cidr

    def _desired_neighbours(self, index: int, local_node: str) -> dict:
        wanted: dict[tuple[int, int, str], Neighbour] = {}
        for vtep in self._tunnels.values():
            if vtep.node == local_node or not self.tunnel_parent_ip(vtep):
                continue
            mac = self._vtep_mac(vtep)
            for n in (Neighbour(self._neighbour_family, index, self._vtep_addr(vtep), mac),
                      Neighbour(AF_BRIDGE, index, self.tunnel_parent_ip(vtep), mac)):
                wanted[n.key] = n
        return wanted

    def _desired_routes(self, index: int, local_node: str, parent_cidr: str,
                        parent_index: int) -> dict[str, OverlayRoute]:
        wanted: dict[str, OverlayRoute] = {}
        local_subnet = ipaddress.ip_interface(parent_cidr).network
        for dst, route in self._routes.items():
            vtep = self._tunnels.get(route.dst_node)
            if route.dst_node == local_node:
                continue
            if vtep is None or not self.tunnel_parent_ip(vtep):
                log.debug("route %s: node %s has no IPv%d VTEP (yet); not programmed", dst,
                          route.dst_node, self.ip_version)
                continue
            parent_ip = self.tunnel_parent_ip(vtep)
            same_subnet = ipaddress.ip_address(parent_ip) in local_subnet
            if self._pool_mode(dst) == "CrossSubnet" and same_subnet:
                wanted[dst] = OverlayRoute(dst, parent_ip, parent_index,
                                           self._protocol, onlink=False)
            else:
                wanted[dst] = OverlayRoute(dst, self._vtep_addr(vtep), index, self._protocol)
        return wanted

    # --- apply ------------------------------------------------------------------------------

    def _read_kernel(self, links: list[LinkDetail]) -> None:
        self._read_device_and_routes(links)
        neighbours: dict[tuple[int, int, str], Neighbour] = {}
        if self._device_link is not None:
            for family in (self._neighbour_family, AF_BRIDGE):
                for n in self.netlink.list_neighbours(family, self._device_link.index):
                    if n.permanent:
                        neighbours[n.key] = n
        self._neighbours.replace_all_dataplane(neighbours)
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
            local = self.local_tunnel()
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
        # (the kernel's own fe80:: address on an IPv6 device is not ours: never removed)
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


def _canonical(text: str) -> str:
    """An address as the kernel prints it ("" and unparsable text unchanged)."""
    try:
        return str(ipaddress.ip_address(text)) if text else text
    except ValueError:
        return text

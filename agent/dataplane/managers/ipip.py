"""IPIP manager: the `tunl0` device, its address and MTU, routes to remote IPIP blocks.

Role: Felix's IPIP manager (`ipip_mgr.go`) plus the IPIP routes that BIRD programs in
Calico's IPIP mode (Felix's ProgramClusterRoutes: here the agent programs them, and confd
keeps BIRD's own routes for IPIP pools out of the kernel, as for VXLAN pools). Inputs
(`on_update`):
- `IPIPTunnelUpdate/Remove` (the calc graph's IPIPResolver: every node's tunl0 address and
  host IP, sent while an IPIP pool exists);
- `RouteUpdate/Remove`: routes of type `remote_workload` with `ip_pool_type == "ipip"`
  (remote blocks, or remote workload /32s without blocks), via `dst_node_ip`;
- `IPAMPoolUpdate/Remove`: a pool's `ipip_mode` (CrossSubnet: a node in our own subnet is
  reached straight over the underlay, without encapsulation);
- the interface monitor's `InterfaceAddrsUpdate`: which interface holds this node's host IP
  (how the manager recognises the LOCAL tunnel without a hostname) and its subnet;
- `InSync`.

Settings (Felix's): `IpInIpEnabled` (None: follow the pools, the device is wanted while this
node has a tunnel; True: wanted even without an IPIP pool; False: never - IPIP routes are then
not programmed and a warning says why), `IpInIpMtu` (0: the parent interface's MTU - 20),
`IpInIpTunnelAddr` (overrides this node's tunl0 address; calico-node passes the Node's
`ipv4IPIPTunnelAddr` to Felix this way).

Kernel state it owns (in its namespace):

    tunl0              type ipip (the kernel's fallback device when the ipip module makes
                       one per namespace, else added), MTU as above, up;
                       address <tunnel IP>/32 (none when no address is known)
    per IPIP route     <dst> via <node IP> dev tunl0 onlink proto 82
                       (CrossSubnet, same subnet: <dst> via <node IP> dev <parent> proto 82)

Routes carry protocol `IPIP_ROUTE_PROTOCOL` (82), apart from the workload routes' 80 and
VXLAN's 81, so no two managers delete each other's routes. Any address on tunl0 is ours.
When the device is no longer wanted its address and routes go (after InSync), the device
stays: tunl0 is the kernel's fallback device in a namespace with the ipip module and cannot
be deleted (Felix leaves it too).

Easy to get wrong: a kernel without IPIP support (CONFIG_NET_IPIP off) has no tunl0 and
refuses `type ipip`; the manager then raises `IPIPError` naming the device on every apply
(counted as a failing manager), programs no IPIP route, and traffic to remote IPIP blocks
has no route: it fails closed rather than leaking unencapsulated.

Both dataplane modes: plain Linux networking, `linux_managers()` adds it in iptables and BPF
mode. Apply is a diff against what the kernel holds (read on the first apply, after a
failure and on periodic resync); applying the same state twice writes nothing. The inputs
and the route programming are the VXLAN manager's too (managers/overlay.py).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from dataclasses import dataclass

from pyfelix.agent.dataplane.managers.overlay import OverlayManagerBase
from pyfelix.agent.proto import (
    IPAMPoolUpdate,
    IPIPTunnelRemove,
    IPIPTunnelUpdate,
)
from pyfelix.agent.shims.link_netlink import LinkDetail, LinkNetlink, OverlayRoute
from pyfelix.agent.shims.netlink import NetlinkError

log = logging.getLogger(__name__)

IPIP_DEVICE = "tunl0"
IPIP_ROUTE_PROTOCOL = 82
IPIP_OVERHEAD = 20  # the outer IPv4 header
DEFAULT_MTU_WITHOUT_PARENT = 1480


class IPIPError(RuntimeError):
    """Some IPIP writes failed; they stay pending and the kernel is re-read next apply."""


@dataclass(frozen=True)
class TunnelSpec:
    mtu: int
    address: str  # "<tunnel IP>/32", or "" when no address is known


class IPIPManager(OverlayManagerBase):
    name = "ipip"
    TUNNEL_UPDATE = IPIPTunnelUpdate
    TUNNEL_REMOVE = IPIPTunnelRemove
    POOL_TYPE = "ipip"

    def __init__(self, *, netns: str | None = None, netlink: LinkNetlink | None = None,
                 enabled: bool | None = None, mtu: int = 0, tunnel_addr: str = "",
                 device: str = IPIP_DEVICE, protocol: int = IPIP_ROUTE_PROTOCOL) -> None:
        super().__init__(netns=netns, netlink=netlink, mtu=mtu, device=device,
                         protocol=protocol)
        if mtu and not 68 <= mtu <= 65535:
            raise ValueError(f"IpInIpMtu: {mtu} is not 0 (auto) or 68..65535")
        if tunnel_addr:
            try:
                ipaddress.IPv4Address(tunnel_addr)
            except ValueError:
                raise ValueError(f"IpInIpTunnelAddr: {tunnel_addr!r} is not an IPv4 "
                                 "address") from None
        self._enabled = enabled
        self._tunnel_addr = tunnel_addr
        self._warned_disabled = False

    @staticmethod
    def pool_mode(msg: IPAMPoolUpdate) -> str:
        return msg.ipip_mode

    # --- desired state ----------------------------------------------------------------------

    def _desired_device(self, links: list[LinkDetail]) -> TunnelSpec | None:
        if self._enabled is False:
            if (self._tunnels or self._routes) and not self._warned_disabled:
                log.warning("IpInIpEnabled is false: %s not configured, %d IPIP route(s) not "
                            "programmed", self._device, len(self._routes))
                self._warned_disabled = True
            return None
        local = self.local_tunnel()
        if local is None and not self._enabled:
            return None
        mtu = self._mtu
        address = self._tunnel_addr
        if local is not None:
            tunnel, iface, _ = local
            address = address or tunnel.ipv4_addr
            parent = next((link for link in links if link.name == iface), None)
            if not mtu and parent is not None:
                mtu = max(68, parent.mtu - IPIP_OVERHEAD)
        return TunnelSpec(mtu or DEFAULT_MTU_WITHOUT_PARENT,
                          f"{address}/32" if address else "")

    def _desired_routes(self, index: int, links: list[LinkDetail]) -> dict[str, OverlayRoute]:
        local = self.local_tunnel()
        local_node = local[0].node if local else ""
        local_subnet = ipaddress.ip_interface(local[2]).network if local else None
        parent_index = 0
        if local is not None:
            parent = next((lk for lk in links if lk.name == local[1]), None)
            parent_index = parent.index if parent else 0
        wanted: dict[str, OverlayRoute] = {}
        for dst, route in self._routes.items():
            if route.dst_node == local_node:
                continue
            gateway = route.dst_node_ip or getattr(self._tunnels.get(route.dst_node),
                                                   "parent_device_ip", "")
            if not gateway:
                log.debug("route %s: node %s has no host IP (yet); not programmed", dst,
                          route.dst_node)
                continue
            same_subnet = (local_subnet is not None
                           and ipaddress.ip_address(gateway) in local_subnet)
            if self._pool_mode(dst) == "CrossSubnet" and same_subnet and parent_index:
                wanted[dst] = OverlayRoute(dst, gateway, parent_index, self._protocol,
                                           onlink=False)
            else:
                wanted[dst] = OverlayRoute(dst, gateway, index, self._protocol)
        return wanted

    # --- apply ------------------------------------------------------------------------------

    def _read_kernel(self, links: list[LinkDetail]) -> None:
        self._read_device_and_routes(links)
        self._resync_requested = False

    def apply(self) -> None:
        if not (self._dirty or self._resync_requested or not self._kernel_routes.in_sync):
            return
        links = self.netlink.list_links()
        if self._resync_requested:
            self._read_kernel(links)
        else:
            self._device_link = next((lk for lk in links if lk.name == self._device), None)
        spec = self._desired_device(links)
        try:
            self._ensure_device(spec)
        except NetlinkError as exc:
            self._resync_requested = True
            hint = (" (this kernel has no IPIP support: CONFIG_NET_IPIP)"
                    if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL) else "")
            raise IPIPError(f"{self._device}: {exc}{hint}") from exc
        if spec is None or self._device_link is None:
            for dst in self._kernel_routes.desired_keys():
                self._kernel_routes.delete_desired(dst)
        else:
            wanted = self._desired_routes(self._device_link.index, links)
            for dst in self._kernel_routes.desired_keys() - wanted.keys():
                self._kernel_routes.delete_desired(dst)
            for dst, route in wanted.items():
                self._kernel_routes.set_desired(dst, route)
        self._dirty = False
        errors = self._apply_routes()
        if errors:
            self._resync_requested = True
            raise IPIPError(f"{len(errors)} IPIP route write(s) failed: {'; '.join(errors[:5])}")

    def _ensure_device(self, spec: TunnelSpec | None) -> None:
        nl = self.netlink
        link = self._device_link
        if spec is None:
            if link is not None and self._device_addrs and self._datastore_in_sync:
                log.info("no IPIP tunnel wanted: removing %s's address", self._device)
                for cidr in sorted(self._device_addrs):
                    nl.delete_addr(link.index, cidr)
                self._device_addrs = set()
            return
        if link is not None and link.kind not in ("ipip", ""):
            raise NetlinkError(errno.EEXIST, f"{self._device} exists as a {link.kind} "
                                             "device, not ipip; not touching it")
        if link is None:
            nl.add_ipip(self._device, mtu=spec.mtu)
            link = next(lk for lk in nl.list_links() if lk.name == self._device)
            self._device_addrs = set()
        if link.mtu != spec.mtu:
            nl.set_link(link.index, mtu=spec.mtu)
        if not link.admin_up:
            nl.set_link(link.index, up=True)
        wanted = {spec.address} if spec.address else set()
        for cidr in sorted(self._device_addrs - wanted):
            nl.delete_addr(link.index, cidr)
        for cidr in sorted(wanted - self._device_addrs):
            nl.add_addr(link.index, cidr)
        self._device_addrs = wanted
        self._device_link = next(lk for lk in nl.list_links() if lk.name == self._device)
        self.device_index = self._device_link.index

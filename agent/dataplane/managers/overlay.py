"""What the two overlay managers (IPIP and VXLAN) share: their inputs and their routes.

Role: the base of `IPIPManager` and `VXLANManager`. Both keep, from the same messages, the
same desired state -- every node's tunnel (keyed by node, carrying its host IP as
`parent_device_ip`), the remote-workload routes of their pool type, each pool's mode (for
CrossSubnet) and the addresses of this node's interfaces (which is how the local tunnel is
recognised without a hostname) -- and program their routes the same way: a diff of the
routes of their own protocol number against the kernel, deletions only after InSync.

Subclasses say which messages are theirs (`TUNNEL_UPDATE`, `TUNNEL_REMOVE`, `POOL_TYPE`,
`pool_mode(msg)`) and own their device: `_desired_device`, `_ensure_device`, `apply`.

IP version: a manager serves ONE family (`ip_version`, 4 unless the subclass says
otherwise): only routes, pools and kernel routes of that family are its own, and it finds
its tunnel's parent by `tunnel_parent_ip(tunnel)`. The IPv4 and IPv6 VXLAN managers share
the route protocol (81) and stay out of each other's routes by family.

Invariants: `on_update` only records desired state (no kernel access); `_apply_routes`
writes only the difference and reports each failed write instead of raising, so one bad
route does not stop the others.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from typing import Any, ClassVar

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import InSync, IPAMPoolRemove, IPAMPoolUpdate, RouteRemove, RouteUpdate
from pyfelix.agent.shims.link_netlink import AF_INET6, LinkDetail, LinkNetlink, OverlayRoute
from pyfelix.agent.shims.netlink import NetlinkError

log = logging.getLogger(__name__)


class OverlayManagerBase(ManagerBase):
    TUNNEL_UPDATE: ClassVar[type]
    TUNNEL_REMOVE: ClassVar[type]
    POOL_TYPE: ClassVar[str]  # the RouteUpdate.ip_pool_type this manager routes

    def __init__(self, *, netns: str | None, netlink: LinkNetlink | None, mtu: int,
                 device: str, protocol: int, ip_version: int = 4) -> None:
        super().__init__()
        if ip_version not in (4, 6):
            raise ValueError(f"ip_version: {ip_version} is not 4 or 6")
        self.ip_version = ip_version
        self._netns = netns
        self._netlink = netlink
        self._mtu = mtu
        self._device = device
        self._protocol = protocol
        self._tunnels: dict[str, Any] = {}
        self._routes: dict[str, RouteUpdate] = {}
        self._pools: dict[str, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = {}
        self._iface_addrs: dict[str, frozenset[str]] = {}
        self._kernel_routes: DeltaTracker[str, OverlayRoute] = DeltaTracker()
        self._device_link: LinkDetail | None = None
        self._device_addrs: set[str] = set()
        self._dirty = True
        self.device_index = 0

    @staticmethod
    def pool_mode(msg: IPAMPoolUpdate) -> str:
        raise NotImplementedError

    def tunnel_parent_ip(self, tunnel: Any) -> str:
        """The host address a tunnel's packets go to, for this manager's family ("" when
        the node has no tunnel of this family)."""
        return str(tunnel.parent_device_ip)

    def _of_my_family(self, cidr: str) -> bool:
        try:
            return ipaddress.ip_network(cidr, strict=False).version == self.ip_version
        except ValueError:
            return False

    @property
    def netlink(self) -> LinkNetlink:
        if self._netlink is None:
            from pyfelix.agent.shims.link_netlink import PyRoute2LinkNetlink

            self._netlink = PyRoute2LinkNetlink(self._netns)
        return self._netlink

    # --- on_update: desired state only ------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, self.TUNNEL_UPDATE):
            self._tunnels[msg.node] = msg  # type: ignore[attr-defined]
        elif isinstance(msg, self.TUNNEL_REMOVE):
            if self._tunnels.pop(msg.node, None) is None:  # type: ignore[attr-defined]
                return
        elif isinstance(msg, RouteUpdate):
            if (msg.type == "remote_workload" and msg.ip_pool_type == self.POOL_TYPE
                    and self._of_my_family(msg.dst)):
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
            if net.version == self.ip_version:
                self._pools[msg.id] = (net, self.pool_mode(msg))
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

    def local_tunnel(self) -> tuple[Any, str, str] | None:
        """(our tunnel, parent interface, parent CIDR): the tunnel whose host IP is ours."""
        for tunnel in sorted(self._tunnels.values(), key=lambda t: t.node):
            parent_ip = self.tunnel_parent_ip(tunnel)
            if not parent_ip:
                continue
            # compared as addresses: IPv6 has many spellings of one address
            try:
                parent = ipaddress.ip_address(parent_ip)
            except ValueError:
                continue
            for iface, cidrs in sorted(self._iface_addrs.items()):
                for cidr in cidrs:
                    if _address_of(cidr) == parent:
                        return tunnel, iface, cidr
        return None

    def _pool_mode(self, dst: str) -> str:
        """The mode of the most specific pool holding `dst` ("" outside every pool)."""
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            return ""
        modes = [(pool.prefixlen, mode) for pool, mode in self._pools.values()
                 if net.version == self.ip_version and net.version == pool.version
                 and net.subnet_of(pool)]  # type: ignore[arg-type]
        return max(modes)[1] if modes else ""

    @staticmethod
    def _set_desired(tracker: DeltaTracker, wanted: dict) -> None:  # type: ignore[type-arg]
        for key in tracker.desired_keys() - wanted.keys():
            tracker.delete_desired(key)
        for key, value in wanted.items():
            tracker.set_desired(key, value)

    # --- apply ------------------------------------------------------------------------------

    def _seed_interfaces(self, links: list[LinkDetail]) -> None:
        """Addresses of interfaces the monitor has not reported yet, from the kernel.

        A restarted agent can see InSync before the interface monitor's first dump: without
        this it would not find its parent interface, and remove its device's state."""
        unknown = {link.index: link.name for link in links
                   if link.name not in self._iface_addrs and link.name != self._device}
        if not unknown:
            return
        for index, cidrs in self.netlink.addresses_by_link().items():
            if index in unknown:
                self._iface_addrs[unknown[index]] = frozenset(cidrs)
                self._dirty = True

    def _read_device_and_routes(self, links: list[LinkDetail]) -> None:
        """The kernel's view of our device, its addresses and our routes (on resync)."""
        self._seed_interfaces(links)
        self._device_link = next((link for link in links if link.name == self._device), None)
        # the kernel's own IPv6 link-local address (every device up with IPv6 has one) is
        # not ours to manage
        self._device_addrs = ({a for a in self.netlink.list_addrs(self._device_link.index)
                               if not a.lower().startswith("fe80:")}
                              if self._device_link is not None else set())
        self._kernel_routes.replace_all_dataplane(
            {r.dst: r for r in self._list_kernel_routes()})

    def _list_kernel_routes(self) -> list[OverlayRoute]:
        """Our protocol's routes of our family (the IPv4 call is unchanged)."""
        if self.ip_version == 4:
            return self.netlink.list_routes(self._protocol)
        return self.netlink.list_routes(self._protocol, AF_INET6)

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


def _address_of(cidr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_interface(cidr).ip
    except ValueError:
        return None

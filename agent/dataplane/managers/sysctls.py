"""Sysctl manager: kernel knobs a node and its workload interfaces need.

Role: Felix's interface configuration. Desired values:
- global: `net.ipv4.ip_forward=1`; `net.ipv4.conf.default.rp_filter=1` (strict reverse-path
  filtering for interfaces created from now on); `net.ipv6.conf.all.forwarding=1` where the
  kernel has IPv6;
- per workload interface (its name starts with one of `interface_prefixes`, from the
  interface monitor's `InterfaceUpdate`): `rp_filter` 1 (strict; in iptables mode a second
  line behind the raw table's source check, see `agent.dataplane.iptables.render`) or 0 in
  BPF mode (the BPF programs do the RPF check, as in Felix), `proxy_arp=1` and
  `neigh.<if>.proxy_delay=0` (workloads ARP for their 169.254.1.1 gateway and get the
  host's MAC at once), `forwarding=1`, `route_localnet=1`; and, where the interface has
  IPv6, `accept_ra=0` and `forwarding=1`;
- iptables mode: `rp_filter` is 0 instead on the interface of a workload endpoint with IPv4
  `allow_spoofed_source_prefixes` (strict RPF would drop exactly the sources it allows; the
  raw-table source check enforces the rest). So this manager also takes
  `WorkloadEndpointUpdate/Remove` (interface = `endpoint.name`); an endpoint may come before
  or after its interface (the value follows both), and interface sysctls are still written
  only once the interface exists. BPF mode ignores endpoint messages. The kernel applies the
  larger of `conf/all/rp_filter` and the interface's value, so that 0 takes effect only
  where the node keeps `conf/all/rp_filter` at 0 (or 2, loose); conf/all is not ours.

Apply: values are read (only paths not read before, or all of them on resync) and only the
ones that differ are written, so applying twice writes nothing. An interface-specific entry
that does not exist means the interface just vanished (the monitor will say so) and is
skipped; a missing IPv6 entry means the interface has no IPv6, and its IPv6 keys are dropped.
Sysctls are never "deleted": when an interface goes, its entries are just forgotten.
"""

from __future__ import annotations

import errno
import ipaddress
import logging

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.events import IFACE_ABSENT, InterfaceUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import (
    InSync,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.sysctl import Sysctls

log = logging.getLogger(__name__)

GLOBAL_SYSCTLS: dict[str, str] = {
    "net/ipv4/ip_forward": "1",
    "net/ipv4/conf/default/rp_filter": "1",
}


# IPv6 routing to and from workloads (Felix sets it where IPv6 is supported); a kernel
# without IPv6 has no such entry, and it is then dropped like a workload's IPv6 keys.
OPTIONAL_GLOBAL_SYSCTLS: dict[str, str] = {
    "net/ipv6/conf/all/forwarding": "1",
}


def rp_filter_path(iface: str) -> str:
    return f"net/ipv4/conf/{iface}/rp_filter"


def allows_spoofed_ipv4(endpoint: WorkloadEndpoint) -> bool:
    """Whether the endpoint may send from IPv4 sources besides its own (then strict RPF
    must be off on its interface)."""
    for prefix in endpoint.allow_spoofed_source_prefixes:
        try:
            if ipaddress.ip_network(prefix, strict=False).version == 4:
                return True
        except ValueError:
            continue  # not allowed by the source check either
    return False


def interface_sysctls(iface: str, *, bpf_mode: bool, loose_rpf: bool = False
                      ) -> tuple[dict[str, str], dict[str, str]]:
    """(required IPv4 entries, optional IPv6 entries) for one workload interface.
    `loose_rpf`: its endpoint allows spoofed IPv4 sources (rp_filter 0)."""
    required = {
        rp_filter_path(iface): "0" if bpf_mode or loose_rpf else "1",
        f"net/ipv4/conf/{iface}/proxy_arp": "1",
        f"net/ipv4/neigh/{iface}/proxy_delay": "0",
        f"net/ipv4/conf/{iface}/forwarding": "1",
        f"net/ipv4/conf/{iface}/route_localnet": "1",
    }
    optional = {
        f"net/ipv6/conf/{iface}/accept_ra": "0",
        f"net/ipv6/conf/{iface}/forwarding": "1",
    }
    return required, optional


class SysctlError(RuntimeError):
    """Some sysctl writes failed; they stay pending and are retried."""


class SysctlManager(ManagerBase):
    name = "sysctls"

    def __init__(
        self,
        *,
        netns: str | None = None,
        interface_prefixes: tuple[str, ...] = ("cali",),
        bpf_mode: bool = False,
        sysctls: Sysctls | None = None,
        ipv6: bool = True,
    ) -> None:
        super().__init__()
        if not interface_prefixes or not all(interface_prefixes):
            raise ValueError("SysctlManager: interface_prefixes must be non-empty strings")
        self._netns = netns
        self._sysctls = sysctls
        self._prefixes = tuple(interface_prefixes)
        self._bpf_mode = bpf_mode
        self._ipv6 = ipv6  # Ipv6Support: False leaves IPv6 forwarding as it is
        self._tracker: DeltaTracker[str, str] = DeltaTracker()
        self._optional: set[str] = set()
        self._iface_paths: dict[str, set[str]] = {}
        # iptables mode: the endpoints that allow spoofed IPv4 sources -> their interface,
        # and the other way round
        self._loose_endpoints: dict[WorkloadEndpointID, str] = {}
        self._loose_ifaces: dict[str, set[WorkloadEndpointID]] = {}
        for path, value in GLOBAL_SYSCTLS.items():
            self._tracker.set_desired(path, value)
        for path, value in OPTIONAL_GLOBAL_SYSCTLS.items():  # absent: no IPv6 in the kernel
            if ipv6:
                self._tracker.set_desired(path, value)
                self._optional.add(path)

    @property
    def sysctls(self) -> Sysctls:
        if self._sysctls is None:
            from pyfelix.agent.shims.sysctl import ProcSysctls

            self._sysctls = ProcSysctls(self._netns)
        return self._sysctls

    def on_update(self, msg: object) -> None:
        if isinstance(msg, InterfaceUpdate):
            if not msg.name.startswith(self._prefixes):
                return
            if msg.state == IFACE_ABSENT:
                self._forget_interface(msg.name)
            elif msg.name not in self._iface_paths:
                required, optional = interface_sysctls(msg.name, bpf_mode=self._bpf_mode,
                                                       loose_rpf=self._loose_rpf(msg.name))
                if not self._ipv6:  # still refuse router advertisements, never forward
                    optional = {p: v for p, v in optional.items() if p.endswith("/accept_ra")}
                self._iface_paths[msg.name] = set(required) | set(optional)
                self._optional.update(optional)
                for path, value in {**required, **optional}.items():
                    self._tracker.set_desired(path, value)
        elif isinstance(msg, WorkloadEndpointUpdate | WorkloadEndpointRemove):
            if not self._bpf_mode:
                self._on_endpoint(msg)
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _loose_rpf(self, iface: str) -> bool:
        return bool(self._loose_ifaces.get(iface))

    def _on_endpoint(self, msg: WorkloadEndpointUpdate | WorkloadEndpointRemove) -> None:
        touched = set()
        old_iface = self._loose_endpoints.pop(msg.id, None)
        if old_iface is not None:
            ids = self._loose_ifaces[old_iface]
            ids.discard(msg.id)
            if not ids:
                del self._loose_ifaces[old_iface]
            touched.add(old_iface)
        if isinstance(msg, WorkloadEndpointUpdate) and allows_spoofed_ipv4(msg.endpoint):
            iface = msg.endpoint.name
            self._loose_endpoints[msg.id] = iface
            self._loose_ifaces.setdefault(iface, set()).add(msg.id)
            touched.add(iface)
        for iface in touched:
            # only interfaces that exist (and are ours) get written now; otherwise the
            # InterfaceUpdate that reports the interface picks the value up
            if iface in self._iface_paths:
                self._tracker.set_desired(rp_filter_path(iface),
                                          "0" if self._loose_rpf(iface) else "1")

    def _forget_interface(self, iface: str) -> None:
        for path in self._iface_paths.pop(iface, set()):
            self._tracker.delete_desired(path)
            self._tracker.delete_dataplane(path)  # the kernel removed it with the interface
            self._optional.discard(path)

    def apply(self) -> None:
        if self._resync_requested:
            self._read(path for path, _ in self._tracker.iter_desired())
            self._resync_requested = False
        unknown = [p for p, _ in self._tracker.pending_updates()
                   if self._tracker.get_dataplane(p) is None]
        if unknown:
            self._read(unknown)
        for path in self._tracker.pending_deletions():
            self._tracker.delete_dataplane(path)  # nothing to write: just forget it
        to_write = dict(self._tracker.pending_updates())
        if not to_write:
            return
        errors = self.sysctls.write_many(to_write)
        failures = []
        for path, value in to_write.items():
            exc = errors.get(path)
            if exc is None:
                self._tracker.set_dataplane(path, value)
            elif isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
                log.info("sysctl %s vanished before it could be written", path)
            else:
                failures.append(f"{path}={value}: {exc}")
        if failures:
            self._resync_requested = True
            raise SysctlError(f"{len(failures)} sysctl write(s) failed: {'; '.join(failures[:5])}")

    def _read(self, paths) -> None:  # type: ignore[no-untyped-def]
        values = self.sysctls.read_many(list(paths))
        for path, value in values.items():
            if value is not None:
                self._tracker.set_dataplane(path, value)
                continue
            self._tracker.delete_dataplane(path)
            if path in self._optional:
                log.debug("%s absent (no IPv6 on this interface); not managed", path)
                self._tracker.delete_desired(path)
                self._optional.discard(path)

    def close(self) -> None:
        if self._sysctls is not None:
            self._sysctls.close()
            self._sysctls = None

    def desired(self) -> dict[str, str]:
        return dict(self._tracker.iter_desired())

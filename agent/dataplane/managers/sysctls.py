"""Sysctl manager: kernel knobs a node and its workload interfaces need.

Role: Felix's interface configuration. Desired values:
- global: `net.ipv4.ip_forward=1`; `net.ipv4.conf.default.rp_filter=1` (strict reverse-path
  filtering for interfaces created from now on);
- per workload interface (its name starts with one of `interface_prefixes`, from the
  interface monitor's `InterfaceUpdate`): `rp_filter` 1 (strict; the iptables dataplane relies
  on it against spoofing) or 0 in BPF mode (the BPF programs do the RPF check, as in Felix),
  `proxy_arp=1` and `neigh.<if>.proxy_delay=0` (workloads ARP for their 169.254.1.1 gateway
  and get the host's MAC at once), `forwarding=1`, `route_localnet=1`; and, where the
  interface has IPv6, `accept_ra=0` and `forwarding=1`.

Apply: values are read (only paths not read before, or all of them on resync) and only the
ones that differ are written, so applying twice writes nothing. An interface-specific entry
that does not exist means the interface just vanished (the monitor will say so) and is
skipped; a missing IPv6 entry means the interface has no IPv6, and its IPv6 keys are dropped.
Sysctls are never "deleted": when an interface goes, its entries are just forgotten.
"""

from __future__ import annotations

import errno
import logging

from agent.dataplane.delta import DeltaTracker
from agent.dataplane.events import IFACE_ABSENT, InterfaceUpdate
from agent.dataplane.manager import ManagerBase
from agent.proto import InSync
from agent.shims.sysctl import Sysctls

log = logging.getLogger(__name__)

GLOBAL_SYSCTLS: dict[str, str] = {
    "net/ipv4/ip_forward": "1",
    "net/ipv4/conf/default/rp_filter": "1",
}


def interface_sysctls(iface: str, *, bpf_mode: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(required IPv4 entries, optional IPv6 entries) for one workload interface."""
    required = {
        f"net/ipv4/conf/{iface}/rp_filter": "0" if bpf_mode else "1",
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
    ) -> None:
        super().__init__()
        if not interface_prefixes or not all(interface_prefixes):
            raise ValueError("SysctlManager: interface_prefixes must be non-empty strings")
        self._netns = netns
        self._sysctls = sysctls
        self._prefixes = tuple(interface_prefixes)
        self._bpf_mode = bpf_mode
        self._tracker: DeltaTracker[str, str] = DeltaTracker()
        self._optional: set[str] = set()
        self._iface_paths: dict[str, set[str]] = {}
        for path, value in GLOBAL_SYSCTLS.items():
            self._tracker.set_desired(path, value)

    @property
    def sysctls(self) -> Sysctls:
        if self._sysctls is None:
            from agent.shims.sysctl import ProcSysctls

            self._sysctls = ProcSysctls(self._netns)
        return self._sysctls

    def on_update(self, msg: object) -> None:
        if isinstance(msg, InterfaceUpdate):
            if not msg.name.startswith(self._prefixes):
                return
            if msg.state == IFACE_ABSENT:
                self._forget_interface(msg.name)
            elif msg.name not in self._iface_paths:
                required, optional = interface_sysctls(msg.name, bpf_mode=self._bpf_mode)
                self._iface_paths[msg.name] = set(required) | set(optional)
                self._optional.update(optional)
                for path, value in {**required, **optional}.items():
                    self._tracker.set_desired(path, value)
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

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

"""Host IPs: this host's own addresses, from the interface monitor, as the set `cali40this-host`.

Role: Felix's host-IP tracking (int_dataplane's `onIfaceAddrsChange` + the `this-host` IP
set). Inputs (`on_update`): `InterfaceAddrsUpdate` (every address of one interface; None when
it is gone) and `InSync`. Output (`apply`): the ipset `cali40this-host` holds exactly the IPv4
addresses of the host's interfaces, minus:
- interfaces matching `InterfaceExclude` (Felix's default `kube-ipvs0`: kube-proxy's IPVS
  dummy interface carries SERVICE addresses, which are not this host's - traffic to them is
  forwarded to pods, see the iptables renderer's IPVS rules);
- workload interfaces (names starting with an `InterfacePrefix`; they carry no host address).

`HostIPsTracker` is the pure part (no kernel): other managers (the BPF dataplane's, the
iptables renderer) can keep one to know the host IPs from the same messages; so is
`resolve_host_endpoints()`, which maps host endpoints to interfaces (by name, "*", or by
their expected IPs) the same way for every dataplane. The manager
runs in both dataplane modes (`linux_managers()`); in iptables mode the IPVS rules match the
set, in BPF mode it is there for the nat table and for inspection.

Invariants: only `cali40this-host` is touched; nothing is written before the interface
monitor's first report (so a restarted agent does not empty the set meanwhile); then the set
exists and holds exactly the host IPs; the same state applied twice runs no command.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Mapping

from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate
from pyfelix.agent.dataplane.iptables.names import IPSET_THIS_HOST
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers.fixed_ipsets import FixedIPSets
from pyfelix.agent.proto import HostEndpoint, HostEndpointID, InSync
from pyfelix.agent.shims.cmd import CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)

DEFAULT_INTERFACE_EXCLUDE = ("kube-ipvs0",)
KUBE_IPVS_INTERFACE = "kube-ipvs0"


class InterfaceMatcher:
    """Felix's InterfaceExclude: names, or `/regex/` entries (full match)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self._names: set[str] = set()
        self._regexes: list[re.Pattern[str]] = []
        for raw in patterns:
            pattern = raw.strip()
            if not pattern:
                continue
            if len(pattern) > 2 and pattern.startswith("/") and pattern.endswith("/"):
                try:
                    self._regexes.append(re.compile(pattern[1:-1]))
                except re.error as exc:
                    raise ValueError(f"InterfaceExclude: {pattern!r} is not a valid regular "
                                     f"expression: {exc}") from exc
            else:
                self._names.add(pattern)

    @classmethod
    def parse(cls, text: str) -> InterfaceMatcher:
        return cls(text.split(","))

    def matches(self, name: str) -> bool:
        return name in self._names or any(r.fullmatch(name) for r in self._regexes)


class HostIPsTracker:
    """Interface -> addresses, and the host IPs they make (pure bookkeeping)."""

    def __init__(self, *, exclude: InterfaceMatcher | None = None,
                 workload_prefixes: tuple[str, ...] = ("cali",)) -> None:
        self._exclude = exclude or InterfaceMatcher(DEFAULT_INTERFACE_EXCLUDE)
        self._workload_prefixes = tuple(workload_prefixes)
        self._addrs: dict[str, frozenset[str]] = {}

    def on_addrs(self, msg: InterfaceAddrsUpdate) -> bool:
        """Record one interface's addresses; True when the host IPs changed."""
        before = self.host_ips()
        if msg.addrs is None:
            self._addrs.pop(msg.name, None)
        else:
            self._addrs[msg.name] = msg.addrs
        return self.host_ips() != before

    def counts(self, iface: str) -> bool:
        return not (self._exclude.matches(iface) or iface.startswith(self._workload_prefixes))

    def host_ips(self) -> frozenset[str]:
        """Every address (IPv4 and IPv6, without prefix length) of the counted interfaces."""
        out: set[str] = set()
        for iface, cidrs in self._addrs.items():
            if not self.counts(iface):
                continue
            for cidr in cidrs:
                try:
                    out.add(str(ipaddress.ip_interface(cidr).ip))
                except ValueError:
                    log.warning("interface %s: address %r does not parse; ignored", iface, cidr)
        return frozenset(out)

    def ipv4_host_ips(self) -> frozenset[str]:
        return frozenset(ip for ip in self.host_ips() if ":" not in ip)

    def addresses_of(self, iface: str) -> frozenset[str]:
        return self._addrs.get(iface, frozenset())

    def interfaces(self) -> dict[str, frozenset[str]]:
        return dict(self._addrs)


def resolve_host_endpoints(heps: Mapping[HostEndpointID, HostEndpoint],
                           iface_addrs: Mapping[str, Iterable[str]],
                           workload_prefixes: tuple[str, ...]) -> dict[str, HostEndpointID]:
    """Interface -> the host endpoint that applies to it (pure; both dataplanes use it).

    An endpoint with `name` applies to that interface ("*": returned under "*", meaning every
    host interface); one with `name == ""` to every interface carrying one of its expected
    IPs (`iface_addrs`: interface -> its addresses, with or without prefix length). When two
    claim one interface the first by id wins (logged); workload interfaces never count."""
    resolved: dict[str, HostEndpointID] = {}
    ips_by_iface = {iface: {_ip(a) for a in addrs} - {""}
                    for iface, addrs in iface_addrs.items()}
    for hep_id in sorted(heps):
        hep = heps[hep_id]
        if hep.name:
            ifaces = [hep.name]
        else:
            wanted = {_ip(a) for a in hep.expected_ipv4_addrs + hep.expected_ipv6_addrs} - {""}
            ifaces = sorted(i for i, ips in ips_by_iface.items() if ips & wanted)
        for iface in ifaces:
            if iface.startswith(workload_prefixes):
                log.error("host endpoint %s: %s is a workload interface; not applied",
                          hep_id.endpoint, iface)
                continue
            owner = resolved.setdefault(iface, hep_id)
            if owner != hep_id:
                log.error("host endpoints %s and %s both claim %s; %s wins",
                          owner.endpoint, hep_id.endpoint, iface, owner.endpoint)
    return resolved


def _ip(address: str) -> str:
    try:
        return str(ipaddress.ip_interface(address).ip)
    except ValueError:
        return ""


class HostIPsManager(ManagerBase):
    name = "host-ips"

    def __init__(self, *, netns: str | None = None, runner: CommandRunner | None = None,
                 exclude: InterfaceMatcher | None = None,
                 workload_prefixes: tuple[str, ...] = ("cali",)) -> None:
        super().__init__()
        self._runner = runner or NetnsCommandRunner(netns)
        self.tracker = HostIPsTracker(exclude=exclude, workload_prefixes=workload_prefixes)
        self._sets = FixedIPSets(self._runner, (IPSET_THIS_HOST,))
        self._dirty = True
        self._seen_addresses = False

    def on_update(self, msg: object) -> None:
        if isinstance(msg, InterfaceAddrsUpdate):
            self._seen_addresses = True
            if self.tracker.on_addrs(msg):
                self._dirty = True
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def request_resync(self) -> None:
        super().request_resync()
        self._sets.request_resync()

    def apply(self) -> None:
        if not self._seen_addresses:
            return  # a restarted agent: keep the kernel's set until the monitor has reported
        if self._dirty:
            self._sets.set_members(IPSET_THIS_HOST, self.tracker.ipv4_host_ips())
            self._dirty = False
        if self._resync_requested:
            self._sets.request_resync()
            self._resync_requested = False
        self._sets.apply()

    def host_ips(self) -> frozenset[str]:
        return self.tracker.host_ips()

"""NAT-outgoing manager: IP pools with `natOutgoing: true` masquerade traffic leaving the
pools; with FloatingIPs Enabled, each local endpoint's floating IPs are DNATed to it.

Role: Felix's masquerade manager and floating-IP manager, one instance per namespace for
both IP families (Felix runs one of each per family). Inputs (`on_update`):
`IPAMPoolUpdate` / `IPAMPoolRemove` (the pool's CIDR and `masquerade` flag),
`WorkloadEndpointUpdate/Remove` (each local endpoint's `ipv4_nat` / `ipv6_nat`), `InSync`.
Kernel state it owns, per family, in that family's nat table (iptables / ip6tables, same
backend) and IP sets (names as Felix's; `cali40...` family inet, `cali60...` family inet6):

    ipset cali40all-ipam-pools    every IPv4 pool's CIDR       (cali60all-ipam-pools: IPv6)
    ipset cali40masq-ipam-pools   the CIDRs of pools with natOutgoing (cali60masq-ipam-pools)
    POSTROUTING ─(our insert)─> cali-POSTROUTING ──> cali-nat-outgoing
        -m set --match-set cali40masq-ipam-pools src
        -m set ! --match-set cali40all-ipam-pools dst  -j MASQUERADE
        (the rule is present only while some pool of the family has natOutgoing)

So traffic from a natOutgoing pool to anywhere outside ALL pools (of its family) leaves with
the node's address; traffic between pools (same or different, natOutgoing or not) is never
translated, and pools without natOutgoing are never translated.

Floating IPs (FloatingIPs Enabled, `floating_ips=True`): while the family has any, its nat
table also holds Felix's

    PREROUTING, OUTPUT ─(our inserts)─> cali-PREROUTING / cali-OUTPUT ──> cali-fip-dnat
        -d <external>/32 -j DNAT --to-destination <internal>     (one per floating IP)
    cali-POSTROUTING ──> cali-fip-snat (before cali-nat-outgoing)
        -s <internal>/32 -d <internal>/32 -j SNAT --to-source <external>
        (a pod reaching its own floating IP sees it answer from that address)

(IPv6: the same chain names in ip6tables' nat table, /128.) The DNAT happens before
routing and before the filter table, so the pod's ingress policy (iptables chains, or the tc
program on its veth in BPF mode) sees the pod's own address: policy for a floating IP is the
policy of the pod IP; replies are un-NATed by conntrack.

Both dataplane modes: `linux_managers()` adds this manager in iptables AND BPF mode; in BPF
mode NAT outgoing and floating IPs use the same nat-table rules (the BPF programs let pod
traffic that leaves the node continue up the stack, where netfilter's nat table sees it,
and police the DNATed packet at the pod's veth by the pod's address).

Ipv6Support false (`ipv6=False`): nothing IPv6 is programmed at all: no ip6tables command
runs, no `cali60` set exists, IPv6 pools and `ipv6_nat` are ignored.

Order inside one apply: sets are created/filled before the rules that reference them, and
destroyed (`finish_apply`) only after the rules are gone. Before InSync nothing of ours is
deleted (a restarted agent keeps masquerading until it knows the pools again). The IPv6
table is applied even when the IPv4 one failed (and the other way round); either failure is
raised after both were tried.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_FIP_DNAT,
    CHAIN_FIP_SNAT,
    CHAIN_NAT_OUTGOING,
    CHAIN_OUTPUT,
    CHAIN_POSTROUTING,
    CHAIN_PREROUTING,
    IPSET_ALL_POOLS,
    IPSET_ALL_POOLS6,
    IPSET_MASQ_POOLS,
    IPSET_MASQ_POOLS6,
)
from pyfelix.agent.dataplane.iptables.restore import (
    IptablesBinaries,
    IptablesError,
    IptablesTable,
    detect_backend,
)
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers.fixed_ipsets import FixedIPSets
from pyfelix.agent.proto import (
    InSync,
    IPAMPoolRemove,
    IPAMPoolUpdate,
    NatInfo,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.cmd import CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NatFamily:
    """What differs between the IPv4 and the IPv6 nat tables: the sets' names and the
    host prefix length of a floating IP's match."""

    version: int
    all_pools_set: str
    masq_pools_set: str
    host_prefix: int


NAT_FAMILIES = {
    4: NatFamily(4, IPSET_ALL_POOLS, IPSET_MASQ_POOLS, 32),
    6: NatFamily(6, IPSET_ALL_POOLS6, IPSET_MASQ_POOLS6, 128),
}


def _version(address: str) -> int:
    return 6 if ":" in address else 4


def nat_chains(masquerade_active: bool, floating_ips: Iterable[NatInfo] = (), *,
               version: int = 4) -> list[Chain]:
    """The nat table's chains for one IP version (pure): cali-POSTROUTING and
    cali-nat-outgoing; with floating IPs also cali-PREROUTING / cali-OUTPUT ->
    cali-fip-dnat and cali-fip-snat (Felix's). Floating IPs of the other family are
    ignored."""
    family = NAT_FAMILIES[version]
    rules: tuple[str, ...] = ()
    if masquerade_active:
        rules = (f"-m set --match-set {family.masq_pools_set} src "
                 f"-m set ! --match-set {family.all_pools_set} dst -j MASQUERADE",)
    fips = sorted({f for f in floating_ips if _version(f.ext_ip) == version})
    if not fips:
        return [Chain(CHAIN_POSTROUTING, (f"-j {CHAIN_NAT_OUTGOING}",)),
                Chain(CHAIN_NAT_OUTGOING, rules)]
    host = family.host_prefix
    dnat = tuple(f"-d {f.ext_ip}/{host} -j DNAT --to-destination {f.int_ip}" for f in fips)
    snat = tuple(f"-s {f.int_ip}/{host} -d {f.int_ip}/{host} -j SNAT --to-source {f.ext_ip}"
                 for f in fips)
    return [Chain(CHAIN_PREROUTING, (f"-j {CHAIN_FIP_DNAT}",)),
            Chain(CHAIN_OUTPUT, (f"-j {CHAIN_FIP_DNAT}",)),
            Chain(CHAIN_FIP_DNAT, dnat),
            Chain(CHAIN_POSTROUTING, (f"-j {CHAIN_FIP_SNAT}", f"-j {CHAIN_NAT_OUTGOING}")),
            Chain(CHAIN_FIP_SNAT, snat),
            Chain(CHAIN_NAT_OUTGOING, rules)]


class NatOutgoingManager(ManagerBase):
    name = "nat-outgoing"

    def __init__(self, *, netns: str | None = None, runner: CommandRunner | None = None,
                 backend: str = "auto", binaries: IptablesBinaries | None = None,
                 floating_ips: bool = False, ipv6: bool = True) -> None:
        super().__init__()
        self._floating_ips_enabled = floating_ips
        self._versions = (4, 6) if ipv6 else (4,)  # Ipv6Support false: nothing IPv6
        self._floating_ips: dict[object, tuple[NatInfo, ...]] = {}  # endpoint id -> NATs
        self._runner = runner or NetnsCommandRunner(netns)
        self._backend_mode = backend
        self._binaries = binaries
        self._tables: dict[int, IptablesTable] = {}
        self._sets = FixedIPSets(self._runner, (
            name for v in self._versions
            for name in (NAT_FAMILIES[v].all_pools_set, NAT_FAMILIES[v].masq_pools_set)))
        self._pools: dict[str, tuple[str, bool]] = {}  # pool id -> (CIDR, masquerade)
        self._dirty = True

    def table_for(self, version: int) -> IptablesTable:
        """The nat table of IP `version` (ip6tables' of the same backend for 6)."""
        if version not in self._versions:
            raise ValueError(f"IPv{version} NAT is not enabled here")
        if version not in self._tables:
            if self._binaries is None:
                self._binaries = detect_backend(self._runner, self._backend_mode)
            binaries = self._binaries if version == 4 else self._binaries.ipv6()
            self._tables[version] = IptablesTable(self._runner, binaries=binaries, table="nat")
        return self._tables[version]

    @property
    def table(self) -> IptablesTable:
        """The IPv4 nat table."""
        return self.table_for(4)

    def on_update(self, msg: object) -> None:
        if isinstance(msg, IPAMPoolUpdate):
            try:
                net = ipaddress.ip_network(msg.cidr, strict=False)
            except ValueError:
                log.error("IPAMPoolUpdate %s: cidr %r is not a CIDR; pool ignored", msg.id,
                          msg.cidr)
                self._forget(msg.id)
                return
            if net.version not in self._versions:
                self._forget(msg.id)
                return
            entry = (str(net), msg.masquerade)
            if self._pools.get(msg.id) != entry:
                self._pools[msg.id] = entry
                self._dirty = True
        elif isinstance(msg, IPAMPoolRemove):
            self._forget(msg.id)
        elif isinstance(msg, WorkloadEndpointUpdate):
            nats: tuple[NatInfo, ...] = ()
            if self._floating_ips_enabled:
                nats = msg.endpoint.ipv4_nat
                if 6 in self._versions:
                    nats += msg.endpoint.ipv6_nat
            if self._floating_ips.get(msg.id, ()) != nats:
                if nats:
                    self._floating_ips[msg.id] = nats
                else:
                    self._floating_ips.pop(msg.id, None)
                self._dirty = True
        elif isinstance(msg, WorkloadEndpointRemove):
            if self._floating_ips.pop(msg.id, None) is not None:
                self._dirty = True
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _forget(self, pool_id: str) -> None:
        if self._pools.pop(pool_id, None) is not None:
            self._dirty = True

    def request_resync(self) -> None:
        super().request_resync()
        self._sets.request_resync()
        for table in self._tables.values():
            table.request_resync()

    def floating_ips(self, version: int | None = None) -> list[NatInfo]:
        """The floating IPs programmed (of IP `version`; None: both)."""
        return sorted({nat for nats in self._floating_ips.values() for nat in nats
                       if version is None or _version(nat.ext_ip) == version})

    def masquerading_pools(self, version: int | None = None) -> list[str]:
        return sorted(cidr for cidr, masq in self._pools.values()
                      if masq and (version is None or _version(cidr) == version))

    def _pools_of(self, version: int) -> list[str]:
        return [cidr for cidr, _ in self._pools.values() if _version(cidr) == version]

    def apply(self) -> None:
        if self._dirty:
            for version in self._versions:
                family = NAT_FAMILIES[version]
                self._sets.set_members(family.all_pools_set, self._pools_of(version))
                self._sets.set_members(family.masq_pools_set,
                                       self.masquerading_pools(version))
                table = self.table_for(version)
                fips = self.floating_ips(version)
                chains = nat_chains(bool(self.masquerading_pools(version)), fips,
                                    version=version)
                for name in table.desired_chain_names() - {c.name for c in chains}:
                    table.remove_chain(name)
                for chain in chains:
                    table.set_chain(chain)
                table.set_base_inserts("POSTROUTING", (f"-j {CHAIN_POSTROUTING}",))
                for base, ours in (("PREROUTING", CHAIN_PREROUTING), ("OUTPUT", CHAIN_OUTPUT)):
                    table.set_base_inserts(base, (f"-j {ours}",) if fips else ())
            self._dirty = False
        if self._resync_requested:
            self._sets.request_resync()
            for version in self._versions:
                self.table_for(version).request_resync()
            self._resync_requested = False
        self._sets.apply()
        errors: list[tuple[int, IptablesError]] = []
        for version in self._versions:  # one family failing does not stop the other
            try:
                self.table_for(version).apply(allow_deletes=self._datastore_in_sync)
            except IptablesError as exc:
                errors.append((version, exc))
        if errors:
            raise IptablesError("; ".join(f"IPv{v} nat table: {e}" for v, e in errors)) \
                from errors[0][1]

    def finish_apply(self) -> None:
        if self._datastore_in_sync:
            self._sets.apply_deletions()

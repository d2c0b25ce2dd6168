"""NAT-outgoing manager: IP pools with `natOutgoing: true` masquerade traffic leaving the pools.

Role: Felix's masquerade manager. Inputs (`on_update`): `IPAMPoolUpdate` / `IPAMPoolRemove`
(the pool's CIDR and `masquerade` flag), `InSync`. Kernel state it owns, in the namespace's
nat table and IP sets (names as Felix's):

    ipset cali40all-ipam-pools    every IPv4 pool's CIDR
    ipset cali40masq-ipam-pools   the CIDRs of pools with natOutgoing
    POSTROUTING ─(our insert)─> cali-POSTROUTING ──> cali-nat-outgoing
        -m set --match-set cali40masq-ipam-pools src
        -m set ! --match-set cali40all-ipam-pools dst  -j MASQUERADE
        (the rule is present only while some pool has natOutgoing)

So traffic from a natOutgoing pool to anywhere outside ALL pools leaves with the node's
address; traffic between pools (same or different, natOutgoing or not) is never translated,
and pools without natOutgoing are never translated.

Both dataplane modes: `linux_managers()` adds this manager in iptables AND BPF mode; in BPF
mode NAT outgoing uses the same nat-table rules (the BPF programs let pod traffic that leaves
the node continue up the stack, where netfilter's nat table sees it).

Order inside one apply: sets are created/filled before the rule that references them, and
destroyed (`finish_apply`) only after the rules are gone. Before InSync nothing of ours is
deleted (a restarted agent keeps masquerading until it knows the pools again).
IPv6 pools are skipped (IPv4 nat table only).

Floating IPs (FloatingIPs Enabled, `floating_ips=True`): `WorkloadEndpointUpdate/Remove`
carry each local endpoint's `ipv4_nat`; while any exists the nat table also holds Felix's

    PREROUTING, OUTPUT ─(our inserts)─> cali-PREROUTING / cali-OUTPUT ──> cali-fip-dnat
        -d <external>/32 -j DNAT --to-destination <internal>     (one per floating IP)
    cali-POSTROUTING ──> cali-fip-snat (before cali-nat-outgoing)
        -s <internal>/32 -d <internal>/32 -j SNAT --to-source <external>
        (a pod reaching its own floating IP sees it answer from that address)

The DNAT happens before routing and before the filter table, so the pod's ingress policy
(iptables chains, or the tc program on its veth in BPF mode) sees the pod's own address:
policy for a floating IP is the policy of the pod IP; replies are un-NATed by conntrack.
Floating IPs are IPv4 only here.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.names import (
    CHAIN_FIP_DNAT,
    CHAIN_FIP_SNAT,
    CHAIN_NAT_OUTGOING,
    CHAIN_OUTPUT,
    CHAIN_POSTROUTING,
    CHAIN_PREROUTING,
    IPSET_ALL_POOLS,
    IPSET_MASQ_POOLS,
)
from pyfelix.agent.dataplane.iptables.restore import IptablesBinaries, IptablesTable, detect_backend
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


def nat_chains(masquerade_active: bool,
               floating_ips: Iterable[NatInfo] = ()) -> list[Chain]:
    """The nat table's chains (pure): cali-POSTROUTING and cali-nat-outgoing; with floating
    IPs also cali-PREROUTING / cali-OUTPUT -> cali-fip-dnat and cali-fip-snat (Felix's)."""
    rules: tuple[str, ...] = ()
    if masquerade_active:
        rules = (f"-m set --match-set {IPSET_MASQ_POOLS} src "
                 f"-m set ! --match-set {IPSET_ALL_POOLS} dst -j MASQUERADE",)
    fips = sorted(set(floating_ips))
    if not fips:
        return [Chain(CHAIN_POSTROUTING, (f"-j {CHAIN_NAT_OUTGOING}",)),
                Chain(CHAIN_NAT_OUTGOING, rules)]
    dnat = tuple(f"-d {f.ext_ip}/32 -j DNAT --to-destination {f.int_ip}" for f in fips)
    snat = tuple(f"-s {f.int_ip}/32 -d {f.int_ip}/32 -j SNAT --to-source {f.ext_ip}"
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
                 floating_ips: bool = False) -> None:
        super().__init__()
        self._floating_ips_enabled = floating_ips
        self._floating_ips: dict[object, tuple[NatInfo, ...]] = {}  # endpoint id -> NATs
        self._runner = runner or NetnsCommandRunner(netns)
        self._backend_mode = backend
        self._binaries = binaries
        self._table: IptablesTable | None = None
        self._sets = FixedIPSets(self._runner, (IPSET_ALL_POOLS, IPSET_MASQ_POOLS))
        self._pools: dict[str, tuple[str, bool]] = {}  # pool id -> (IPv4 CIDR, masquerade)
        self._dirty = True

    @property
    def table(self) -> IptablesTable:
        if self._table is None:
            binaries = self._binaries or detect_backend(self._runner, self._backend_mode)
            self._table = IptablesTable(self._runner, binaries=binaries, table="nat")
        return self._table

    def on_update(self, msg: object) -> None:
        if isinstance(msg, IPAMPoolUpdate):
            try:
                net = ipaddress.ip_network(msg.cidr, strict=False)
            except ValueError:
                log.error("IPAMPoolUpdate %s: cidr %r is not a CIDR; pool ignored", msg.id,
                          msg.cidr)
                self._forget(msg.id)
                return
            if net.version != 4:
                self._forget(msg.id)
                return
            entry = (str(net), msg.masquerade)
            if self._pools.get(msg.id) != entry:
                self._pools[msg.id] = entry
                self._dirty = True
        elif isinstance(msg, IPAMPoolRemove):
            self._forget(msg.id)
        elif isinstance(msg, WorkloadEndpointUpdate):
            nats = msg.endpoint.ipv4_nat if self._floating_ips_enabled else ()
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
        if self._table is not None:
            self._table.request_resync()

    def floating_ips(self) -> list[NatInfo]:
        return sorted({nat for nats in self._floating_ips.values() for nat in nats})

    def masquerading_pools(self) -> list[str]:
        return sorted(cidr for cidr, masq in self._pools.values() if masq)

    def apply(self) -> None:
        if self._dirty:
            self._sets.set_members(IPSET_ALL_POOLS, (c for c, _ in self._pools.values()))
            self._sets.set_members(IPSET_MASQ_POOLS, self.masquerading_pools())
            table = self.table
            fips = self.floating_ips()
            chains = nat_chains(bool(self.masquerading_pools()), fips)
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
            self.table.request_resync()
            self._resync_requested = False
        self._sets.apply()
        self.table.apply(allow_deletes=self._datastore_in_sync)

    def finish_apply(self) -> None:
        if self._datastore_in_sync:
            self._sets.apply_deletions()

"""iptables policy manager: policies, profiles, workload and host endpoints -> iptables chains.

Role: the iptables fallback's policy half (Felix's policy manager + endpoint manager for
iptables). Inputs (`on_update`): `ActivePolicyUpdate/Remove`, `ActiveProfileUpdate/Remove`,
`WorkloadEndpointUpdate/Remove`, `HostEndpointUpdate/Remove`, `ConfigUpdate`
(DefaultEndpointToHostAction, FailsafeInboundHostPorts, FailsafeOutboundHostPorts),
`VXLANTunnelEndpointUpdate/Remove` (the nodes' VXLAN parent IPs, kept in the set
`cali40all-vxlan-net`: the only sources VXLAN packets are accepted from, and no host endpoint
policy blocks them), `IPIPTunnelUpdate/Remove` (the nodes' host IPs, kept in
`cali40all-hosts-net`: the only sources IPIP packets are accepted from), the interface
monitor's `InterfaceAddrsUpdate` (host endpoints given by
`expectedIPs` only are resolved to the interfaces carrying those addresses) and
`InterfaceUpdate` (`kube-ipvs0` appearing or going switches the IPVS rules), `InSync`.
Output (`apply`): three IPv4 tables of the namespace hold exactly the rendered chains
(`agent.dataplane.iptables.render` and `.hostendpoints`) via one `IptablesTable` each, all
written by ONE iptables-restore (a `*table ... COMMIT` block per table that changed); then
the IPv6 filter table (`.ipv6`), a fourth `IptablesTable` with the ip6tables binaries of the
same backend, by one ip6tables-restore in the same apply():

    filter   normal policies, profiles, workload chains, host endpoint chains (normal and
             applyOnForward), failsafes, cali-INPUT/-FORWARD/-OUTPUT
    mangle   preDNAT policies, their host endpoint chains, failsafes, cali-PREROUTING
    raw      doNotTrack policies, their host endpoint chains, failsafes,
             cali-PREROUTING/-OUTPUT; the workloads' source check (anti-spoofing):
             cali-wl-src-dispatch -> cali-ws-IF per endpoint (its IPv4 nets and IPv4
             allowSpoofedSourcePrefixes RETURN, any other source DROPs)
    filter6  (ip6tables) IPv6 policy for workloads: the same policy, profile, endpoint
             and dispatch chains rendered for IPv6 (`RuleRenderer(family=6)`: IPv6 rules,
             `cali60*` IP sets, ICMPv6), each endpoint's IPv6 source check (cali-ws-IF, its
             IPv6 nets and IPv6 allowSpoofedSourcePrefixes) jumped to first from its
             cali-fw-IF, neighbour discovery/MLD between a workload and the host accepted
             first (`ipv6.ipv6_workload_static_chains`). Host endpoints' IPv6 and
             preDNAT/doNotTrack IPv6 rules are not rendered (not policed in IPv6).
             With Ipv6Support false (`ipv6_policy=False`): no IPv6 policy, endpoint or
             dispatch chain, only `ipv6.ipv6_disabled_static_chains` (ND/MLD accepted,
             every other workload IPv6 packet dropped).

One family failing does not stop the other from being programmed in the round; either
failure is raised. ip6tables missing, or a kernel without IPv6, is such a failure (named as
such): the rules that keep workload IPv6 closed cannot be written, so the manager does not
report success (the loop retries, then fails closed) rather than skip IPv6 silently.

IP sets the rules reference are programmed by `IPSetsManager` (calc-graph sets) and
`HostIPsManager` (`cali40this-host`, IPVS rules), which the loop applies BEFORE this manager
(creates/fills) and finishes AFTER it (deletions).

Host-endpoints-only mode (`host_endpoints_only=True`, what `linux_managers()` builds in BPF
mode, where tc programs police workload interfaces): workload endpoint messages are ignored;
no workload dispatch, endpoint or cali-wl-to-host chains and no IPVS rules are rendered;
cali-FORWARD keeps only the applyOnForward host endpoint dispatch (which returns at once for
workload interfaces), cali-INPUT hands pod->host packets back to INPUT (RETURN, or ACCEPT
when DefaultEndpointToHostAction is Accept: the tc program already applied the pod's egress
policy and the action, dropping on Drop) - so nothing here filters workload traffic a
second time (`RuleRenderer.host_endpoint_only_chains`). Only the policies and profiles some
host endpoint lists are rendered (a policy becomes rendered/removed when a host endpoint
starts/stops listing it), and `referenced_ip_sets()` tells the IP-sets manager which sets
their rules match. No raw-table source check (the tc programs do the RPF check) and no IPv6
chains (the tc programs handle workload IPv6); once after InSync, the IPv6 chains an earlier
iptables-mode agent left are swept (best effort: a failure there is only logged, since BPF
mode needs nothing from ip6tables). Everything else - host endpoint chains in all three
tables, failsafes, VXLAN source rules, DefaultEndpointToHostAction / failsafe config
updates - is as in iptables mode.

Host endpoints: one per interface (`interfaceName`; "*" = every host interface; none = every
interface carrying one of its `expectedIPs`). When two claim the same interface, the first
by id wins (logged). Workload interfaces are never host endpoints.

Invariants: on_update renders nothing: it marks policies/profiles/endpoints dirty; apply()
re-renders only dirty objects (every workload endpoint when the set of known policies or
profiles changed, since endpoint chains jump to them; all host endpoint chains when anything
they depend on changed - there are few); chains of ours that nothing wants are deleted only
after InSync. Policy-critical: a persistent failure makes the loop fail closed.
"""

from __future__ import annotations

import ipaddress
import logging

from pyfelix.agent.dataplane.events import IFACE_ABSENT, InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.iptables.chains import Chain
from pyfelix.agent.dataplane.iptables.hostendpoints import (
    FILTER,
    MANGLE,
    RAW,
    Failsafes,
    HostEndpointRenderer,
    default_failsafes,
    host_endpoint_policy_ids,
    host_endpoint_profile_ids,
    parse_failsafe_ports,
)
from pyfelix.agent.dataplane.iptables.ipv6 import (
    ipv6_base_chain_inserts,
    ipv6_disabled_static_chains,
    ipv6_workload_static_chains,
)
from pyfelix.agent.dataplane.iptables.names import (
    IPSET_ALL_HOSTS,
    IPSET_ALL_VXLAN,
    IPSET_ALL_VXLAN6,
    valid_iface_name,
)
from pyfelix.agent.dataplane.iptables.render import (
    ENDPOINT_TO_HOST_ACTIONS,
    Marks,
    RuleRenderer,
    workload_tunnel_drops,
)
from pyfelix.agent.dataplane.iptables.restore import (
    IptablesBinaries,
    IptablesError,
    IptablesTable,
    apply_tables,
    detect_backend,
)
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers.fixed_ipsets import FixedIPSets
from pyfelix.agent.dataplane.managers.hostips import KUBE_IPVS_INTERFACE, resolve_host_endpoints
from pyfelix.agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    ActiveProfileRemove,
    ActiveProfileUpdate,
    ConfigUpdate,
    HostEndpoint,
    HostEndpointID,
    HostEndpointRemove,
    HostEndpointUpdate,
    InSync,
    IPIPTunnelRemove,
    IPIPTunnelUpdate,
    Policy,
    PolicyID,
    Profile,
    VXLANTunnelEndpointRemove,
    VXLANTunnelEndpointUpdate,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.shims.cmd import CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)

FILTER6 = "filter6"  # ip6tables' filter table, in the endpoints' chain bookkeeping

TABLES = (FILTER, MANGLE, RAW)


def policy_table(policy: Policy) -> str:
    """The table a policy's chains live in (doNotTrack: raw, preDNAT: mangle)."""
    if policy.untracked:
        return RAW
    if policy.pre_dnat:
        return MANGLE
    return FILTER


class IptablesManager(ManagerBase):
    name = "iptables"
    policy_critical = True

    def __init__(
        self,
        *,
        netns: str | None = None,
        interface_prefixes: tuple[str, ...] = ("cali",),
        endpoint_to_host_action: str = "Drop",
        backend: str = "auto",
        binaries: IptablesBinaries | None = None,
        marks: Marks | None = None,
        runner: CommandRunner | None = None,
        failsafes: Failsafes | None = None,
        vxlan_port: int = 4789,
        host_endpoints_only: bool = False,
        ipv6_policy: bool = True,
        allow_vxlan_from_workloads: bool = False,
        allow_ipip_from_workloads: bool = False,
        flow_logs: bool = False,
    ) -> None:
        super().__init__()
        # AllowVXLANPacketsFromWorkloads / AllowIPIPPacketsFromWorkloads (Felix's)
        self._allow_vxlan_from_workloads = allow_vxlan_from_workloads
        self._allow_ipip_from_workloads = allow_ipip_from_workloads
        # BPF mode: workloads are the tc programs' business (see the module docstring)
        self.host_endpoints_only = host_endpoints_only
        # Ipv6Support (iptables mode): False renders no IPv6 policy, only the drop chains
        self._ipv6_policy = ipv6_policy and not host_endpoints_only
        self._runner = runner or NetnsCommandRunner(netns)
        self._vxlan_port = vxlan_port
        self._vxlan_sources: dict[str, str] = {}  # node -> its VTEP's parent IP
        # node -> its IPv6 VTEP's parent IPv6 (vxlan-v6.calico)
        self._vxlan6_nodes: dict[str, str] = {}
        self._ipip_sources: dict[str, str] = {}  # node -> its host IP (IPIP tunnels)
        # both tunnel source sets (cali40all-vxlan-net, cali40all-hosts-net)
        self._vxlan_sets = FixedIPSets(self._runner,
                                       (IPSET_ALL_VXLAN, IPSET_ALL_HOSTS, IPSET_ALL_VXLAN6))
        self._vxlan_set_dirty = False
        self._vxlan_set_checked = False
        self._backend_mode = backend
        self._binaries = binaries
        self._renderer = RuleRenderer(
            marks=marks,
            interface_prefixes=interface_prefixes,
            endpoint_to_host_action=endpoint_to_host_action,
            flow_logs=flow_logs,
        )
        self._renderer6 = RuleRenderer(
            marks=marks,
            interface_prefixes=interface_prefixes,
            endpoint_to_host_action=endpoint_to_host_action,
            family=6,
            flow_logs=flow_logs,
        )
        self._hep_renderer = HostEndpointRenderer(self._renderer)
        self._failsafes = failsafes if failsafes is not None else default_failsafes()
        # what a ConfigUpdate without the setting falls back to (agent config at start)
        self._base_failsafes = self._failsafes
        self._base_action = endpoint_to_host_action
        self._tables: dict[str, IptablesTable] = {}
        self._table6: IptablesTable | None = None
        # BPF mode: sweep the IPv6 chains an iptables-mode agent left, once after InSync
        self._ipv6_sweep_pending = host_endpoints_only
        self._policies: dict[PolicyID, Policy] = {}
        self._policy_tables: dict[PolicyID, str] = {}
        self._profiles: dict[str, Profile] = {}
        self._endpoints: dict[WorkloadEndpointID, WorkloadEndpoint] = {}
        self._dirty_policies: set[PolicyID] = set()
        self._dirty_profiles: set[str] = set()
        self._dirty_endpoints: set[WorkloadEndpointID] = set()
        # (table, chain name) of each workload endpoint's chains: filter and raw
        self._endpoint_chains: dict[WorkloadEndpointID, tuple[tuple[str, str], ...]] = {}
        self._all_endpoints_dirty = False
        self._static_dirty = True
        # host endpoints
        self._host_endpoints: dict[HostEndpointID, HostEndpoint] = {}
        self._iface_addrs: dict[str, frozenset[str]] = {}
        self._hep_chains: dict[str, set[str]] = {t: set() for t in TABLES}
        self._heps_dirty = True
        self._ipvs = False
        self.active_host_endpoints: dict[str, HostEndpointID] = {}  # iface -> endpoint
        # host-endpoints-only mode: the policies/profiles host endpoints list (only those
        # are rendered), and the IP sets their rules use (None: to be recomputed)
        self._hep_policy_ids: frozenset[PolicyID] = frozenset()
        self._hep_profile_ids: frozenset[str] = frozenset()
        self._hep_ip_sets: frozenset[str] | None = frozenset()

    # --- tables ------------------------------------------------------------------------------

    def _binaries_for_tables(self) -> IptablesBinaries:
        if self._binaries is None:
            self._binaries = detect_backend(self._runner, self._backend_mode)
        return self._binaries

    def table_for(self, name: str) -> IptablesTable:
        """Created on first use: picking the backend runs commands in the namespace."""
        table = self._tables.get(name)
        if table is None:
            table = IptablesTable(self._runner, binaries=self._binaries_for_tables(),
                                  table=name)
            self._tables[name] = table
        return table

    @property
    def table(self) -> IptablesTable:
        """The filter table."""
        return self.table_for(FILTER)

    @property
    def table6(self) -> IptablesTable:
        """The IPv6 filter table (ip6tables of the IPv4 tables' backend), created on first
        use."""
        if self._table6 is None:
            self._table6 = IptablesTable(self._runner,
                                         binaries=self._binaries_for_tables().ipv6(),
                                         table=FILTER)
        return self._table6

    # --- on_update ---------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, (ActivePolicyUpdate, ActivePolicyRemove, ActiveProfileUpdate,
                            ActiveProfileRemove)):
            self._hep_ip_sets = None
        if isinstance(msg, ActivePolicyUpdate):
            if msg.id not in self._policies:
                self._all_endpoints_dirty = True
            self._policies[msg.id] = msg.policy
            self._dirty_policies.add(msg.id)
            self._heps_dirty = True
        elif isinstance(msg, ActivePolicyRemove):
            if self._policies.pop(msg.id, None) is not None:
                self._dirty_policies.add(msg.id)
                self._all_endpoints_dirty = True
                self._heps_dirty = True
        elif isinstance(msg, ActiveProfileUpdate):
            if msg.id not in self._profiles:
                self._all_endpoints_dirty = True
                self._heps_dirty = True
            self._profiles[msg.id] = msg.profile
            self._dirty_profiles.add(msg.id)
        elif isinstance(msg, ActiveProfileRemove):
            if self._profiles.pop(msg.id, None) is not None:
                self._dirty_profiles.add(msg.id)
                self._all_endpoints_dirty = True
                self._heps_dirty = True
        elif isinstance(msg, WorkloadEndpointUpdate | WorkloadEndpointRemove) \
                and self.host_endpoints_only:
            return  # the BPF programs police workloads
        elif isinstance(msg, WorkloadEndpointUpdate):
            if not valid_iface_name(msg.endpoint.name):
                log.error("workload endpoint %s: interface name %r is invalid; endpoint ignored",
                          msg.id, msg.endpoint.name)
                if self._endpoints.pop(msg.id, None) is not None:
                    self._dirty_endpoints.add(msg.id)
                return
            self._endpoints[msg.id] = msg.endpoint
            self._dirty_endpoints.add(msg.id)
        elif isinstance(msg, WorkloadEndpointRemove):
            if self._endpoints.pop(msg.id, None) is not None:
                self._dirty_endpoints.add(msg.id)
        elif isinstance(msg, HostEndpointUpdate):
            self._on_host_endpoint(msg)
        elif isinstance(msg, HostEndpointRemove):
            if self._host_endpoints.pop(msg.id, None) is not None:
                self._heps_dirty = True
                self._host_endpoint_references_changed()
        elif isinstance(msg, InterfaceAddrsUpdate):
            self._on_addrs(msg)
        elif isinstance(msg, InterfaceUpdate):
            if msg.name == KUBE_IPVS_INTERFACE:
                present = msg.state != IFACE_ABSENT
                if present != self._ipvs:
                    log.info("%s %s: IPVS rules %s", KUBE_IPVS_INTERFACE,
                             "appeared" if present else "went", "on" if present else "off")
                    self._ipvs = present
                    self._static_dirty = True
        elif isinstance(msg, VXLANTunnelEndpointUpdate | VXLANTunnelEndpointRemove):
            had_any = bool(self._vxlan_sources)
            # the IPv4 set holds IPv4 VTEPs' parents; a node with only an IPv6 VTEP
            # (vxlan-v6.calico) has none
            had_any6 = bool(self._vxlan6_nodes)
            if isinstance(msg, VXLANTunnelEndpointUpdate) and msg.parent_device_ip:
                self._vxlan_sources[msg.node] = msg.parent_device_ip
            else:
                self._vxlan_sources.pop(msg.node, None)
            if isinstance(msg, VXLANTunnelEndpointUpdate) and msg.parent_device_ipv6:
                self._vxlan6_nodes[msg.node] = msg.parent_device_ipv6
            else:
                self._vxlan6_nodes.pop(msg.node, None)
            self._vxlan_set_dirty = True
            if had_any != bool(self._vxlan_sources) or had_any6 != bool(self._vxlan6_nodes):
                self._static_dirty = True
            if had_any != bool(self._vxlan_sources) or had_any6 != bool(self._vxlan6_nodes):
                self._update_workload_tunnel_drops()
        elif isinstance(msg, IPIPTunnelUpdate | IPIPTunnelRemove):
            had_any = bool(self._ipip_sources)
            if isinstance(msg, IPIPTunnelUpdate):
                self._ipip_sources[msg.node] = msg.parent_device_ip
            else:
                self._ipip_sources.pop(msg.node, None)
            self._vxlan_set_dirty = True
            if had_any != bool(self._ipip_sources):
                self._static_dirty = True
                self._update_workload_tunnel_drops()
        elif isinstance(msg, ConfigUpdate):
            self._on_config(dict(msg.config))
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _update_workload_tunnel_drops(self) -> None:
        """While VXLAN / IPIP is in use, pods may not send it (unless allowed): every
        workload's from-chain gets the drops, so all endpoints are re-rendered."""
        drops = workload_tunnel_drops(
            self._vxlan_port if self._vxlan_sources and not self._allow_vxlan_from_workloads
            else None,
            bool(self._ipip_sources) and not self._allow_ipip_from_workloads)
        if drops != self._renderer.workload_tunnel_drops:
            self._renderer.workload_tunnel_drops = drops
            self._all_endpoints_dirty = True
        # IPv6: VXLAN over IPv6 while IPv6 VTEPs exist (there is no IPv6 IPIP)
        drops6 = workload_tunnel_drops(
            self._vxlan_port if self._vxlan6_nodes and not self._allow_vxlan_from_workloads
            else None, False)
        if drops6 != self._renderer6.workload_tunnel_drops:
            self._renderer6.workload_tunnel_drops = drops6
            self._all_endpoints_dirty = True

    def _on_host_endpoint(self, msg: HostEndpointUpdate) -> None:
        name = msg.endpoint.name
        if name and name != "*" and not valid_iface_name(name):
            log.error("host endpoint %s: interface name %r is invalid; endpoint ignored",
                      msg.id.endpoint, name)
            if self._host_endpoints.pop(msg.id, None) is not None:
                self._heps_dirty = True
            return
        self._host_endpoints[msg.id] = msg.endpoint
        self._heps_dirty = True
        self._host_endpoint_references_changed()

    def _host_endpoint_references_changed(self) -> None:
        """Host-endpoints-only mode: policies/profiles that became (un)referenced are dirty
        (rendered or removed at the next apply)."""
        if not self.host_endpoints_only:
            return
        endpoints = self._host_endpoints.values()
        policies = host_endpoint_policy_ids(endpoints)
        profiles = host_endpoint_profile_ids(endpoints)
        self._dirty_policies |= policies ^ self._hep_policy_ids
        self._dirty_profiles |= profiles ^ self._hep_profile_ids
        self._hep_policy_ids, self._hep_profile_ids = policies, profiles
        self._hep_ip_sets = None

    def _renders_policy(self, pid: PolicyID) -> bool:
        return not self.host_endpoints_only or pid in self._hep_policy_ids

    def _renders_profile(self, prof_id: str) -> bool:
        return not self.host_endpoints_only or prof_id in self._hep_profile_ids

    def referenced_ip_sets(self) -> frozenset[str]:
        """Host-endpoints-only mode: ids of the calc-graph IP sets the rendered rules match
        (the only sets `IPSetsManager(only=...)` programs). Pure: computed from on_update
        state, so the IP-sets manager may ask before this manager's apply()."""
        if self._hep_ip_sets is None:
            rules = [rule
                     for pid in self._hep_policy_ids if pid in self._policies
                     for rule in (*self._policies[pid].inbound_rules,
                                  *self._policies[pid].outbound_rules)]
            rules += [rule
                      for prof in self._hep_profile_ids if prof in self._profiles
                      for rule in (*self._profiles[prof].inbound_rules,
                                   *self._profiles[prof].outbound_rules)]
            self._hep_ip_sets = frozenset(set_id for rule in rules
                                          for set_id in rule.ip_set_ids())
        return self._hep_ip_sets

    def _on_addrs(self, msg: InterfaceAddrsUpdate) -> None:
        if msg.addrs is None:
            changed = self._iface_addrs.pop(msg.name, None) is not None
        else:
            ips = frozenset(str(ipaddress.ip_interface(a).ip) for a in msg.addrs
                            if _parses(a))
            changed = self._iface_addrs.get(msg.name) != ips
            self._iface_addrs[msg.name] = ips
        if changed and any(not hep.name for hep in self._host_endpoints.values()):
            self._heps_dirty = True

    def _on_config(self, raw: dict[str, str]) -> None:
        # FelixConfiguration spec keys are camelCase (defaultEndpointToHostAction); Felix
        # matches names case-insensitively.
        config = {k.lower(): v for k, v in raw.items()}
        action = config.get("defaultendpointtohostaction", self._base_action)
        if action.lower() != self._renderer.endpoint_to_host_action.lower():
            if action.lower() not in ENDPOINT_TO_HOST_ACTIONS:
                log.error("config DefaultEndpointToHostAction: %r is not Drop, Return or "
                          "Accept; keeping %s", action, self._renderer.endpoint_to_host_action)
            else:
                self._renderer.endpoint_to_host_action = action.capitalize()
                self._renderer6.endpoint_to_host_action = action.capitalize()
                self._static_dirty = True
        inbound, outbound = self._base_failsafes.inbound, self._base_failsafes.outbound
        for key in ("FailsafeInboundHostPorts", "FailsafeOutboundHostPorts"):
            value = config.get(key.lower())
            if value is None:
                continue
            try:
                ports = parse_failsafe_ports(value)
            except ValueError as exc:
                log.error("config %s: %s; keeping the previous value", key, exc)
                previous = self._failsafes
                ports = previous.inbound if key == "FailsafeInboundHostPorts" \
                    else previous.outbound
            if key == "FailsafeInboundHostPorts":
                inbound = ports
            else:
                outbound = ports
        failsafes = Failsafes(inbound, outbound)
        if failsafes != self._failsafes:
            self._failsafes = failsafes
            self._static_dirty = True

    # --- apply -------------------------------------------------------------------------------

    def request_resync(self) -> None:
        super().request_resync()
        self._vxlan_sets.request_resync()
        for table in self._all_tables():
            table.request_resync()

    def _table_named(self, name: str) -> IptablesTable:
        """A table by name, FILTER6 being ip6tables' filter table."""
        return self.table6 if name == FILTER6 else self.table_for(name)

    def _filter_tables(self) -> list[tuple[RuleRenderer, IptablesTable]]:
        """The filter tables normal policy and profiles are rendered into, with their
        renderers: IPv4, and in iptables mode IPv6."""
        tables = [(self._renderer, self.table)]
        if self._ipv6_policy:
            tables.append((self._renderer6, self.table6))
        return tables

    def _all_tables(self) -> list[IptablesTable]:
        return [*self._tables.values(), *([self._table6] if self._table6 else [])]

    def _render_dirty(self) -> None:
        if self._static_dirty:
            self._render_static()
        for pid in self._dirty_policies:
            self._render_policy(pid)
        self._dirty_policies.clear()
        for prof_id in self._dirty_profiles:
            profile = self._profiles.get(prof_id) if self._renders_profile(prof_id) else None
            for renderer, table in self._filter_tables():
                for chain in renderer.profile_chains(prof_id, profile or Profile()):
                    if profile is None:
                        table.remove_chain(chain.name)
                    else:
                        table.set_chain(chain)
        self._dirty_profiles.clear()
        dirty = set(self._endpoints) if self._all_endpoints_dirty else set()
        dirty |= self._dirty_endpoints
        if self._dirty_endpoints and not self.host_endpoints_only:
            self._set_dispatch()
        for ep_id in dirty:
            self._render_endpoint(ep_id)
        self._dirty_endpoints.clear()
        self._all_endpoints_dirty = False
        if self._heps_dirty:
            self._render_host_endpoints()

    def _render_static(self) -> None:
        filter_table = self.table
        workloads = not self.host_endpoints_only
        if workloads:
            self._set_dispatch()  # cali-FORWARD jumps to the dispatch chains: always present
        vxlan_port = self._vxlan_port if self._vxlan_sources else None
        for chain in self._renderer.static_chains(ipvs=self._ipvs and workloads,
                                                  vxlan_port=vxlan_port,
                                                  ipip=bool(self._ipip_sources),
                                                  workload_policy=workloads):
            filter_table.set_chain(chain)
        for base, rules in self._renderer.base_chain_inserts().items():
            filter_table.set_base_inserts(base, rules)
        if workloads:
            table6 = self.table6
            vxlan_port6 = self._vxlan_port if self._vxlan6_nodes else None
            static6 = (ipv6_workload_static_chains(self._renderer6, vxlan_port=vxlan_port6)
                       if self._ipv6_policy
                       else ipv6_disabled_static_chains(self._renderer6.interface_prefixes))
            for chain in static6:
                table6.set_chain(chain)
            for base, rules in ipv6_base_chain_inserts().items():
                table6.set_base_inserts(base, rules)
        for name in TABLES:
            table = self.table_for(name)
            for chain in self._hep_renderer.failsafe_chains(self._failsafes, name):
                table.set_chain(chain)
            if name != FILTER:
                for chain in self._hep_renderer.static_chains(
                        name, source_check=workloads and name == RAW):
                    table.set_chain(chain)
                for base, rules in self._hep_renderer.base_chain_inserts(name).items():
                    table.set_base_inserts(base, rules)
        self._heps_dirty = True  # dispatch chains are referenced by the static ones
        self._static_dirty = False

    def _render_policy(self, pid: PolicyID) -> None:
        policy = self._policies.get(pid) if self._renders_policy(pid) else None
        old_table = self._policy_tables.pop(pid, None)
        if old_table is not None and (policy is None or policy_table(policy) != old_table):
            for chain in self._renderer.policy_chains(pid, Policy()):
                self.table_for(old_table).remove_chain(chain.name)
                if old_table == FILTER and self._ipv6_policy:
                    self.table6.remove_chain(chain.name)
        if policy is None:
            return
        name = policy_table(policy)
        for chain in self._renderer.policy_chains(pid, policy):
            self.table_for(name).set_chain(chain)
        if name == FILTER and self._ipv6_policy:
            for chain in self._renderer6.policy_chains(pid, policy):
                self.table6.set_chain(chain)
        self._policy_tables[pid] = name

    def _set_dispatch(self) -> None:
        ifaces = {ep.name for ep in self._endpoints.values()}
        if len(ifaces) != len(self._endpoints):
            log.error("two workload endpoints share an interface name; one wins")
        for chain in self._renderer.dispatch_chains(ifaces):
            self.table.set_chain(chain)
        if self._ipv6_policy:
            for chain in self._renderer6.dispatch_chains(ifaces):
                self.table6.set_chain(chain)
        self.table_for(RAW).set_chain(self._renderer.source_dispatch_chain(ifaces))

    def _render_endpoint(self, ep_id: WorkloadEndpointID) -> None:
        for table, name in self._endpoint_chains.pop(ep_id, ()):
            self._table_named(table).remove_chain(name)
        endpoint = self._endpoints.get(ep_id)
        if endpoint is None:
            return
        known = {"policy_known": lambda pid: self._policy_tables.get(pid) == FILTER,
                 "profile_known": lambda prof: prof in self._profiles}
        chains = [(FILTER, chain) for chain in self._renderer.endpoint_chains(endpoint, **known)]
        chains.append((RAW, self._renderer.source_check_chain(endpoint)))
        if self._ipv6_policy:
            chains += [(FILTER6, chain)
                       for chain in self._renderer6.endpoint_chains(endpoint, **known)]
        for table, chain in chains:
            self._table_named(table).set_chain(chain)
        self._endpoint_chains[ep_id] = tuple((table, c.name) for table, c in chains)

    # --- host endpoints ----------------------------------------------------------------------

    def _resolve_host_endpoints(self) -> dict[str, HostEndpointID]:
        return resolve_host_endpoints(self._host_endpoints, self._iface_addrs,
                                      self._renderer.interface_prefixes)

    def _render_host_endpoints(self) -> None:
        resolved = self._resolve_host_endpoints()
        self.active_host_endpoints = resolved

        def known(pid: PolicyID, table: str) -> bool:
            return self._policy_tables.get(pid) == table

        for name in TABLES:
            table = self.table_for(name)
            wanted: list[Chain] = []
            names_by_iface: dict[str, list[str]] = {}
            for iface, hep_id in resolved.items():
                chains = self._hep_renderer.endpoint_chains(
                    iface, self._host_endpoints[hep_id], name, policy_known=known,
                    profile_known=lambda prof: prof in self._profiles)
                wanted += chains
                names_by_iface[iface] = [c.name for c in chains]
            for chain_name in self._hep_chains[name] - {c.name for c in wanted}:
                table.remove_chain(chain_name)
            for chain in wanted:
                table.set_chain(chain)
            self._hep_chains[name] = {c.name for c in wanted}
            for chain in self._hep_renderer.dispatch_chains(name, names_by_iface):
                table.set_chain(chain)
        self._heps_dirty = False

    def apply(self) -> None:
        self._render_dirty()
        if self._resync_requested:
            for table in self._all_tables():
                table.request_resync()
            self._vxlan_sets.request_resync()
            self._vxlan_set_checked = False
            self._resync_requested = False
        if self._vxlan_set_dirty:
            # the IPv6 set only where ip6tables rules use it (iptables mode, IPv6 policy)
            sources6 = self._vxlan6_nodes if self._ipv6_policy else {}
            for name, sources in ((IPSET_ALL_VXLAN, self._vxlan_sources),
                                  (IPSET_ALL_HOSTS, self._ipip_sources),
                                  (IPSET_ALL_VXLAN6, sources6)):
                if sources:
                    self._vxlan_sets.set_members(name, sources.values())
                else:
                    self._vxlan_sets.remove(name)
            self._vxlan_set_dirty = False
        if self._vxlan_sources or self._ipip_sources or self._vxlan6_nodes:
            self._vxlan_sets.apply()  # before the rules that match them
        # One restore; raw and mangle first: the filter table's cali-INPUT/-OUTPUT trust the
        # ACCEPT mark their policies set. Then IPv6 (its own restore), even when IPv4 failed.
        errors: list[IptablesError] = []
        try:
            apply_tables([self.table_for(name) for name in (RAW, MANGLE, FILTER)],
                         allow_deletes=self._datastore_in_sync)
        except IptablesError as exc:
            errors.append(exc)
        try:
            self._apply_ipv6()
        except IptablesError as exc:
            errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise IptablesError(f"IPv4: {errors[0]}; {errors[1]}") from errors[0]

    def _apply_ipv6(self) -> None:
        if self.host_endpoints_only:
            if self._ipv6_sweep_pending and self._datastore_in_sync:
                self._ipv6_sweep_pending = False
                try:  # a table with nothing desired: removes whatever of ours is there
                    apply_tables([self.table6], allow_deletes=True)
                except IptablesError as exc:
                    log.warning("BPF mode: could not check for IPv6 chains an iptables-mode "
                                "agent left (%s); if there are any, they still drop workload "
                                "IPv6", exc)
            return
        table6 = self.table6
        try:
            apply_tables([table6], allow_deletes=self._datastore_in_sync)
        except IptablesError as exc:
            raise IptablesError(
                f"IPv6: the rules that keep workload IPv6 closed are not programmed "
                f"({table6.binaries.restore} must be installed and IPv6 enabled in the "
                f"kernel): {exc}") from exc

    def finish_apply(self) -> None:
        if self._datastore_in_sync and not (self._vxlan_sources and self._ipip_sources
                                            and self._vxlan6_nodes and self._ipv6_policy):
            # The rules using the set are gone by now. The first time, read the kernel
            # (`apply` resyncs) so a set left by an earlier run is swept too.
            if not self._vxlan_set_checked:
                self._vxlan_sets.apply()
                self._vxlan_set_checked = True
            self._vxlan_sets.apply_deletions()

    @property
    def ipvs_enabled(self) -> bool:
        return self._ipvs


def _parses(address: str) -> bool:
    try:
        ipaddress.ip_interface(address)
    except ValueError:
        return False
    return True

"""The calculation graph: one wiring function, `build_calc_graph(hostname, callbacks)`.

Role (Felix's `NewCalculationGraph`): connect the nodes of `agent.calc` so that validated
datastore updates (`on_updates`) and sync status (`on_status`) become calls on `callbacks`
(normally the `EventSequencer`, which orders and sends `proto` messages). Single-threaded,
no I/O: the caller (`CalcPipeline`) owns the thread and calls `flush()` after each batch.

`callbacks` must implement the sinks of the nodes: `on_ip_set_added/removed`,
`on_ip_set_member_added/removed`, `on_policy_update/remove`, `on_profile_update/remove`,
`on_endpoint_tiers`, `on_route_update`, `on_ip_pool_update`, `on_host_ip_update`,
`on_vtep_update`, `on_ipip_tunnel_update`, `on_service_frontend_update`, `on_config_update`,
`on_datastore_in_sync`.

The returned `CalcGraph` keeps every node as an attribute for debug dumps and tests.

Easy to get wrong: registration order is significant where one node's output feeds
another's input during the same update (the ProfileDecoder must see a Profile before the
ActiveRulesCalculator re-sends it, so inherited labels are current when rules are scanned).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.calc.active_rules import ActiveRulesCalculator
from pyfelix.agent.calc.dispatcher import Dispatcher, LocalEndpointFilter, UpdateNormaliser
from pyfelix.agent.calc.ipip_resolver import IPIPResolver
from pyfelix.agent.calc.ipset_index import IPSetMemberIndex
from pyfelix.agent.calc.passthru import ConfigBatcher, HostIPPassthru, IPPoolPassthru
from pyfelix.agent.calc.policy_resolver import PolicyResolver
from pyfelix.agent.calc.profile_decoder import ProfileDecoder
from pyfelix.agent.calc.route_resolver import RouteResolver
from pyfelix.agent.calc.rule_scanner import RuleScanner
from pyfelix.agent.calc.services import ServiceIndex
from pyfelix.agent.calc.vxlan_resolver import VXLANResolver
from pyfelix.agent.syncer.api import SyncStatus


@dataclass
class CalcGraph:
    hostname: str
    normaliser: UpdateNormaliser
    all_updates: Dispatcher
    local_endpoints: Dispatcher
    local_filter: LocalEndpointFilter
    profile_decoder: ProfileDecoder
    active_rules: ActiveRulesCalculator
    rule_scanner: RuleScanner
    ipset_index: IPSetMemberIndex
    policy_resolver: PolicyResolver
    route_resolver: RouteResolver
    vxlan_resolver: VXLANResolver
    ipip_resolver: IPIPResolver
    config_batcher: ConfigBatcher
    host_ips: HostIPPassthru
    ip_pools: IPPoolPassthru
    services: ServiceIndex
    callbacks: Any
    updates_processed: int = 0
    update_seconds: float = 0.0
    status: SyncStatus = SyncStatus.WAIT_FOR_DATASTORE

    def on_updates(self, updates: Iterable[Any]) -> None:
        """Feed validated updates (`.key`, `.value`; None = delete)."""
        started = time.perf_counter()
        normalised = self.normaliser.normalise(updates)
        dispatch = self.all_updates.on_update
        for update in normalised:
            dispatch(update)
        self.updates_processed += len(normalised)
        self.update_seconds += time.perf_counter() - started

    def on_status(self, status: SyncStatus) -> None:
        self.status = status
        self.all_updates.on_status(status)

    def flush(self) -> None:
        """Push the batched node outputs (endpoint tiers, routes) into `callbacks`."""
        started = time.perf_counter()
        self.policy_resolver.flush()
        self.route_resolver.flush()
        self.vxlan_resolver.flush()
        self.ipip_resolver.flush()
        self.update_seconds += time.perf_counter() - started

    def dump(self) -> dict[str, Any]:
        """A debug view of the nodes' state (sorted, JSON-friendly)."""
        return {
            "hostname": self.hostname,
            "status": self.status.value,
            "local_endpoints": sorted(str(k) for k in self.local_filter.local_keys()),
            "active_policies": [str(k) for k in self.active_rules.active_policies()],
            "active_profiles": self.active_rules.active_profiles(),
            "ip_sets": {i: sorted(self.ipset_index.members(i))
                        for i in self.ipset_index.active_ids()},
            "namespaces": self.profile_decoder.namespaces(),
            "host_ips": self.host_ips.host_ips(),
            "config": self.config_batcher.effective(),
            "routes": {dst: r.type for dst, r in self.route_resolver.routes().items()},
            "vteps": {n: v.ipv4_addr for n, v in self.vxlan_resolver.vteps().items()},
            "vteps_v6": {n: v.ipv6_addr for n, v in self.vxlan_resolver.vteps().items()
                         if v.ipv6_addr},
            "ipip_tunnels": {n: t.ipv4_addr for n, t in self.ipip_resolver.tunnels().items()},
            "service_frontends": {i: [f"{b.addr}:{b.port}" for b in f.backends]
                                  for i, f in self.services.frontends().items()},
        }


def build_calc_graph(hostname: str, callbacks: Any, *, naive_ipsets: bool = False) -> CalcGraph:
    """Wire the calc graph for `hostname`, sending its outputs to `callbacks`."""
    normaliser = UpdateNormaliser()

    #  validated updates ──> UpdateNormaliser ──> all_updates (Dispatcher, by kind)
    #  (datastore keys)      (resource keys, kinds)
    all_updates = Dispatcher()

    #  all_updates ──(WorkloadEndpoint, HostEndpoint)──> LocalEndpointFilter ──> local_endpoints
    #                                                    (node == hostname)      (Dispatcher)
    local_endpoints = Dispatcher()
    local_filter = LocalEndpointFilter(hostname, local_endpoints)
    local_filter.register_with(all_updates)

    #  RuleScanner ──on_ip_set_active/inactive──> IPSetMemberIndex ──members──> callbacks
    #                                                   ^
    #  all_updates ──(endpoints of ALL nodes, NetworkSet, GlobalNetworkSet)─┘
    ipset_index = IPSetMemberIndex(callbacks, naive=naive_ipsets)
    ipset_index.register_with(all_updates)

    #  ActiveRulesCalculator ──policy/profile active──> RuleScanner ──rules──> callbacks
    #                                                        └──IP sets──> IPSetMemberIndex
    rule_scanner = RuleScanner(ipset_index, callbacks)

    #  all_updates ──(Tier, policies)──────┐
    #  local_endpoints ──(endpoints)───────┼──> PolicyResolver ──flush──> callbacks
    #  ActiveRulesCalculator ──matches─────┘                   (on_endpoint_tiers)
    policy_resolver = PolicyResolver(callbacks)

    #  all_updates ──(policies, Profile)─────┐
    #  local_endpoints ──(endpoints)─────────┼──> ActiveRulesCalculator ──> RuleScanner
    #  ProfileDecoder ──(profile labels)─────┘                          └─> PolicyResolver
    active_rules = ActiveRulesCalculator(rule_scanner, policy_resolver)

    #  all_updates ──(Profile)──> ProfileDecoder ──profile labels──> ActiveRulesCalculator
    #                                                          └──> IPSetMemberIndex
    profile_decoder = ProfileDecoder([active_rules, ipset_index])
    profile_decoder.register_with(all_updates)  # before active_rules: labels first

    active_rules.register_with(all_updates, local_endpoints)
    policy_resolver.register_with(all_updates, local_endpoints)

    #  all_updates ──(WorkloadEndpoint, Node, BlockAffinity, IPPool)──> RouteResolver
    #                                                   ──flush──> callbacks (on_route_update)
    route_resolver = RouteResolver(hostname, callbacks)
    route_resolver.register_with(all_updates)

    #  all_updates ──(Node, IPPool)──> VXLANResolver ──flush──> callbacks (on_vtep_update)
    #  (a VTEP per node while a VXLAN pool exists: address, MAC, parent device IP)
    vxlan_resolver = VXLANResolver(callbacks)
    vxlan_resolver.register_with(all_updates)

    #  all_updates ──(Node, IPPool)──> IPIPResolver ──flush──> callbacks (on_ipip_tunnel_update)
    #  (a tunnel per node while an IPIP pool exists: tunl0 address, parent IP)
    ipip_resolver = IPIPResolver(callbacks)
    ipip_resolver.register_with(all_updates)

    #  all_updates ──(FelixConfiguration default + node.<hostname>, status)──> ConfigBatcher
    #                                                     ──> callbacks (on_config_update)
    config_batcher = ConfigBatcher(hostname, callbacks)
    config_batcher.register_with(all_updates)

    #  all_updates ──(Node)──> HostIPPassthru ──> callbacks (on_host_ip_update)
    host_ips = HostIPPassthru(callbacks)
    host_ips.register_with(all_updates)

    #  all_updates ──(IPPool)──> IPPoolPassthru ──> callbacks (on_ip_pool_update)
    ip_pools = IPPoolPassthru(callbacks)
    ip_pools.register_with(all_updates)

    #  all_updates ──(Service, EndpointSlice)──> ServiceIndex ──> callbacks
    #  (on_service_frontend_update: VIP:port/proto -> this node's backends)
    services = ServiceIndex(hostname, callbacks)
    services.register_with(all_updates)

    #  all_updates ──(status IN_SYNC)──> callbacks.on_datastore_in_sync
    #  (registered last: every other status handler has run first)
    def on_status(status: SyncStatus) -> None:
        if status is SyncStatus.IN_SYNC:
            callbacks.on_datastore_in_sync()

    all_updates.register_status(on_status)

    return CalcGraph(
        hostname=hostname, normaliser=normaliser, all_updates=all_updates,
        local_endpoints=local_endpoints, local_filter=local_filter,
        profile_decoder=profile_decoder, active_rules=active_rules,
        rule_scanner=rule_scanner, ipset_index=ipset_index, policy_resolver=policy_resolver,
        route_resolver=route_resolver, vxlan_resolver=vxlan_resolver,
        ipip_resolver=ipip_resolver,
        config_batcher=config_batcher, host_ips=host_ips,
        ip_pools=ip_pools, services=services, callbacks=callbacks,
    )

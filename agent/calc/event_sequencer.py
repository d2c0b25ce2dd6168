"""EventSequencer: buffers the graph's outputs, coalesces them, and flushes them in an order
the dataplane can apply one message at a time without ever seeing a dangling reference.

Role (Felix's EventSequencer). Inputs: the sink callbacks of the graph's nodes (IP sets and
members, policies, profiles, endpoint tiers, routes, VXLAN tunnel endpoints, IP pools, host
IPs, service frontends, config, datastore in-sync). Output: `proto` messages passed to
`send(message)` on `flush()`.

Coalescing: within a batch only the last state of a thing counts. An IP set created in the
batch is sent whole (`IPSetUpdate` with its members); a set the dataplane already has gets
one `IPSetDeltaUpdate` (members added then removed in the batch cancel out); a set removed
and re-created in the batch is re-sent whole (an `IPSetUpdate` replaces). An update equal
to the last one sent is dropped; a remove of something never sent is dropped.

The flush order is the contract with the dataplane (`proto` module docstring): see
`flush()`. Adds and updates go in dependency order (IP sets -> policies/profiles ->
endpoints); removes go in the reverse order, so nothing is removed while still referenced
and nothing is referenced before it exists. `InSync` goes last, once, in the first flush
after `on_datastore_in_sync()`.

Invariants: messages leave only from `flush()`; after a flush nothing is pending; the
sequencer's idea of what the dataplane has (`sent_*`) matches the messages it sent.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.calc.endpoints import host_message, workload_message
from pyfelix.agent.calc.policy_resolver import EndpointTiers
from pyfelix.agent.model import HostEndpoint, WorkloadEndpoint
from pyfelix.agent.syncer.api import ResourceKey

log = logging.getLogger(__name__)

Send = Callable[[Any], None]
EndpointUpdate = proto.WorkloadEndpointUpdate | proto.HostEndpointUpdate
EndpointRemove = proto.WorkloadEndpointRemove | proto.HostEndpointRemove


def sender_for(target: Any) -> Send:
    """`target.send` if it has one, `target.append` for a list, else `target` itself."""
    if hasattr(target, "send"):
        return target.send
    if isinstance(target, list):
        return target.append
    if callable(target):
        return target
    raise TypeError(f"cannot send messages to {target!r}")


class EventSequencer:
    def __init__(self, target: Any) -> None:
        self._send = sender_for(target)
        # IP sets
        self._sent_ip_sets: dict[str, str] = {}
        self._pending_ip_set_adds: dict[str, tuple[str, set[str]]] = {}
        self._pending_members_added: dict[str, set[str]] = {}
        self._pending_members_removed: dict[str, set[str]] = {}
        self._pending_ip_set_removes: set[str] = set()
        # policies and profiles
        self._sent_policies: dict[proto.PolicyID, proto.Policy] = {}
        self._pending_policies: dict[proto.PolicyID, proto.Policy] = {}
        self._pending_policy_removes: set[proto.PolicyID] = set()
        self._sent_profiles: dict[str, proto.Profile] = {}
        self._pending_profiles: dict[str, proto.Profile] = {}
        self._pending_profile_removes: set[str] = set()
        # endpoints, by resource key
        self._sent_endpoints: dict[ResourceKey, EndpointUpdate] = {}
        self._pending_endpoints: dict[ResourceKey, EndpointUpdate] = {}
        self._pending_endpoint_removes: dict[ResourceKey, EndpointRemove] = {}
        # passthru
        self._pending_routes: dict[str, proto.RouteUpdate | None] = {}
        self._sent_routes: dict[str, proto.RouteUpdate] = {}
        self._pending_pools: dict[str, proto.IPAMPoolUpdate | None] = {}
        self._sent_pools: dict[str, proto.IPAMPoolUpdate] = {}
        self._pending_hosts: dict[str, str | None] = {}
        self._sent_hosts: dict[str, str] = {}
        self._pending_vteps: dict[str, proto.VXLANTunnelEndpointUpdate | None] = {}
        self._sent_vteps: dict[str, proto.VXLANTunnelEndpointUpdate] = {}
        self._pending_ipip: dict[str, proto.IPIPTunnelUpdate | None] = {}
        self._sent_ipip: dict[str, proto.IPIPTunnelUpdate] = {}
        self._pending_services: dict[str, proto.ServiceFrontendUpdate | None] = {}
        self._sent_services: dict[str, proto.ServiceFrontendUpdate] = {}
        self._pending_config: dict[str, str] | None = None
        self._pending_ready: bool | None = None
        # in-sync
        self._datastore_in_sync = False
        self.in_sync_sent = False
        self.messages_sent = 0

    # --- inputs: IP sets ----------------------------------------------------------------

    def on_ip_set_added(self, ip_set_id: str, ip_set_type: str) -> None:
        self._pending_ip_set_removes.discard(ip_set_id)
        self._pending_members_added.pop(ip_set_id, None)
        self._pending_members_removed.pop(ip_set_id, None)
        self._pending_ip_set_adds[ip_set_id] = (ip_set_type, set())

    def on_ip_set_removed(self, ip_set_id: str) -> None:
        self._pending_ip_set_adds.pop(ip_set_id, None)
        self._pending_members_added.pop(ip_set_id, None)
        self._pending_members_removed.pop(ip_set_id, None)
        if ip_set_id in self._sent_ip_sets:
            self._pending_ip_set_removes.add(ip_set_id)

    def on_ip_set_member_added(self, ip_set_id: str, member: str) -> None:
        added = self._pending_ip_set_adds.get(ip_set_id)
        if added is not None:
            added[1].add(member)
            return
        removed = self._pending_members_removed.get(ip_set_id)
        if removed is not None and member in removed:
            removed.discard(member)
        else:
            self._pending_members_added.setdefault(ip_set_id, set()).add(member)

    def on_ip_set_member_removed(self, ip_set_id: str, member: str) -> None:
        added = self._pending_ip_set_adds.get(ip_set_id)
        if added is not None:
            added[1].discard(member)
            return
        pending = self._pending_members_added.get(ip_set_id)
        if pending is not None and member in pending:
            pending.discard(member)
        else:
            self._pending_members_removed.setdefault(ip_set_id, set()).add(member)

    # --- inputs: policies and profiles --------------------------------------------------

    def on_policy_update(self, policy_id: proto.PolicyID, policy: proto.Policy) -> None:
        self._pending_policy_removes.discard(policy_id)
        if self._sent_policies.get(policy_id) == policy:
            self._pending_policies.pop(policy_id, None)
        else:
            self._pending_policies[policy_id] = policy

    def on_policy_remove(self, policy_id: proto.PolicyID) -> None:
        self._pending_policies.pop(policy_id, None)
        if policy_id in self._sent_policies:
            self._pending_policy_removes.add(policy_id)

    def on_profile_update(self, name: str, profile: proto.Profile) -> None:
        self._pending_profile_removes.discard(name)
        if self._sent_profiles.get(name) == profile:
            self._pending_profiles.pop(name, None)
        else:
            self._pending_profiles[name] = profile

    def on_profile_remove(self, name: str) -> None:
        self._pending_profiles.pop(name, None)
        if name in self._sent_profiles:
            self._pending_profile_removes.add(name)

    # --- inputs: endpoints --------------------------------------------------------------

    def on_endpoint_tiers(self, key: ResourceKey, endpoint: Any, tiers: EndpointTiers) -> None:
        sent = self._sent_endpoints.get(key)
        if endpoint is None:
            self._pending_endpoints.pop(key, None)
            if sent is not None:
                self._pending_endpoint_removes[key] = _remove_for(sent)
            return
        if isinstance(endpoint, WorkloadEndpoint):
            message: EndpointUpdate = workload_message(endpoint, tiers)
        elif isinstance(endpoint, HostEndpoint):
            message = host_message(endpoint, tiers)
        else:
            raise TypeError(f"not an endpoint: {type(endpoint).__name__}")
        if sent is not None and type(sent) is type(message) and sent.id == message.id:
            self._pending_endpoint_removes.pop(key, None)
        elif sent is not None:
            self._pending_endpoint_removes[key] = _remove_for(sent)
        if sent == message:
            self._pending_endpoints.pop(key, None)
        else:
            self._pending_endpoints[key] = message

    # --- inputs: passthru ---------------------------------------------------------------

    def on_route_update(self, dst: str, route: proto.RouteUpdate | None) -> None:
        self._pending_routes[dst] = route

    def on_ip_pool_update(self, pool_id: str, pool: proto.IPAMPoolUpdate | None) -> None:
        self._pending_pools[pool_id] = pool

    def on_host_ip_update(self, hostname: str, ipv4: str | None) -> None:
        self._pending_hosts[hostname] = ipv4

    def on_vtep_update(self, node: str, vtep: proto.VXLANTunnelEndpointUpdate | None) -> None:
        self._pending_vteps[node] = vtep

    def on_ipip_tunnel_update(self, node: str, tunnel: proto.IPIPTunnelUpdate | None) -> None:
        self._pending_ipip[node] = tunnel

    def on_service_frontend_update(self, frontend_id: str,
                                   frontend: proto.ServiceFrontendUpdate | None) -> None:
        self._pending_services[frontend_id] = frontend

    def on_config_update(self, settings: dict[str, str]) -> None:
        self._pending_config = dict(settings)

    def on_datastore_ready(self, ready: bool) -> None:
        self._pending_ready = ready

    def on_datastore_in_sync(self) -> None:
        self._datastore_in_sync = True

    # --- output -------------------------------------------------------------------------

    def flush(self) -> int:
        """Send everything pending, in the contract's order; returns the message count."""
        before = self.messages_sent
        # Config first: a change may mean the agent must restart before applying anything.
        self._flush_config()
        # Adds and updates, in dependency order: what is referenced before what refers.
        self._flush_ip_pool_updates()
        self._flush_host_metadata_updates()
        self._flush_ip_set_adds()          # whole sets (new, or re-created in this batch)
        self._flush_ip_set_deltas()        # member changes of sets the dataplane has
        self._flush_policy_updates()       # may reference the IP sets above
        self._flush_profile_updates()      # idem
        self._flush_endpoint_updates()     # reference the policies and profiles above
        # Removes, in reverse dependency order: referrers are gone or updated first.
        self._flush_endpoint_removes()
        self._flush_profile_removes()
        self._flush_policy_removes()
        self._flush_ip_set_removes()       # no policy/profile references them any more
        # Routes (withdrawn before new ones go in), with the VTEPs they go through: new
        # VTEPs before the routes using them, gone VTEPs after the routes that used them;
        # IPIP tunnels likewise.
        self._flush_vtep_updates()
        self._flush_ipip_updates()
        self._flush_route_removes()
        self._flush_route_updates()
        self._flush_ipip_removes()
        self._flush_vtep_removes()
        self._flush_host_metadata_removes()
        self._flush_ip_pool_removes()
        # Service frontends reference nothing the dataplane holds (backends are addresses).
        self._flush_service_updates()
        # Last: the first complete flush after the datastore was in sync.
        self._flush_in_sync()
        return self.messages_sent - before

    def pending(self) -> bool:
        return bool(
            self._pending_ip_set_adds or self._pending_members_added
            or self._pending_members_removed or self._pending_ip_set_removes
            or self._pending_policies or self._pending_policy_removes
            or self._pending_profiles or self._pending_profile_removes
            or self._pending_endpoints or self._pending_endpoint_removes
            or self._pending_routes or self._pending_pools or self._pending_hosts
            or self._pending_vteps or self._pending_ipip or self._pending_services
            or self._pending_config is not None or self._pending_ready is not None
            or (self._datastore_in_sync and not self.in_sync_sent))

    def _emit(self, message: Any) -> None:
        self.messages_sent += 1
        self._send(message)

    def _flush_config(self) -> None:
        if self._pending_config is not None:
            self._emit(proto.ConfigUpdate(config=tuple(sorted(self._pending_config.items()))))
            self._pending_config = None
        if self._pending_ready is not None:
            # before anything else of this batch: a pause must hold it back too
            self._emit(proto.DatastoreReady(ready=self._pending_ready))
            self._pending_ready = None

    def _flush_ip_pool_updates(self) -> None:
        for pool_id in sorted(self._pending_pools):
            pool = self._pending_pools[pool_id]
            if pool is not None and self._sent_pools.get(pool_id) != pool:
                self._sent_pools[pool_id] = pool
                self._emit(pool)

    def _flush_ip_pool_removes(self) -> None:
        for pool_id in sorted(self._pending_pools):
            if self._pending_pools[pool_id] is None and self._sent_pools.pop(pool_id, None):
                self._emit(proto.IPAMPoolRemove(id=pool_id))
        self._pending_pools.clear()

    def _flush_host_metadata_updates(self) -> None:
        for hostname in sorted(self._pending_hosts):
            address = self._pending_hosts[hostname]
            if address is not None and self._sent_hosts.get(hostname) != address:
                self._sent_hosts[hostname] = address
                self._emit(proto.HostMetadataUpdate(hostname=hostname, ipv4_addr=address))

    def _flush_host_metadata_removes(self) -> None:
        for hostname in sorted(self._pending_hosts):
            if self._pending_hosts[hostname] is None and self._sent_hosts.pop(hostname, None):
                self._emit(proto.HostMetadataRemove(hostname=hostname))
        self._pending_hosts.clear()

    def _flush_ip_set_adds(self) -> None:
        for set_id in sorted(self._pending_ip_set_adds):
            set_type, members = self._pending_ip_set_adds[set_id]
            self._sent_ip_sets[set_id] = set_type
            self._emit(proto.IPSetUpdate(id=set_id, type=set_type, members=frozenset(members)))
        self._pending_ip_set_adds.clear()

    def _flush_ip_set_deltas(self) -> None:
        for set_id in sorted(self._pending_members_added.keys()
                             | self._pending_members_removed.keys()):
            added = self._pending_members_added.get(set_id, set())
            removed = self._pending_members_removed.get(set_id, set())
            if added or removed:
                self._emit(proto.IPSetDeltaUpdate(id=set_id, added=frozenset(added),
                                                  removed=frozenset(removed)))
        self._pending_members_added.clear()
        self._pending_members_removed.clear()

    def _flush_ip_set_removes(self) -> None:
        for set_id in sorted(self._pending_ip_set_removes):
            del self._sent_ip_sets[set_id]
            self._emit(proto.IPSetRemove(id=set_id))
        self._pending_ip_set_removes.clear()

    def _flush_policy_updates(self) -> None:
        for policy_id in sorted(self._pending_policies):
            policy = self._pending_policies[policy_id]
            self._sent_policies[policy_id] = policy
            self._emit(proto.ActivePolicyUpdate(id=policy_id, policy=policy))
        self._pending_policies.clear()

    def _flush_policy_removes(self) -> None:
        for policy_id in sorted(self._pending_policy_removes):
            del self._sent_policies[policy_id]
            self._emit(proto.ActivePolicyRemove(id=policy_id))
        self._pending_policy_removes.clear()

    def _flush_profile_updates(self) -> None:
        for name in sorted(self._pending_profiles):
            profile = self._pending_profiles[name]
            self._sent_profiles[name] = profile
            self._emit(proto.ActiveProfileUpdate(id=name, profile=profile))
        self._pending_profiles.clear()

    def _flush_profile_removes(self) -> None:
        for name in sorted(self._pending_profile_removes):
            del self._sent_profiles[name]
            self._emit(proto.ActiveProfileRemove(id=name))
        self._pending_profile_removes.clear()

    def _flush_endpoint_updates(self) -> None:
        for key in sorted(self._pending_endpoints):
            message = self._pending_endpoints[key]
            self._sent_endpoints[key] = message
            self._emit(message)
        self._pending_endpoints.clear()

    def _flush_endpoint_removes(self) -> None:
        live = Counter(m.id for m in self._sent_endpoints.values())
        for key in sorted(self._pending_endpoint_removes):
            remove = self._pending_endpoint_removes[key]
            sent = self._sent_endpoints.get(key)
            if sent is not None and sent.id == remove.id:
                del self._sent_endpoints[key]
                live[remove.id] -= 1
            if live[remove.id] <= 0:  # another key may have taken over the same id
                self._emit(remove)
        self._pending_endpoint_removes.clear()

    def _flush_route_removes(self) -> None:
        for dst in sorted(self._pending_routes):
            if self._pending_routes[dst] is None and self._sent_routes.pop(dst, None):
                self._emit(proto.RouteRemove(dst=dst))

    def _flush_route_updates(self) -> None:
        for dst in sorted(self._pending_routes):
            route = self._pending_routes[dst]
            if route is not None and self._sent_routes.get(dst) != route:
                self._sent_routes[dst] = route
                self._emit(route)
        self._pending_routes.clear()

    def _flush_vtep_updates(self) -> None:
        for node in sorted(self._pending_vteps):
            vtep = self._pending_vteps[node]
            if vtep is not None and self._sent_vteps.get(node) != vtep:
                self._sent_vteps[node] = vtep
                self._emit(vtep)

    def _flush_ipip_updates(self) -> None:
        for node in sorted(self._pending_ipip):
            tunnel = self._pending_ipip[node]
            if tunnel is not None and self._sent_ipip.get(node) != tunnel:
                self._sent_ipip[node] = tunnel
                self._emit(tunnel)

    def _flush_ipip_removes(self) -> None:
        for node in sorted(self._pending_ipip):
            if self._pending_ipip[node] is None and self._sent_ipip.pop(node, None):
                self._emit(proto.IPIPTunnelRemove(node=node))
        self._pending_ipip.clear()

    def _flush_vtep_removes(self) -> None:
        for node in sorted(self._pending_vteps):
            if self._pending_vteps[node] is None and self._sent_vteps.pop(node, None):
                self._emit(proto.VXLANTunnelEndpointRemove(node=node))
        self._pending_vteps.clear()

    def _flush_service_updates(self) -> None:
        for fid in sorted(self._pending_services):
            frontend = self._pending_services[fid]
            if frontend is None:
                if self._sent_services.pop(fid, None) is not None:
                    self._emit(proto.ServiceFrontendRemove(id=fid))
            elif self._sent_services.get(fid) != frontend:
                self._sent_services[fid] = frontend
                self._emit(frontend)
        self._pending_services.clear()

    def _flush_in_sync(self) -> None:
        if self._datastore_in_sync and not self.in_sync_sent:
            self.in_sync_sent = True
            self._emit(proto.InSync())


def _remove_for(sent: EndpointUpdate) -> EndpointRemove:
    if isinstance(sent, proto.WorkloadEndpointUpdate):
        return proto.WorkloadEndpointRemove(id=sent.id)
    return proto.HostEndpointRemove(id=sent.id)

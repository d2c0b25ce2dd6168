"""ExpectedDataplane: the dataplane as the calc graph's messages describe it, checked as it goes.

Role: a consumer of `proto` messages (it has `send(message)`) that applies each message to
an in-memory model of what a dataplane would hold (IP sets and members, active policies
and profiles, endpoints, routes, pools, host IPs, config, in-sync). Used by `pyfelix calc`
to print what a node would be programmed with, and by tests as the recording fake
dataplane.

With `strict=True` (the default) it ASSERTS the ordering contract of `agent.proto` on
every message and raises `OrderingViolation` naming the message and what was wrong:
- no policy or profile references an IP set the dataplane does not have;
- no endpoint references a policy or profile the dataplane does not have;
- nothing is removed while still referenced (IP sets by policies/profiles, policies and
  profiles by endpoints), and nothing is removed or delta-updated that does not exist;
- IP-set deltas are exact (added members absent, removed members present);
- `InSync` is sent at most once.
With `strict=False` violations are collected in `violations` instead of raised (for tools
that must print a result anyway), and the costly "still referenced?" scans on IP-set and
policy removal are skipped.

`summary()` renders the state in the `pyfelix calc -o json` shape (docs/ARCHITECTURE.md section 11).
"""

from __future__ import annotations

from typing import Any

from pyfelix.agent import proto


class OrderingViolation(AssertionError):
    """A message broke the calc-graph -> dataplane ordering contract."""


def endpoint_label(endpoint_id: proto.WorkloadEndpointID) -> str:
    """`<namespace>/<workload>`, plus `/<endpoint>` for interfaces other than eth0."""
    if endpoint_id.endpoint in ("", "eth0"):
        return endpoint_id.workload
    return f"{endpoint_id.workload}/{endpoint_id.endpoint}"


def _policy_ids(tiers: tuple[proto.TierInfo, ...]) -> set[proto.PolicyID]:
    return {proto.PolicyID(t.name, n) for t in tiers
            for n in t.ingress_policies + t.egress_policies}


def _host_endpoint_tiers(hep: proto.HostEndpoint) -> tuple[proto.TierInfo, ...]:
    return hep.tiers + hep.untracked_tiers + hep.pre_dnat_tiers + hep.forward_tiers


def _rule_ip_sets(rules: tuple[proto.Rule, ...]) -> set[str]:
    out: set[str] = set()
    for rule in rules:
        out |= rule.ip_set_ids()
    return out


class ExpectedDataplane:
    def __init__(self, *, strict: bool = True) -> None:
        self.strict = strict
        self.ip_sets: dict[str, set[str]] = {}
        self.ip_set_types: dict[str, str] = {}
        self.policies: dict[proto.PolicyID, proto.Policy] = {}
        self.profiles: dict[str, proto.Profile] = {}
        self.workload_endpoints: dict[proto.WorkloadEndpointID, proto.WorkloadEndpoint] = {}
        self.host_endpoints: dict[proto.HostEndpointID, proto.HostEndpoint] = {}
        self.routes: dict[str, proto.RouteUpdate] = {}
        self.pools: dict[str, proto.IPAMPoolUpdate] = {}
        self.host_ips: dict[str, str] = {}
        self.vteps: dict[str, proto.VXLANTunnelEndpointUpdate] = {}
        self.ipip_tunnels: dict[str, proto.IPIPTunnelUpdate] = {}
        self.service_frontends: dict[str, proto.ServiceFrontendUpdate] = {}
        self.config: dict[str, str] | None = None
        self.datastore_ready = True  # ClusterInformation datastoreReady
        self.in_sync = False
        self.messages: list[Any] = []
        self.record = True
        self.violations: list[str] = []  # non-strict mode: what strict mode would raise

    # --- the dataplane driver interface -------------------------------------------------

    def send(self, message: Any) -> None:
        if self.record:
            self.messages.append(message)
        handler = getattr(self, "_on_" + type(message).__name__, None)
        if handler is None:
            raise TypeError(f"unknown message {type(message).__name__}")
        handler(message)

    def _check(self, ok: bool, message: Any, what: str) -> None:
        if ok:
            return
        text = f"{type(message).__name__} {getattr(message, 'id', '')}: {what}"
        if self.strict:
            raise OrderingViolation(text)
        self.violations.append(text)

    # --- IP sets ------------------------------------------------------------------------

    def _on_IPSetUpdate(self, m: proto.IPSetUpdate) -> None:
        self.ip_sets[m.id] = set(m.members)
        self.ip_set_types[m.id] = m.type

    def _on_IPSetDeltaUpdate(self, m: proto.IPSetDeltaUpdate) -> None:
        members = self.ip_sets.get(m.id)
        self._check(members is not None, m, "delta for an IP set that does not exist")
        if members is None:
            return
        self._check(not (m.added & members), m, f"adds existing {sorted(m.added & members)}")
        self._check(m.removed <= members, m, f"removes absent {sorted(m.removed - members)}")
        self._check(not (m.added & m.removed), m, "adds and removes the same member")
        members -= m.removed
        members |= m.added

    def _on_IPSetRemove(self, m: proto.IPSetRemove) -> None:
        self._check(m.id in self.ip_sets, m, "removes an IP set that does not exist")
        if self.strict:  # the reference scan is costly: strict (test) mode only
            users = sorted(str(p) for p, pol in self.policies.items()
                           if m.id in _rule_ip_sets(pol.inbound_rules + pol.outbound_rules))
            users += sorted(p for p, prof in self.profiles.items()
                            if m.id in _rule_ip_sets(prof.inbound_rules + prof.outbound_rules))
            self._check(not users, m, f"IP set still used by {users}")
        self.ip_sets.pop(m.id, None)
        self.ip_set_types.pop(m.id, None)

    # --- policies and profiles ----------------------------------------------------------

    def _check_ip_set_refs(self, m: Any, rules: tuple[proto.Rule, ...]) -> None:
        missing = sorted(_rule_ip_sets(rules) - self.ip_sets.keys())
        self._check(not missing, m, f"references unknown IP sets {missing}")

    def _on_ActivePolicyUpdate(self, m: proto.ActivePolicyUpdate) -> None:
        self._check_ip_set_refs(m, m.policy.inbound_rules + m.policy.outbound_rules)
        self.policies[m.id] = m.policy

    def _on_ActivePolicyRemove(self, m: proto.ActivePolicyRemove) -> None:
        self._check(m.id in self.policies, m, "removes a policy that does not exist")
        if self.strict:  # the reference scan is costly: strict (test) mode only
            users = [str(k) for k, ep in self.workload_endpoints.items()
                     if m.id in _policy_ids(ep.tiers)]
            users += [str(k) for k, hep in self.host_endpoints.items()
                      if m.id in _policy_ids(_host_endpoint_tiers(hep))]
            self._check(not users, m, f"policy still used by {users}")
        self.policies.pop(m.id, None)

    def _on_ActiveProfileUpdate(self, m: proto.ActiveProfileUpdate) -> None:
        self._check_ip_set_refs(m, m.profile.inbound_rules + m.profile.outbound_rules)
        self.profiles[m.id] = m.profile

    def _on_ActiveProfileRemove(self, m: proto.ActiveProfileRemove) -> None:
        self._check(m.id in self.profiles, m, "removes a profile that does not exist")
        users = [str(k) for k, ep in self.workload_endpoints.items() if m.id in ep.profile_ids]
        users += [str(k) for k, ep in self.host_endpoints.items() if m.id in ep.profile_ids]
        self._check(not users, m, f"profile still used by {users}")
        self.profiles.pop(m.id, None)

    # --- endpoints ----------------------------------------------------------------------

    def _check_endpoint_refs(self, m: Any, profiles: tuple[str, ...],
                             tiers: tuple[proto.TierInfo, ...]) -> None:
        missing_profiles = sorted(set(profiles) - self.profiles.keys())
        self._check(not missing_profiles, m, f"references unknown profiles {missing_profiles}")
        missing = sorted(str(p) for p in _policy_ids(tiers) - self.policies.keys())
        self._check(not missing, m, f"references unknown policies {missing}")

    def _on_WorkloadEndpointUpdate(self, m: proto.WorkloadEndpointUpdate) -> None:
        self._check_endpoint_refs(m, m.endpoint.profile_ids, m.endpoint.tiers)
        self.workload_endpoints[m.id] = m.endpoint

    def _on_WorkloadEndpointRemove(self, m: proto.WorkloadEndpointRemove) -> None:
        self._check(m.id in self.workload_endpoints, m, "removes an unknown endpoint")
        self.workload_endpoints.pop(m.id, None)

    def _on_HostEndpointUpdate(self, m: proto.HostEndpointUpdate) -> None:
        self._check_endpoint_refs(m, m.endpoint.profile_ids, _host_endpoint_tiers(m.endpoint))
        self.host_endpoints[m.id] = m.endpoint

    def _on_HostEndpointRemove(self, m: proto.HostEndpointRemove) -> None:
        self._check(m.id in self.host_endpoints, m, "removes an unknown host endpoint")
        self.host_endpoints.pop(m.id, None)

    # --- passthru -----------------------------------------------------------------------

    def _on_HostMetadataUpdate(self, m: proto.HostMetadataUpdate) -> None:
        self.host_ips[m.hostname] = m.ipv4_addr

    def _on_HostMetadataRemove(self, m: proto.HostMetadataRemove) -> None:
        self._check(m.hostname in self.host_ips, m, "removes unknown host metadata")
        self.host_ips.pop(m.hostname, None)

    def _on_IPAMPoolUpdate(self, m: proto.IPAMPoolUpdate) -> None:
        self.pools[m.id] = m

    def _on_IPAMPoolRemove(self, m: proto.IPAMPoolRemove) -> None:
        self._check(m.id in self.pools, m, "removes an unknown IP pool")
        self.pools.pop(m.id, None)

    def _on_RouteUpdate(self, m: proto.RouteUpdate) -> None:
        self.routes[m.dst] = m

    def _on_RouteRemove(self, m: proto.RouteRemove) -> None:
        self._check(m.dst in self.routes, m, "removes an unknown route")
        self.routes.pop(m.dst, None)

    def _on_VXLANTunnelEndpointUpdate(self, m: proto.VXLANTunnelEndpointUpdate) -> None:
        self.vteps[m.node] = m

    def _on_VXLANTunnelEndpointRemove(self, m: proto.VXLANTunnelEndpointRemove) -> None:
        # A VXLAN route may outlive its node's VTEP (the node lost its host IP while its
        # blocks remain): the dataplane then has no way to program it, as in Felix.
        self._check(m.node in self.vteps, m, "removes an unknown VXLAN tunnel endpoint")
        self.vteps.pop(m.node, None)

    def _on_IPIPTunnelUpdate(self, m: proto.IPIPTunnelUpdate) -> None:
        self.ipip_tunnels[m.node] = m

    def _on_IPIPTunnelRemove(self, m: proto.IPIPTunnelRemove) -> None:
        self._check(m.node in self.ipip_tunnels, m, "removes an unknown IPIP tunnel")
        self.ipip_tunnels.pop(m.node, None)

    def _on_ServiceFrontendUpdate(self, m: proto.ServiceFrontendUpdate) -> None:
        self.service_frontends[m.id] = m

    def _on_ServiceFrontendRemove(self, m: proto.ServiceFrontendRemove) -> None:
        self._check(m.id in self.service_frontends, m, "removes an unknown service frontend")
        self.service_frontends.pop(m.id, None)

    def _on_ConfigUpdate(self, m: proto.ConfigUpdate) -> None:
        self.config = dict(m.config)

    def _on_DatastoreReady(self, m: proto.DatastoreReady) -> None:
        self.datastore_ready = m.ready

    def _on_InSync(self, m: proto.InSync) -> None:
        self._check(not self.in_sync, m, "InSync sent twice")
        self.in_sync = True

    # --- views --------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The `pyfelix calc -o json` object: endpoints and IP sets, sorted."""
        endpoints = {}
        for endpoint_id, ep in self.workload_endpoints.items():
            endpoints[endpoint_label(endpoint_id)] = _endpoint_summary(ep.tiers, ep.profile_ids)
        out: dict[str, Any] = {
            "endpoints": dict(sorted(endpoints.items())),
            "ipsets": [{"id": i, "members": sorted(self.ip_sets[i])}
                       for i in sorted(self.ip_sets)],
        }
        if self.host_endpoints:
            out["host_endpoints"] = {
                hid.endpoint: _endpoint_summary(hep.tiers, hep.profile_ids)
                for hid, hep in sorted(self.host_endpoints.items())}
        return out


def _endpoint_summary(tiers: tuple[proto.TierInfo, ...],
                      profiles: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        "ingress": [p for t in tiers for p in t.ingress_policies],
        "egress": [p for t in tiers for p in t.egress_policies],
        "profiles": list(profiles),
    }

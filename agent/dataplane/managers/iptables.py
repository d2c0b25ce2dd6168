"""iptables policy manager: policies, profiles and workload endpoints -> filter-table chains.

Role: the iptables fallback's policy half (Felix's policy manager + endpoint manager for
iptables). Inputs (`on_update`): `ActivePolicyUpdate/Remove`, `ActiveProfileUpdate/Remove`,
`WorkloadEndpointUpdate/Remove`, `ConfigUpdate` (DefaultEndpointToHostAction), `InSync`.
Output (`apply`): the namespace's filter table holds exactly the rendered chains
(`agent.dataplane.iptables.render`) via `IptablesTable` (one atomic iptables-restore, only
what changed). IP sets the rules reference are programmed by `IPSetsManager`, which the loop
applies BEFORE this manager (creates/fills) and finishes AFTER it (deletions).

Invariants: on_update only re-renders nothing: it marks policies/profiles/endpoints dirty;
apply() re-renders only dirty objects (and every endpoint when the set of known policies or
profiles changed, since endpoint chains jump to them); chains of ours that nothing wants are
deleted only after InSync. Policy-critical: a persistent failure makes the loop fail closed.
"""

from __future__ import annotations

import logging

from agent.dataplane.iptables.names import valid_iface_name
from agent.dataplane.iptables.render import (
    ENDPOINT_TO_HOST_ACTIONS,
    Marks,
    RuleRenderer,
)
from agent.dataplane.iptables.restore import IptablesBinaries, IptablesTable, detect_backend
from agent.dataplane.manager import ManagerBase
from agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    ActiveProfileRemove,
    ActiveProfileUpdate,
    ConfigUpdate,
    InSync,
    Policy,
    PolicyID,
    Profile,
    WorkloadEndpoint,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from agent.shims.cmd import CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)


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
    ) -> None:
        super().__init__()
        self._runner = runner or NetnsCommandRunner(netns)
        self._backend_mode = backend
        self._binaries = binaries
        self._renderer = RuleRenderer(
            marks=marks,
            interface_prefixes=interface_prefixes,
            endpoint_to_host_action=endpoint_to_host_action,
        )
        self._table: IptablesTable | None = None
        self._policies: dict[PolicyID, Policy] = {}
        self._profiles: dict[str, Profile] = {}
        self._endpoints: dict[WorkloadEndpointID, WorkloadEndpoint] = {}
        self._dirty_policies: set[PolicyID] = set()
        self._dirty_profiles: set[str] = set()
        self._dirty_endpoints: set[WorkloadEndpointID] = set()
        self._endpoint_chains: dict[WorkloadEndpointID, tuple[str, ...]] = {}
        self._all_endpoints_dirty = False
        self._static_dirty = True

    @property
    def table(self) -> IptablesTable:
        """Created on first use: picking the backend runs commands in the namespace."""
        if self._table is None:
            binaries = self._binaries or detect_backend(self._runner, self._backend_mode)
            self._table = IptablesTable(self._runner, binaries=binaries)
        return self._table

    # --- on_update ---------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, ActivePolicyUpdate):
            if msg.id not in self._policies:
                self._all_endpoints_dirty = True
            self._policies[msg.id] = msg.policy
            self._dirty_policies.add(msg.id)
        elif isinstance(msg, ActivePolicyRemove):
            if self._policies.pop(msg.id, None) is not None:
                self._dirty_policies.add(msg.id)
                self._all_endpoints_dirty = True
        elif isinstance(msg, ActiveProfileUpdate):
            if msg.id not in self._profiles:
                self._all_endpoints_dirty = True
            self._profiles[msg.id] = msg.profile
            self._dirty_profiles.add(msg.id)
        elif isinstance(msg, ActiveProfileRemove):
            if self._profiles.pop(msg.id, None) is not None:
                self._dirty_profiles.add(msg.id)
                self._all_endpoints_dirty = True
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
        elif isinstance(msg, ConfigUpdate):
            self._on_config(dict(msg.config))
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _on_config(self, config: dict[str, str]) -> None:
        action = config.get("DefaultEndpointToHostAction")
        if action is None or action == self._renderer.endpoint_to_host_action:
            return
        if action.lower() not in ENDPOINT_TO_HOST_ACTIONS:
            log.error("config DefaultEndpointToHostAction: %r is not Drop, Return or Accept; "
                      "keeping %s", action, self._renderer.endpoint_to_host_action)
            return
        self._renderer.endpoint_to_host_action = action
        self._static_dirty = True

    # --- apply -------------------------------------------------------------------------------

    def request_resync(self) -> None:
        super().request_resync()
        if self._table is not None:
            self._table.request_resync()

    def _render_dirty(self) -> None:
        table = self.table
        if self._static_dirty:
            self._set_dispatch()  # cali-FORWARD jumps to the dispatch chains: always present
            for chain in self._renderer.static_chains():
                table.set_chain(chain)
            for base, rules in self._renderer.base_chain_inserts().items():
                table.set_base_inserts(base, rules)
            self._static_dirty = False
        for pid in self._dirty_policies:
            policy = self._policies.get(pid)
            chains = self._renderer.policy_chains(pid, policy or Policy())
            for chain in chains:
                if policy is None:
                    table.remove_chain(chain.name)
                else:
                    table.set_chain(chain)
        self._dirty_policies.clear()
        for prof_id in self._dirty_profiles:
            profile = self._profiles.get(prof_id)
            for chain in self._renderer.profile_chains(prof_id, profile or Profile()):
                if profile is None:
                    table.remove_chain(chain.name)
                else:
                    table.set_chain(chain)
        self._dirty_profiles.clear()
        dirty = set(self._endpoints) if self._all_endpoints_dirty else set()
        dirty |= self._dirty_endpoints
        if self._dirty_endpoints:
            self._set_dispatch()
        for ep_id in dirty:
            self._render_endpoint(ep_id)
        self._dirty_endpoints.clear()
        self._all_endpoints_dirty = False

    def _set_dispatch(self) -> None:
        ifaces = {ep.name for ep in self._endpoints.values()}
        if len(ifaces) != len(self._endpoints):
            log.error("two workload endpoints share an interface name; one wins")
        for chain in self._renderer.dispatch_chains(ifaces):
            self.table.set_chain(chain)

    def _render_endpoint(self, ep_id: WorkloadEndpointID) -> None:
        for name in self._endpoint_chains.pop(ep_id, ()):
            self.table.remove_chain(name)
        endpoint = self._endpoints.get(ep_id)
        if endpoint is None:
            return
        chains = self._renderer.endpoint_chains(
            endpoint,
            policy_known=lambda pid: pid in self._policies,
            profile_known=lambda prof: prof in self._profiles,
        )
        for chain in chains:
            self.table.set_chain(chain)
        self._endpoint_chains[ep_id] = tuple(c.name for c in chains)

    def apply(self) -> None:
        self._render_dirty()
        if self._resync_requested:
            self.table.request_resync()
            self._resync_requested = False
        self.table.apply(allow_deletes=self._datastore_in_sync)

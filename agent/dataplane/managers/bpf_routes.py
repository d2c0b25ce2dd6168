"""BPF route manager: the `routes` trie the tc programs read, by difference.

Role: Felix's `bpf_route_mgr`. The programs look a destination up in `routes` to know
whether it is this host (LOCAL_HOST: DefaultEndpointToHostAction applies to pod -> host
flows), a local or remote workload, a remote host, inside an IP pool (and whether NAT
outgoing applies). Contents are computed by `agent.bpf.route_table` (pure).

Inputs (`on_update`, cheap): RouteUpdate/Remove, IPAMPoolUpdate/Remove,
HostMetadataUpdate/Remove, InSync, and the interface monitor's InterfaceUpdate /
InterfaceAddrsUpdate (ifindexes of local workload interfaces; this host's own addresses,
those of workload interfaces excluded, become LOCAL_HOST entries).

`apply()`: on the first apply and at a resync, read the map and list the interfaces (as
the policy manager does, so a restarted agent never takes "not reported yet" for "gone");
when anything changed, recompute and write the entries that differ; delete stale entries
only after InSync (before it, the datastore may not have told us every route yet). The
same state twice writes nothing. A full map: the entries that did not fit are left out,
counted in `pyfelix_bpf_map_full_errors_total{map="routes"}` and logged (the programs then
treat those destinations as unknown: not LOCAL_HOST, so a Drop endpoint-to-host action
does not apply to them; a resync retries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import routes as routes_map
from pyfelix.agent.bpf.route_table import RouteInputs, compile_routes
from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics
from pyfelix.agent.dataplane.managers.bpf_ifaces import InterfaceTable, Lister
from pyfelix.agent.dataplane.managers.bpf_mirror import MapMirror

log = logging.getLogger(__name__)


class BpfRouteManager(ManagerBase):
    name = "bpf-routes"
    policy_critical = True  # LOCAL_HOST entries carry DefaultEndpointToHostAction=Drop

    def __init__(self, routes_map: Any, *, interface_prefixes: tuple[str, ...] = ("cali",),
                 hostname: str = "", list_interfaces: Lister | None = None,
                 ipv6: bool = True) -> None:
        super().__init__()
        self._ipv6 = ipv6  # Ipv6Support: False leaves every IPv6 route out of the map
        self._mirror = MapMirror(routes_map)
        self._prefixes = interface_prefixes
        self._list_interfaces = list_interfaces
        self.inputs = RouteInputs(hostname=hostname)
        self.interfaces = InterfaceTable()
        self._dirty = True
        self.problems: list[str] = []
        self.on_close: Callable[[], None] | None = None  # releases the shared build

    def on_update(self, msg: object) -> None:
        if self.inputs.apply(msg):
            self._dirty = True
        elif isinstance(msg, InterfaceUpdate | InterfaceAddrsUpdate):
            if self.interfaces.observe(msg):
                self._dirty = True
        elif isinstance(msg, proto.InSync):
            self._datastore_in_sync = True
            self._dirty = True

    def apply(self) -> None:
        if not self._dirty and not self._resync_requested:
            return
        try:
            if self._resync_requested:
                self._mirror.reload()
                if self._list_interfaces is not None:
                    self.interfaces.replace_all(self._list_interfaces())
                self._resync_requested = False
            self.inputs.local_addrs = {
                name: addrs for name, addrs in self.interfaces.addrs_by_name.items()
                if not name.startswith(self._prefixes)}
            problems: list[str] = []
            desired = compile_routes(self.inputs, self.interfaces.index_by_name, problems)
            if not self._ipv6:
                desired = {k: v for k, v in desired.items()
                           if routes_map.key_family(k) == 4}
            if problems != self.problems:
                for problem in sorted(set(problems) - set(self.problems)):
                    log.error("BPF routes: %s", problem)
                self.problems = problems
            failed = self._mirror.write(self._mirror.updates(desired))
            if failed:
                metrics.MAP_FULL_ERRORS.labels("routes").inc()
                log.error("BPF map 'routes' is full (max_entries=%d): %d entries left out",
                          self._mirror.map.max_entries, len(failed))
            if self._datastore_in_sync:
                self._mirror.delete(self._mirror.stale(desired))
        except Exception:
            self._resync_requested = True  # the mirror may be wrong now: re-read next time
            raise
        metrics.MAP_ENTRIES.labels("routes").set(len(self._mirror.actual or {}))
        metrics.MAP_MAX_ENTRIES.labels("routes").set(self._mirror.map.max_entries)
        self._dirty = False

    def close(self) -> None:
        """The map stays pinned; only our handle on the shared build goes."""
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

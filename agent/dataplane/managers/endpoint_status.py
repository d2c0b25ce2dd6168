"""Endpoint status manager: each local endpoint's status (up/down/error) for status reporting.

Role: Felix's endpoint status calculation (what `EndpointReportingEnabled` writes back to the
datastore). Inputs (`on_update`): `WorkloadEndpointUpdate/Remove`,
`HostEndpointUpdate/Remove` and the interface monitor's `InterfaceUpdate` /
`InterfaceAddrsUpdate`. Output (`apply`, the last manager of a round, so "up" means the
round that programmed the endpoint has run): `report(kind, endpoint_id, status | None)` for
every endpoint whose status changed (None: the endpoint is gone).

Statuses:
- workload endpoint: "up" when its interface exists and is up, "down" otherwise, "error"
  when its interface name is invalid (no dataplane can program it);
- host endpoint: "up" when its interface ("*": always; none: any interface carrying one of
  its expected IPs) exists and is up, "down" otherwise, "error" for an invalid name.
Ids: workloads `<orchestrator>/<workload>/<endpoint>` (e.g. `k8s/shop/web-1/eth0`), host
endpoints their resource name.

Never touches the kernel; `report` must be cheap and thread-safe (the status reporter
queues it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from pyfelix.agent.dataplane.events import (
    IFACE_ABSENT,
    IFACE_UP,
    InterfaceAddrsUpdate,
    InterfaceUpdate,
)
from pyfelix.agent.dataplane.iptables.names import valid_iface_name
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import (
    HostEndpoint,
    HostEndpointID,
    HostEndpointRemove,
    HostEndpointUpdate,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)

WORKLOAD, HOST = "workload", "host"
Report = Callable[[str, str, "str | None"], None]


def workload_status_id(endpoint_id: WorkloadEndpointID) -> str:
    return f"{endpoint_id.orchestrator}/{endpoint_id.workload}/{endpoint_id.endpoint}"


class EndpointStatusManager(ManagerBase):
    name = "endpoint-status"

    def __init__(self, report: Report) -> None:
        super().__init__()
        self._report = report
        self._workloads: dict[WorkloadEndpointID, str] = {}  # -> interface name
        self._hosts: dict[HostEndpointID, HostEndpoint] = {}
        self._iface_up: dict[str, bool] = {}
        self._iface_ips: dict[str, frozenset[str]] = {}
        self._reported: dict[tuple[str, str], str] = {}
        self._dirty = False

    def on_update(self, msg: object) -> None:
        if isinstance(msg, WorkloadEndpointUpdate):
            self._workloads[msg.id] = msg.endpoint.name
        elif isinstance(msg, WorkloadEndpointRemove):
            self._workloads.pop(msg.id, None)
        elif isinstance(msg, HostEndpointUpdate):
            self._hosts[msg.id] = msg.endpoint
        elif isinstance(msg, HostEndpointRemove):
            self._hosts.pop(msg.id, None)
        elif isinstance(msg, InterfaceUpdate):
            if msg.state == IFACE_ABSENT:
                self._iface_up.pop(msg.name, None)
            else:
                self._iface_up[msg.name] = msg.state == IFACE_UP
        elif isinstance(msg, InterfaceAddrsUpdate):
            if msg.addrs is None:
                self._iface_ips.pop(msg.name, None)
            else:
                self._iface_ips[msg.name] = frozenset(a.split("/")[0] for a in msg.addrs)
        else:
            return
        self._dirty = True

    def _host_status(self, hep: HostEndpoint) -> str:
        if hep.name == "*":
            return "up"
        if hep.name:
            if not valid_iface_name(hep.name):
                return "error"
            return "up" if self._iface_up.get(hep.name) else "down"
        wanted = set()
        for address in hep.expected_ipv4_addrs + hep.expected_ipv6_addrs:
            try:
                wanted.add(str(ipaddress.ip_interface(address).ip))
            except ValueError:
                continue
        return "up" if any(self._iface_up.get(iface) and ips & wanted
                           for iface, ips in self._iface_ips.items()) else "down"

    def statuses(self) -> dict[tuple[str, str], str]:
        out: dict[tuple[str, str], str] = {}
        for wid, iface in self._workloads.items():
            status = "error" if not valid_iface_name(iface) else (
                "up" if self._iface_up.get(iface) else "down")
            out[(WORKLOAD, workload_status_id(wid))] = status
        for hid, hep in self._hosts.items():
            out[(HOST, hid.endpoint)] = self._host_status(hep)
        return out

    def apply(self) -> None:
        if not self._dirty:
            return
        current = self.statuses()
        for key in sorted(self._reported.keys() - current.keys()):
            self._report(key[0], key[1], None)
            del self._reported[key]
        for key in sorted(current):
            if self._reported.get(key) != current[key]:
                self._report(key[0], key[1], current[key])
                self._reported[key] = current[key]
        self._dirty = False

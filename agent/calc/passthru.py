"""Pass-through nodes: Felix configuration, host IPs and IP pools, lightly reshaped.

Role (Felix's ConfigBatcher and DataplanePassthru):
- `ConfigBatcher`: FelixConfiguration `default` (global) overlaid with `node.<hostname>`
  (this host's) -> one effective settings map. Nothing is sent before the datastore is in
  sync (a half-loaded config could make the agent restart needlessly); then the current
  map once, and again on every change. Output: `sink.on_config_update(settings)`.
- `HostIPPassthru`: Node resources -> `sink.on_host_ip_update(hostname, ipv4 | None)`. The
  IPv4 address is the node's `bgp.ipv4Address` without its prefix length, else its first
  IPv4 address (Kubernetes Node status). Sent when it changes; None when the node or its
  address goes.
- `IPPoolPassthru`: IPPool resources -> `sink.on_ip_pool_update(cidr, IPAMPoolUpdate | None)`
  keyed by CIDR (the pool's identity in the dataplane). Two pool resources with one CIDR:
  the first by name wins until it goes; a CIDR change removes the old CIDR.

Invariants: each output reflects only the current resources; every update for an id is
eventually matched by a None when its resource goes.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import (
    KIND_CLUSTER_INFORMATION,
    KIND_FELIX_CONFIGURATION,
    KIND_IP_POOL,
    KIND_NODE,
    CalcUpdate,
    Dispatcher,
)
from pyfelix.agent.model import ClusterInformation, IPPool, Node
from pyfelix.agent.syncer.api import ResourceKey, SyncStatus

GLOBAL_CONFIG_NAME = "default"


def host_ipv4_of(node: Node) -> str:
    """The node's IPv4 address as Felix uses it ("" when it has none)."""
    return _host_ip_of(node, 4)


def host_ipv6_of(node: Node) -> str:
    """The node's IPv6 address (`spec.bgp.ipv6Address`, else its first IPv6 address; ""
    when it has none): the parent of its IPv6 VXLAN tunnel endpoint."""
    return _host_ip_of(node, 6)


def _host_ip_of(node: Node, version: int) -> str:
    bgp_address = None
    if node.bgp is not None:
        bgp_address = node.bgp.ipv4_address if version == 4 else node.bgp.ipv6_address
    if bgp_address:
        return str(ipaddress.ip_interface(bgp_address).ip)
    for text in node.addresses:
        try:
            address = ipaddress.ip_interface(text).ip
        except ValueError:
            continue
        if address.version == version:
            return str(address)
    return ""


class ConfigSink(Protocol):
    def on_config_update(self, settings: dict[str, str]) -> None: ...

    def on_datastore_ready(self, ready: bool) -> None: ...


class ConfigBatcher:
    def __init__(self, hostname: str, sink: ConfigSink) -> None:
        self._node_name = f"node.{hostname}"
        self._sink = sink
        self._global: dict[str, str] = {}
        self._host: dict[str, str] = {}
        self._cluster: dict[str, str] = {}  # ClusterInformation's ClusterGUID/Type, version
        self._ready = True
        self._in_sync = False
        self._sent: dict[str, str] | None = None
        self._sent_ready: bool | None = None

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_FELIX_CONFIGURATION, self.on_update)
        dispatcher.register(KIND_CLUSTER_INFORMATION, self.on_cluster_information)
        dispatcher.register_status(self.on_status)

    def on_cluster_information(self, update: CalcUpdate) -> None:
        """ClusterInformation `default`, as Felix reads it: its GUID, type and version join
        the global configuration (below every FelixConfiguration), and datastoreReady false
        pauses the dataplane (absent or deleted: ready)."""
        if update.key.name != GLOBAL_CONFIG_NAME:
            return
        info = update.value
        self._cluster, self._ready = {}, True
        if isinstance(info, ClusterInformation):
            self._cluster = {name: value for name, value in (
                ("ClusterGUID", info.cluster_guid), ("ClusterType", info.cluster_type),
                ("CalicoVersion", info.calico_version)) if value}
            self._ready = info.datastore_ready is not False
        self._maybe_send()

    def on_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        settings = dict(update.value.settings) if update.value is not None else {}
        if name == GLOBAL_CONFIG_NAME:
            self._global = settings
        elif name == self._node_name:
            self._host = settings
        else:
            return
        self._maybe_send()

    def on_status(self, status: SyncStatus) -> None:
        if status is SyncStatus.IN_SYNC and not self._in_sync:
            self._in_sync = True
            self._maybe_send()

    def effective(self) -> dict[str, str]:
        return dict(sorted({**self._cluster, **self._global, **self._host}.items()))

    def _maybe_send(self) -> None:
        if not self._in_sync:
            return
        settings = self.effective()
        if settings != self._sent:
            self._sent = settings
            self._sink.on_config_update(settings)
        if self._ready != self._sent_ready and (self._sent_ready is not None or
                                                not self._ready):
            self._sink.on_datastore_ready(self._ready)
        self._sent_ready = self._ready


class HostIPSink(Protocol):
    def on_host_ip_update(self, hostname: str, ipv4: str | None) -> None: ...


class HostIPPassthru:
    def __init__(self, sink: HostIPSink) -> None:
        self._sink = sink
        self._ips: dict[str, str] = {}

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_NODE, self.on_update)

    def on_update(self, update: CalcUpdate) -> None:
        hostname = update.key.name
        address = host_ipv4_of(update.value) if update.value is not None else ""
        if address:
            if self._ips.get(hostname) != address:
                self._ips[hostname] = address
                self._sink.on_host_ip_update(hostname, address)
        elif self._ips.pop(hostname, None) is not None:
            self._sink.on_host_ip_update(hostname, None)

    def host_ips(self) -> dict[str, str]:
        return dict(sorted(self._ips.items()))


class IPPoolSink(Protocol):
    def on_ip_pool_update(self, pool_id: str, pool: proto.IPAMPoolUpdate | None) -> None: ...


def pool_message(pool: IPPool) -> proto.IPAMPoolUpdate:
    return proto.IPAMPoolUpdate(id=pool.cidr, cidr=pool.cidr, masquerade=pool.nat_outgoing,
                                ipip_mode=pool.ipip_mode, vxlan_mode=pool.vxlan_mode,
                                disabled=pool.disabled,
                                disable_bgp_export=pool.disable_bgp_export)


class IPPoolPassthru:
    def __init__(self, sink: IPPoolSink) -> None:
        self._sink = sink
        self._pools: dict[ResourceKey, IPPool] = {}
        self._sent: dict[str, proto.IPAMPoolUpdate] = {}

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_IP_POOL, self.on_update)

    def on_update(self, update: CalcUpdate) -> None:
        old = self._pools.pop(update.key, None)
        if update.value is not None:
            self._pools[update.key] = update.value
        touched = {p.cidr for p in (old, update.value) if p is not None}
        for cidr in sorted(touched):
            self._resend(cidr)

    def pools(self) -> list[IPPool]:
        return [self._pools[k] for k in sorted(self._pools)]

    def _resend(self, cidr: str) -> None:
        owners = sorted(k for k, p in self._pools.items() if p.cidr == cidr)
        message = pool_message(self._pools[owners[0]]) if owners else None
        if message is None:
            if self._sent.pop(cidr, None) is not None:
                self._sink.on_ip_pool_update(cidr, None)
        elif self._sent.get(cidr) != message:
            self._sent[cidr] = message
            self._sink.on_ip_pool_update(cidr, message)

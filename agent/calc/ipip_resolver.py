"""IPIPResolver: every node's IPIP tunnel (tunl0 address and parent IP), when IPIP pools exist.

Role: the calc-graph half of Calico's IPIP mode. Inputs: Nodes (host IP,
`spec.bgp.ipv4IPIPTunnelAddr`) and IPPools (from the all-updates dispatcher). Output on
`flush()`: `sink.on_ipip_tunnel_update(node, IPIPTunnelUpdate | None)` for each node whose
tunnel changed.

A node has a tunnel while (1) some enabled IPv4 pool has `ipipMode` Always or CrossSubnet and
(2) the node has a host IPv4 address (the outer source and destination of its IPIP packets).
Its tunl0 address: the Node's `spec.bgp.ipv4IPIPTunnelAddr` when set (calico-node's IPAM
writes it there); otherwise derived in the first IPIP pool as the VXLANResolver derives VTEP
addresses (`derive_tunnel_addresses`, salted differently), so every node computes the same
answer and the datastore stays read-only for the agent. Felix's `IpInIpTunnelAddr` setting,
when set, overrides the LOCAL node's address in the IPIP manager (calico-node passes the
Node's address to Felix through that setting).

Invariants: the output depends only on current Nodes and pools; every tunnel sent is
withdrawn (None) when its node, its host IP or the last IPIP pool goes.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import KIND_IP_POOL, KIND_NODE, CalcUpdate, Dispatcher
from pyfelix.agent.calc.passthru import host_ipv4_of
from pyfelix.agent.calc.vxlan_resolver import derive_tunnel_addresses
from pyfelix.agent.model import IPPool, Node
from pyfelix.agent.syncer.api import ResourceKey

log = logging.getLogger(__name__)

IPIP_MODES = ("Always", "CrossSubnet")


class IPIPTunnelSink(Protocol):
    def on_ipip_tunnel_update(self, node: str,
                              tunnel: proto.IPIPTunnelUpdate | None) -> None: ...


class IPIPResolver:
    def __init__(self, sink: IPIPTunnelSink) -> None:
        self._sink = sink
        self._nodes: dict[str, tuple[str, str]] = {}  # name -> (host ip, explicit tunnel addr)
        self._pools: dict[ResourceKey, IPPool] = {}
        self._sent: dict[str, proto.IPIPTunnelUpdate] = {}
        self._dirty = False

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_NODE, self.on_node_update)
        dispatcher.register(KIND_IP_POOL, self.on_pool_update)

    def on_node_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        node = update.value
        if isinstance(node, Node):
            explicit = node.bgp.ipv4_ipip_tunnel_addr if node.bgp is not None else ""
            entry = (host_ipv4_of(node), explicit)
            if self._nodes.get(name) == entry:
                return
            self._nodes[name] = entry
        elif self._nodes.pop(name, None) is None:
            return
        self._dirty = True

    def on_pool_update(self, update: CalcUpdate) -> None:
        old = self._pools.pop(update.key, None)
        if isinstance(update.value, IPPool):
            self._pools[update.key] = update.value
        if old != update.value:
            self._dirty = True

    def ipip_pools(self) -> list[ipaddress.IPv4Network]:
        nets = []
        for pool in self._pools.values():
            if pool.disabled or pool.ipip_mode not in IPIP_MODES:
                continue
            net = ipaddress.ip_network(pool.cidr, strict=False)
            if isinstance(net, ipaddress.IPv4Network):
                nets.append(net)
        return sorted(set(nets), key=lambda n: (int(n.network_address), n.prefixlen))

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        wanted = self.compute()
        for node in sorted(self._sent.keys() - wanted.keys()):
            del self._sent[node]
            self._sink.on_ipip_tunnel_update(node, None)
        for node in sorted(wanted):
            if self._sent.get(node) != wanted[node]:
                self._sent[node] = wanted[node]
                self._sink.on_ipip_tunnel_update(node, wanted[node])

    def compute(self) -> dict[str, proto.IPIPTunnelUpdate]:
        pools = self.ipip_pools()
        if not pools:
            return {}
        nodes = {n: e for n, e in self._nodes.items() if e[0]}  # a host IP is required
        addresses: dict[str, str] = {}
        for name, (_, explicit) in sorted(nodes.items()):
            if explicit:
                if explicit in addresses.values():
                    log.error("Node %s: ipv4IPIPTunnelAddr %s is already another node's",
                              name, explicit)
                addresses[name] = explicit
        derive_tunnel_addresses(pools[0], sorted(n for n in nodes if n not in addresses),
                                addresses, "pyfelix-ipip-ip", "IPIP tunnel")
        return {name: proto.IPIPTunnelUpdate(node=name, ipv4_addr=addresses.get(name, ""),
                                             parent_device_ip=host_ip)
                for name, (host_ip, _) in nodes.items()}

    def tunnels(self) -> dict[str, proto.IPIPTunnelUpdate]:
        return dict(sorted(self._sent.items()))

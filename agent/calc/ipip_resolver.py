"""IPIPResolver: every node's IPIP tunnel (tunl0 address and parent IP), when IPIP pools exist.

Role: the calc-graph half of Calico's IPIP mode. Inputs: Nodes (host IP,
`spec.bgp.ipv4IPIPTunnelAddr`) and IPPools (from the all-updates dispatcher). Output on
`flush()`: `sink.on_ipip_tunnel_update(node, IPIPTunnelUpdate | None)` for each node whose
tunnel changed.

A node has a tunnel while (1) some enabled IPv4 pool has `ipipMode` Always or CrossSubnet and
(2) the node has a host IPv4 address (the outer source and destination of its IPIP packets).
Its tunl0 address: the Node's `spec.bgp.ipv4IPIPTunnelAddr` when set (calico-node's IPAM
writes it there); otherwise derived in the first IPIP pool as the VXLANResolver derives VTEP
addresses (calc/tunnel_resolver.py, salted differently), so every node computes the same
answer and the datastore stays read-only for the agent. Felix's `IpInIpTunnelAddr` setting,
when set, overrides the LOCAL node's address in the IPIP manager (calico-node passes the
Node's address to Felix through that setting).

Invariants: the output depends only on current Nodes and pools; every tunnel sent is
withdrawn (None) when its node, its host IP or the last IPIP pool goes.
"""

from __future__ import annotations

from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.passthru import host_ipv4_of
from pyfelix.agent.calc.tunnel_resolver import TunnelResolverBase
from pyfelix.agent.model import Node


class IPIPTunnelSink(Protocol):
    def on_ipip_tunnel_update(self, node: str,
                              tunnel: proto.IPIPTunnelUpdate | None) -> None: ...


class IPIPResolver(TunnelResolverBase):
    MODE_FIELD = "ipip_mode"
    ADDRESS_FIELD = "ipv4IPIPTunnelAddr"
    SALT = "pyfelix-ipip-ip"
    WHAT = "IPIP tunnel"

    def __init__(self, sink: IPIPTunnelSink) -> None:
        super().__init__()
        self._sink = sink

    def node_entry(self, node: Node) -> tuple[str, ...]:
        explicit = node.bgp.ipv4_ipip_tunnel_addr if node.bgp is not None else ""
        return (host_ipv4_of(node), explicit)

    def send(self, node: str, tunnel: proto.IPIPTunnelUpdate | None) -> None:
        self._sink.on_ipip_tunnel_update(node, tunnel)

    def compute(self) -> dict[str, proto.IPIPTunnelUpdate]:
        pools = self.tunnel_pools()
        if not pools:
            return {}
        nodes = self.nodes_with_host_ip()
        addresses = self.tunnel_addresses(pools[0], nodes)
        return {name: proto.IPIPTunnelUpdate(node=name, ipv4_addr=addresses.get(name, ""),
                                             parent_device_ip=entry[0])
                for name, entry in nodes.items()}

    def tunnels(self) -> dict[str, proto.IPIPTunnelUpdate]:
        return dict(sorted(self._sent.items()))

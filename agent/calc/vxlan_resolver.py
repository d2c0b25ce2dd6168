"""VXLANResolver: every node's VXLAN tunnel endpoint (VTEP), when VXLAN pools exist.

Role (Felix's VXLANResolver). Inputs: Nodes (host IP, `ipv4VXLANTunnelAddr`) and IPPools
(from the all-updates dispatcher). Output on `flush()`: `sink.on_vtep_update(node,
VXLANTunnelEndpointUpdate | None)` for each node whose VTEP changed.

A node has a VTEP while (1) some enabled IPv4 pool has `vxlanMode` Always or CrossSubnet and
(2) the node has a host IPv4 address (the VTEP's parent device IP). Its parts:
- address: the Node's `spec.ipv4VXLANTunnelAddr` when set (Calico's IPAM writes it there);
  otherwise DERIVED in the first VXLAN pool, the same on every node with no write-back
  (calc/tunnel_resolver.py says how; the IPIP resolver shares it). Easy to get wrong: a
  derived address can collide with a workload given an address at the top of the pool;
  set ipv4VXLANTunnelAddr on the Node to rule that out.
- MAC: the Node's `vxlanTunnelMACAddr` when the model carries it, else derived from the
  node name (locally administered unicast, first 6 bytes of sha256("pyfelix-vtep:" + name)),
  again the same on every node. Felix generates a random MAC and writes it back to the
  Node; deriving it keeps the datastore read-only for the agent.
- parent device IP: the node's host IPv4 (`host_ipv4_of`: BGP address, else first address).

Invariants: the output depends only on current Nodes and pools; every VTEP sent is
withdrawn (None) when its node, its host IP or the last VXLAN pool goes.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.passthru import host_ipv4_of
from pyfelix.agent.calc.tunnel_resolver import TunnelResolverBase
from pyfelix.agent.model import Node


def derived_vtep_mac(node: str) -> str:
    digest = bytearray(hashlib.sha256(f"pyfelix-vtep:{node}".encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFC) | 0x02  # unicast, locally administered
    return ":".join(f"{b:02x}" for b in digest)


class VTEPSink(Protocol):
    def on_vtep_update(self, node: str,
                       vtep: proto.VXLANTunnelEndpointUpdate | None) -> None: ...


class VXLANResolver(TunnelResolverBase):
    MODE_FIELD = "vxlan_mode"
    ADDRESS_FIELD = "ipv4VXLANTunnelAddr"
    SALT = "pyfelix-vtep-ip"
    WHAT = "VTEP"

    def __init__(self, sink: VTEPSink) -> None:
        super().__init__()
        self._sink = sink

    def node_entry(self, node: Node) -> tuple[str, ...]:
        return (host_ipv4_of(node), node.ipv4_vxlan_tunnel_addr,
                str(getattr(node, "vxlan_tunnel_mac_addr", "") or ""))

    def send(self, node: str, vtep: proto.VXLANTunnelEndpointUpdate | None) -> None:
        self._sink.on_vtep_update(node, vtep)

    def compute(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        pools = self.tunnel_pools()
        if not pools:
            return {}
        nodes = self.nodes_with_host_ip()
        addresses = self.tunnel_addresses(pools[0], nodes)
        return {
            name: proto.VXLANTunnelEndpointUpdate(
                node=name, mac=nodes[name][2] or derived_vtep_mac(name),
                ipv4_addr=address, parent_device_ip=nodes[name][0])
            for name, address in addresses.items()
        }

    def vteps(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        return dict(sorted(self._sent.items()))

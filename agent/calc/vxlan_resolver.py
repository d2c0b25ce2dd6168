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
- MAC: the Node's `vxlanTunnelMACAddr` when set, else derived from the
  node name (locally administered unicast, first 6 bytes of sha256("pyfelix-vtep:" + name)),
  again the same on every node. Felix generates a random MAC and writes it back to the
  Node; deriving it keeps the datastore read-only for the agent.
- parent device IP: the node's host IPv4 (`host_ipv4_of`: BGP address, else first address).

IPv6 (Felix's dual-stack VXLAN, device `vxlan-v6.calico`): the same, per family. A node has
an IPv6 VTEP while some enabled IPv6 pool has vxlanMode Always/CrossSubnet and the node has
a host IPv6 address (`host_ipv6_of`: `spec.bgp.ipv6Address`, else its first IPv6 address);
its address is `spec.ipv6VXLANTunnelAddr`, else derived in the first IPv6 VXLAN pool (same
rule, same salt); its MAC `vxlanTunnelMACAddrV6` when set, else derived
with the salt "pyfelix-vtep-v6:" (a different MAC from the IPv4 VTEP's, as Felix's two
devices have). One message per node carries both families (`ipv6_addr`, `mac_v6`,
`parent_device_ipv6` beside the IPv4 fields, each family's fields "" when that family has
no VTEP); with no IPv6 VXLAN pool the message is exactly the IPv4-only one.

Invariants: the output depends only on current Nodes and pools; every VTEP sent is
withdrawn (None) when its node, its host IPs or the last VXLAN pool goes.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.passthru import host_ipv4_of, host_ipv6_of
from pyfelix.agent.calc.tunnel_resolver import TunnelResolverBase
from pyfelix.agent.model import Node


def derived_vtep_mac(node: str, version: int = 4) -> str:
    salt = "pyfelix-vtep" if version == 4 else "pyfelix-vtep-v6"
    digest = bytearray(hashlib.sha256(f"{salt}:{node}".encode()).digest()[:6])
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
        # (host IPv4, ipv4VXLANTunnelAddr, MAC, host IPv6, ipv6VXLANTunnelAddr, MAC v6)
        return (host_ipv4_of(node), node.ipv4_vxlan_tunnel_addr, node.vxlan_tunnel_mac_addr,
                host_ipv6_of(node), node.ipv6_vxlan_tunnel_addr,
                node.vxlan_tunnel_mac_addr_v6)

    def send(self, node: str, vtep: proto.VXLANTunnelEndpointUpdate | None) -> None:
        self._sink.on_vtep_update(node, vtep)

    def compute(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        pools4, pools6 = self.tunnel_pools(4), self.tunnel_pools(6)
        v4 = self.tunnel_addresses(pools4[0], self.nodes_with_host_ip(0)) if pools4 else {}
        v6 = (self.tunnel_addresses(pools6[0], self.nodes_with_host_ip(3), explicit_index=4)
              if pools6 else {})
        out = {}
        for name in sorted(v4.keys() | v6.keys()):
            entry = self._nodes[name]
            fields: dict[str, str] = {"mac": "", "ipv4_addr": "", "parent_device_ip": ""}
            if name in v4:
                fields.update(mac=entry[2] or derived_vtep_mac(name), ipv4_addr=v4[name],
                              parent_device_ip=entry[0])
            if name in v6:
                fields.update(mac_v6=entry[5] or derived_vtep_mac(name, 6),
                              ipv6_addr=v6[name], parent_device_ipv6=entry[3])
            out[name] = proto.VXLANTunnelEndpointUpdate(node=name, **fields)
        return out

    def vteps(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        return dict(sorted(self._sent.items()))

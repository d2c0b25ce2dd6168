"""VXLANResolver: every node's VXLAN tunnel endpoint (VTEP), when VXLAN pools exist.

Role (Felix's VXLANResolver). Inputs: Nodes (host IP, `ipv4VXLANTunnelAddr`) and IPPools
(from the all-updates dispatcher). Output on `flush()`: `sink.on_vtep_update(node,
VXLANTunnelEndpointUpdate | None)` for each node whose VTEP changed.

A node has a VTEP while (1) some enabled IPv4 pool has `vxlanMode` Always or CrossSubnet and
(2) the node has a host IPv4 address (the VTEP's parent device IP). Its parts:
- address: the Node's `spec.ipv4VXLANTunnelAddr` when set (Calico's IPAM writes it there);
  otherwise DERIVED, so that every node computes the same answer with no write-back: in the
  first VXLAN pool (by network address), slot = sha256(node name) mod R, address = the
  pool's (size - 2 - slot)-th host, R = min(4096, size / 4) - the top quarter of the pool,
  away from where workload addresses are usually allocated (the lab allocates from the
  bottom). Collisions (with explicit addresses or other derived ones) move to the next slot,
  nodes taken in name order. Easy to get wrong: a derived address can collide with a
  workload that was given an address at the top of the pool; set ipv4VXLANTunnelAddr on
  the Node to rule that out.
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
import ipaddress
import logging
from typing import Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import KIND_IP_POOL, KIND_NODE, CalcUpdate, Dispatcher
from pyfelix.agent.calc.passthru import host_ipv4_of
from pyfelix.agent.model import IPPool, Node
from pyfelix.agent.syncer.api import ResourceKey

log = logging.getLogger(__name__)

VXLAN_MODES = ("Always", "CrossSubnet")
DERIVED_REGION_MAX = 4096


def derived_vtep_mac(node: str) -> str:
    digest = bytearray(hashlib.sha256(f"pyfelix-vtep:{node}".encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFC) | 0x02  # unicast, locally administered
    return ":".join(f"{b:02x}" for b in digest)


def derive_tunnel_addresses(pool: ipaddress.IPv4Network, names: list[str],
                            addresses: dict[str, str], salt: str, what: str) -> None:
    """Give each node of `names` (in that order) an address in the top quarter of `pool`
    (at most DERIVED_REGION_MAX slots) not already in `addresses`, the same on every node:
    slot = sha256(salt:name) mod region, address = the pool's (size - 2 - slot)-th host,
    collisions moving to the next slot. Adds to `addresses`; logs the nodes left without."""
    taken = set(addresses.values())
    size = pool.num_addresses
    region = min(DERIVED_REGION_MAX, size // 4)
    for name in names:
        if region < 1:
            log.error("pool %s is too small to derive a %s address for node %s",
                      pool, what, name)
            continue
        slot = int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:8],
                              "big") % region
        for _ in range(region):
            candidate = str(pool.network_address + (size - 2 - slot))
            if candidate not in taken:
                addresses[name] = candidate
                taken.add(candidate)
                break
            slot = (slot + 1) % region
        else:
            log.error("pool %s: no free %s address left for node %s", pool, what, name)


class VTEPSink(Protocol):
    def on_vtep_update(self, node: str,
                       vtep: proto.VXLANTunnelEndpointUpdate | None) -> None: ...


class VXLANResolver:
    def __init__(self, sink: VTEPSink) -> None:
        self._sink = sink
        self._nodes: dict[str, tuple[str, str, str]] = {}  # name -> (host ip, addr, mac)
        self._pools: dict[ResourceKey, IPPool] = {}
        self._sent: dict[str, proto.VXLANTunnelEndpointUpdate] = {}
        self._dirty = False

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_NODE, self.on_node_update)
        dispatcher.register(KIND_IP_POOL, self.on_pool_update)

    def on_node_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        node = update.value
        if isinstance(node, Node):
            entry = (host_ipv4_of(node), node.ipv4_vxlan_tunnel_addr,
                     str(getattr(node, "vxlan_tunnel_mac_addr", "") or ""))
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

    def vxlan_pools(self) -> list[ipaddress.IPv4Network]:
        nets = []
        for pool in self._pools.values():
            if pool.disabled or pool.vxlan_mode not in VXLAN_MODES:
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
            self._sink.on_vtep_update(node, None)
        for node in sorted(wanted):
            if self._sent.get(node) != wanted[node]:
                self._sent[node] = wanted[node]
                self._sink.on_vtep_update(node, wanted[node])

    def compute(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        pools = self.vxlan_pools()
        if not pools:
            return {}
        nodes = {n: e for n, e in self._nodes.items() if e[0]}  # a parent IP is required
        addresses: dict[str, str] = {}
        for name, (_, explicit, _) in sorted(nodes.items()):
            if explicit:
                if explicit in addresses.values():
                    log.error("Node %s: ipv4VXLANTunnelAddr %s is already another node's",
                              name, explicit)
                addresses[name] = explicit
        derive_tunnel_addresses(pools[0], sorted(n for n in nodes if n not in addresses),
                                addresses, "pyfelix-vtep-ip", "VTEP")
        return {
            name: proto.VXLANTunnelEndpointUpdate(
                node=name, mac=nodes[name][2] or derived_vtep_mac(name),
                ipv4_addr=address, parent_device_ip=nodes[name][0])
            for name, address in addresses.items()
        }

    def vteps(self) -> dict[str, proto.VXLANTunnelEndpointUpdate]:
        return dict(sorted(self._sent.items()))

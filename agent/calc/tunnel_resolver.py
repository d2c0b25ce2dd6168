"""What the IPIP and VXLAN resolvers share: nodes and pools in, one tunnel per node out.

Role: the base of `IPIPResolver` and `VXLANResolver` (calc-graph nodes). Both follow Nodes
and IPPools from the all-updates dispatcher, want a tunnel for every node with a host IPv4
address while an enabled IPv4 pool of their mode (Always or CrossSubnet) exists, give each
node its explicit tunnel address from the Node or one derived in the first such pool, and
send each changed tunnel (or None when it goes) on `flush()`.

Subclasses give: `MODE_FIELD` (the IPPool field, `ipip_mode` / `vxlan_mode`),
`ADDRESS_FIELD` (the Node field's name, for messages), `SALT`/`WHAT` (address derivation),
`node_entry(node)` (a tuple starting (host IPv4, explicit tunnel address)), `compute()`
and `send(node, tunnel | None)`.

Derived addresses (`derive_tunnel_addresses`) are the same on every node, so the agent
never writes the datastore: in the first pool (by network address), slot =
sha256(salt:name) mod R, address = the pool's (size - 2 - slot)-th host, R = min(4096,
size / 4) -- the top quarter of the pool, away from where workload addresses are usually
allocated (the lab allocates from the bottom). Collisions (with explicit addresses or
other derived ones) move to the next slot, nodes taken in name order. Easy to get wrong: a
derived address can collide with a workload given an address at the top of the pool; set
the Node's tunnel address to rule that out.

Invariants: the output depends only on current Nodes and pools; every tunnel sent is
withdrawn (None) when its node, its host IP or the last pool of the mode goes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from typing import Any, ClassVar

from pyfelix.agent.calc.dispatcher import KIND_IP_POOL, KIND_NODE, CalcUpdate, Dispatcher
from pyfelix.agent.model import IPPool, Node
from pyfelix.agent.syncer.api import ResourceKey

log = logging.getLogger(__name__)

TUNNEL_MODES = ("Always", "CrossSubnet")
DERIVED_REGION_MAX = 4096


def derive_tunnel_addresses(pool: ipaddress.IPv4Network | ipaddress.IPv6Network,
                            names: list[str],
                            addresses: dict[str, str], salt: str, what: str) -> None:
    """Give each node of `names` (in that order) an address in the top quarter of `pool`
    (at most DERIVED_REGION_MAX slots) not already in `addresses`, as the module docstring
    says. Adds to `addresses`; logs the nodes left without."""
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


class TunnelResolverBase:
    MODE_FIELD: ClassVar[str]
    ADDRESS_FIELD: ClassVar[str]
    SALT: ClassVar[str]
    WHAT: ClassVar[str]

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[str, ...]] = {}  # name -> (host ip, explicit addr, ...)
        self._pools: dict[ResourceKey, IPPool] = {}
        self._sent: dict[str, Any] = {}
        self._dirty = False

    def node_entry(self, node: Node) -> tuple[str, ...]:
        raise NotImplementedError

    def compute(self) -> dict[str, Any]:
        raise NotImplementedError

    def send(self, node: str, tunnel: Any) -> None:
        raise NotImplementedError

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_NODE, self.on_node_update)
        dispatcher.register(KIND_IP_POOL, self.on_pool_update)

    def on_node_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        node = update.value
        if isinstance(node, Node):
            entry = self.node_entry(node)
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

    def tunnel_pools(self, version: int = 4) -> list[Any]:
        """The enabled pools of this resolver's mode of one IP version, by network
        address (IPv4Network or IPv6Network)."""
        nets = []
        for pool in self._pools.values():
            if pool.disabled or getattr(pool, self.MODE_FIELD) not in TUNNEL_MODES:
                continue
            net = ipaddress.ip_network(pool.cidr, strict=False)
            if net.version == version:
                nets.append(net)
        return sorted(set(nets), key=lambda n: (int(n.network_address), n.prefixlen))

    def nodes_with_host_ip(self, index: int = 0) -> dict[str, tuple[str, ...]]:
        """The nodes whose entry has a host IP at `index` (0: the host IPv4)."""
        return {n: e for n, e in self._nodes.items() if len(e) > index and e[index]}

    def tunnel_addresses(self, pool: ipaddress.IPv4Network | ipaddress.IPv6Network,
                         nodes: dict[str, tuple[str, ...]],
                         explicit_index: int = 1) -> dict[str, str]:
        """Each node's tunnel address: its explicit one (entry[explicit_index]), else
        derived in `pool`."""
        addresses: dict[str, str] = {}
        for name, entry in sorted(nodes.items()):
            explicit = entry[explicit_index]
            if explicit:
                if explicit in addresses.values():
                    log.error("Node %s: %s %s is already another node's", name,
                              self.ADDRESS_FIELD, explicit)
                addresses[name] = explicit
        derive_tunnel_addresses(pool, sorted(n for n in nodes if n not in addresses),
                                addresses, self.SALT, self.WHAT)
        return addresses

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        wanted = self.compute()
        for node in sorted(self._sent.keys() - wanted.keys()):
            del self._sent[node]
            self.send(node, None)
        for node in sorted(wanted):
            if self._sent.get(node) != wanted[node]:
                self._sent[node] = wanted[node]
                self.send(node, wanted[node])

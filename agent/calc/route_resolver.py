"""RouteResolver: the routes this host's dataplane should know, keyed by destination CIDR.

Role (Felix's L3RouteResolver, simplified). Inputs: workload endpoints of every node, Nodes
(host IPs), BlockAffinities (IPAM blocks owned by nodes) and IPPools. Output on `flush()`:
`sink.on_route_update(dst, RouteUpdate | None)` for each destination whose route changed.

Routes contributed:
- each LOCAL workload address -> `local_workload` with the workload's interface;
- each confirmed, not-deleted block affine to ANOTHER node -> `remote_workload` via that
  node (`dst_node_ip` = its host IP); blocks affine to this host are not routed here (the
  local /32s are, and BIRD blackholes the block);
- each address of a workload on another node that no block of that node covers ->
  `remote_workload` /32 (clusters without IPAM blocks in the datastore);
- every node's host IP -> `local_host` (this host) / `remote_host` (others).
`ip_pool_type` ("vxlan" / "ipip" / "") and `nat_outgoing` come from the IP pool containing
the destination.

When several sources want the same destination (a pod moving between nodes, say), one wins:
routes of this host first, then by type (workload before host), then node name. The result
depends only on current state, whatever the order of inputs.

Invariants: every destination sent is withdrawn (`None`) when its last source goes;
recomputation is per source (one endpoint, or one node's blocks and host route), so an
endpoint update never rescans a whole node.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Protocol

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import (
    KIND_BLOCK_AFFINITY,
    KIND_IP_POOL,
    KIND_NODE,
    KIND_WORKLOAD_ENDPOINT,
    CalcUpdate,
    Dispatcher,
)
from pyfelix.agent.calc.passthru import host_ipv4_of
from pyfelix.agent.calc.set_index import discard_member
from pyfelix.agent.model import BlockAffinity, IPPool, WorkloadEndpoint
from pyfelix.agent.syncer.api import ResourceKey

LOCAL_WORKLOAD = "local_workload"
REMOTE_WORKLOAD = "remote_workload"
LOCAL_HOST = "local_host"
REMOTE_HOST = "remote_host"
_TYPE_RANK = {LOCAL_WORKLOAD: 0, REMOTE_WORKLOAD: 1, LOCAL_HOST: 2, REMOTE_HOST: 3}

Source = tuple[str, Any]


class Network(tuple):
    """A CIDR as (version, network integer, prefix length, canonical text): containment is
    integer arithmetic (`ipaddress` objects are too slow for 10,000s of endpoints)."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> Network:
        address, _, length = text.partition("/")
        if ":" not in address:
            a, b, c, d = (int(part) for part in address.split("."))
            prefix = int(length) if length else 32
            host = (a << 24) | (b << 16) | (c << 8) | d
            value = host >> (32 - prefix) << (32 - prefix)
            if value != host:  # host bits set: let ipaddress render the network
                return cls((4, value, prefix, str(ipaddress.ip_network(text, strict=False))))
            canonical = f"{a}.{b}.{c}.{d}/{prefix}"
            # the caller's text when it is already canonical: one string, not two
            return cls((4, value, prefix, text if text == canonical else canonical))
        net = ipaddress.ip_network(text, strict=False)
        return cls((6, int(net.network_address), net.prefixlen, str(net)))

    def within(self, outer: Network) -> bool:
        version, value, prefix, _ = self
        if version != outer[0] or prefix < outer[2]:
            return False
        shift = (32 if version == 4 else 128) - outer[2]
        return value >> shift == outer[1] >> shift

    def __str__(self) -> str:
        return self[3]


class RouteSink(Protocol):
    def on_route_update(self, dst: str, route: proto.RouteUpdate | None) -> None: ...


class RouteResolver:
    def __init__(self, hostname: str, sink: RouteSink) -> None:
        self.hostname = hostname
        self._sink = sink
        # the endpoints themselves (held by the validator anyway); their ip_networks are
        # parsed when their routes are computed (a Network per endpoint held here, and a
        # tuple of what is needed, cost ~280 bytes)
        self._weps: dict[ResourceKey, WorkloadEndpoint] = {}
        self._weps_of_node: dict[str, set[ResourceKey]] = {}
        self._blocks: dict[ResourceKey, tuple[str, Network]] = {}
        self._blocks_of_node: dict[str, set[ResourceKey]] = {}
        self._host_ips: dict[str, str] = {}
        self._pools: dict[ResourceKey, tuple[Network, IPPool]] = {}
        # a source's routes by destination; a source with ONE route (nearly every endpoint)
        # keeps just that RouteUpdate (its dst is the key): a dict costs ~180 bytes more
        self._contrib: dict[Source, dict[str, proto.RouteUpdate] | proto.RouteUpdate] = {}
        self._sources_of_dst: dict[str, Source | set[Source]] = {}  # see _sources
        self._sent: dict[str, proto.RouteUpdate] = {}
        self._dirty_sources: set[Source] = set()
        self._dirty_dsts: set[str] = set()

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_WORKLOAD_ENDPOINT, self.on_workload_update)
        dispatcher.register(KIND_NODE, self.on_node_update)
        dispatcher.register(KIND_BLOCK_AFFINITY, self.on_block_update)
        dispatcher.register(KIND_IP_POOL, self.on_pool_update)

    # --- inputs -------------------------------------------------------------------------

    def on_workload_update(self, update: CalcUpdate) -> None:
        key, wep = update.key, update.value
        old = self._weps.pop(key, None)
        if old is not None:
            discard_member(self._weps_of_node, old.node, key)
        if isinstance(wep, WorkloadEndpoint):
            self._weps[key] = wep
            self._weps_of_node.setdefault(wep.node, set()).add(key)
        self._dirty_sources.add(("wep", key))

    def on_node_update(self, update: CalcUpdate) -> None:
        node = update.key.name
        address = host_ipv4_of(update.value) if update.value is not None else ""
        if self._host_ips.get(node, "") == address:
            return
        if address:
            self._host_ips[node] = address
        else:
            self._host_ips.pop(node, None)
        self._mark_node_dirty(node)

    def on_block_update(self, update: CalcUpdate) -> None:
        key, block = update.key, update.value
        self._dirty_sources.add(("block", key))
        old = self._blocks.pop(key, None)
        if old is not None:
            discard_member(self._blocks_of_node, old[0], key)
            self._mark_node_dirty(old[0])
        if isinstance(block, BlockAffinity) and block.state == "confirmed" and not block.deleted:
            self._blocks[key] = (block.node, Network.parse(block.cidr))
            self._blocks_of_node.setdefault(block.node, set()).add(key)
            self._mark_node_dirty(block.node)

    def on_pool_update(self, update: CalcUpdate) -> None:
        if update.value is None:
            self._pools.pop(update.key, None)
        else:
            self._pools[update.key] = (Network.parse(update.value.cidr), update.value)
        for node in set(self._weps_of_node) | set(self._blocks_of_node) | set(self._host_ips):
            self._mark_node_dirty(node)

    # --- output -------------------------------------------------------------------------

    def flush(self) -> None:
        sources, self._dirty_sources = self._dirty_sources, set()
        for source in sources:
            self._set_contribution(source, self._routes_of(source))
        dsts, self._dirty_dsts = self._dirty_dsts, set()
        for dst in sorted(dsts):
            best = self._best_route(dst)
            if best is None:
                if self._sent.pop(dst, None) is not None:
                    self._sink.on_route_update(dst, None)
            elif self._sent.get(dst) != best:
                self._sent[dst] = best
                self._sink.on_route_update(dst, best)

    def routes(self) -> dict[str, proto.RouteUpdate]:
        return dict(sorted(self._sent.items()))

    # --- internals ----------------------------------------------------------------------

    def _mark_node_dirty(self, node: str) -> None:
        self._dirty_sources.add(("host", node))
        self._dirty_sources.update(("block", k) for k in self._blocks_of_node.get(node, ()))
        self._dirty_sources.update(("wep", k) for k in self._weps_of_node.get(node, ()))

    def _routes_of(self, source: Source) -> dict[str, proto.RouteUpdate]:
        kind, ident = source
        if kind == "wep":
            entry = self._weps.get(ident)
            if entry is None:
                return {}
            node, iface = entry.node, entry.interface_name
            nets = [Network.parse(n) for n in entry.ip_networks]
            if node == self.hostname:
                return {str(n): self._route(n, LOCAL_WORKLOAD, node, iface) for n in nets}
            blocks = [self._blocks[b][1] for b in self._blocks_of_node.get(node, ())]
            return {str(n): self._route(n, REMOTE_WORKLOAD, node) for n in nets
                    if not any(n.within(b) for b in blocks)}
        if kind == "block":
            block = self._blocks.get(ident)
            if block is None or block[0] == self.hostname:
                return {}
            return {str(block[1]): self._route(block[1], REMOTE_WORKLOAD, block[0])}
        address = self._host_ips.get(ident)
        if not address:
            return {}
        net = Network.parse(address)
        kind = LOCAL_HOST if ident == self.hostname else REMOTE_HOST
        return {str(net): self._route(net, kind, ident)}

    def _route(self, dst: Network, route_type: str, node: str,
               iface: str = "") -> proto.RouteUpdate:
        pool = self._pool_for(dst)
        pool_type = ""
        if pool is not None and route_type in (LOCAL_WORKLOAD, REMOTE_WORKLOAD):
            if pool.vxlan_mode != "Never":
                pool_type = "vxlan"
            elif pool.ipip_mode != "Never":
                pool_type = "ipip"
        return proto.RouteUpdate(
            dst=str(dst), type=route_type, dst_node=node,
            dst_node_ip=self._host_ips.get(node, ""), local_workload_iface=iface,
            ip_pool_type=pool_type,
            nat_outgoing=bool(pool and pool.nat_outgoing and route_type != LOCAL_HOST
                              and route_type != REMOTE_HOST))

    def _pool_for(self, dst: Network) -> IPPool | None:
        found = [(k, p) for k, (net, p) in self._pools.items() if dst.within(net)]
        return min(found)[1] if found else None

    def _contribution(self, source: Source) -> dict[str, proto.RouteUpdate]:
        held = self._contrib.get(source)
        if held is None:
            return {}
        return {held.dst: held} if isinstance(held, proto.RouteUpdate) else held

    def _set_contribution(self, source: Source, routes: dict[str, proto.RouteUpdate]) -> None:
        old = self._contribution(source)
        if routes:
            self._contrib[source] = routes if len(routes) != 1 else next(iter(routes.values()))
        else:
            self._contrib.pop(source, None)
        for dst in old.keys() | routes.keys():
            before, after = old.get(dst), routes.get(dst)
            if before == after:
                continue
            if after is None:
                self._remove_source(dst, source)
            elif before is None:
                self._add_source(dst, source)
            self._dirty_dsts.add(dst)

    # _sources_of_dst: nearly every destination has ONE source (its endpoint): kept as that
    # source itself, a set only when there are several (a set costs ~200 bytes)

    def _sources(self, dst: str) -> tuple[Source, ...] | set[Source]:
        held = self._sources_of_dst.get(dst)
        if held is None:
            return ()
        return held if isinstance(held, set) else (held,)

    def _add_source(self, dst: str, source: Source) -> None:
        held = self._sources_of_dst.get(dst)
        if held is None:
            self._sources_of_dst[dst] = source
        elif isinstance(held, set):
            held.add(source)
        elif held != source:
            self._sources_of_dst[dst] = {held, source}

    def _remove_source(self, dst: str, source: Source) -> None:
        held = self._sources_of_dst.get(dst)
        if isinstance(held, set):
            held.discard(source)
            if len(held) == 1:
                self._sources_of_dst[dst] = next(iter(held))
        elif held == source:
            del self._sources_of_dst[dst]

    def _best_route(self, dst: str) -> proto.RouteUpdate | None:
        candidates = [self._contribution(s)[dst] for s in self._sources(dst)]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        return min(candidates, key=lambda r: (r.dst_node != self.hostname,
                                              _TYPE_RANK[r.type], r.dst_node, repr(r)))

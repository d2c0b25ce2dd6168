"""The `routes` trie's contents: what the tc programs know about a destination.

Role: pure Python, no kernel. `RouteInputs` folds the calc graph's routes, IP pools and
host metadata (`apply(msg)`, True when something it keeps changed) plus this host's own
addresses (set by `BpfRouteManager` from the interface monitor); `compile_routes()` turns
them into `{key: value}` entries of agent.bpf.maps.routes:

- each route (`RouteUpdate`): LOCAL_WORKLOAD (with the workload interface's ifindex),
  REMOTE_WORKLOAD or REMOTE_HOST (with the owning node's IP as next hop), plus
  TUNNEL_VXLAN / TUNNEL_IPIP and NAT_OUTGOING from its pool;
- each of this host's addresses (not on workload interfaces) and this host's HostMetadata
  IP: LOCAL_HOST (the programs apply DefaultEndpointToHostAction to flows towards them);
  other hosts' IPs: REMOTE_HOST;
- each enabled IP pool: IN_POOL (+ NAT_OUTGOING), inherited by every entry inside it.
Both families (the trie is keyed by family).

Not policy: the routes trie has its own manager (`BpfRouteManager`), so a policy change
never recomputes it and a route change never recompiles policy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import routes as routes_map
from pyfelix.agent.bpf.maps.routes import RouteFlags

_INPUTS = (proto.RouteUpdate, proto.RouteRemove, proto.IPAMPoolUpdate, proto.IPAMPoolRemove,
           proto.HostMetadataUpdate, proto.HostMetadataRemove)


@dataclass
class RouteInputs:
    hostname: str = ""
    routes: dict[str, proto.RouteUpdate] = field(default_factory=dict)
    pools: dict[str, proto.IPAMPoolUpdate] = field(default_factory=dict)
    host_ips: dict[str, str] = field(default_factory=dict)  # hostname -> IPv4
    # this host's own addresses by interface (workload interfaces excluded)
    local_addrs: dict[str, frozenset[str]] = field(default_factory=dict)

    def apply(self, msg: Any) -> bool:
        """Fold one agent.proto message in; True when it is one of ours."""
        if not isinstance(msg, _INPUTS):
            return False
        match msg:
            case proto.RouteUpdate():
                self.routes[msg.dst] = msg
            case proto.RouteRemove():
                self.routes.pop(msg.dst, None)
            case proto.IPAMPoolUpdate():
                self.pools[msg.id] = msg
            case proto.IPAMPoolRemove():
                self.pools.pop(msg.id, None)
            case proto.HostMetadataUpdate():
                self.host_ips[msg.hostname] = msg.ipv4_addr
            case proto.HostMetadataRemove():
                self.host_ips.pop(msg.hostname, None)
        return True


def compile_routes(state: RouteInputs, ifindexes: Mapping[str, int],
                   problems: list[str]) -> dict[bytes, bytes]:
    """The `routes` trie's desired entries; a route, pool or address that does not parse is
    left out and reported in `problems` (named: route, field)."""
    entries: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, tuple[int, int, str]] = {}
    type_flags = {
        "local_workload": RouteFlags.LOCAL_WORKLOAD,
        "remote_workload": RouteFlags.REMOTE_WORKLOAD,
        "remote_host": RouteFlags.REMOTE_HOST,
        "local_host": RouteFlags.LOCAL_HOST,
    }

    def v4(text: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        try:
            return ipaddress.ip_network(text, strict=False)
        except ValueError as e:
            problems.append(f"{what}: bad CIDR {text!r}: {e}")
            return None

    for dst in sorted(state.routes):
        r = state.routes[dst]
        net = v4(r.dst, f"route {dst}: field dst")
        if net is None:
            continue
        if r.type not in type_flags:
            problems.append(f"route {dst}: field type: unknown type {r.type!r}")
            continue
        flags = int(type_flags[r.type])
        if r.ip_pool_type == "vxlan":
            flags |= RouteFlags.TUNNEL_VXLAN
        elif r.ip_pool_type == "ipip":
            flags |= RouteFlags.TUNNEL_IPIP
        if r.nat_outgoing:
            flags |= RouteFlags.NAT_OUTGOING
        ifindex = ifindexes.get(r.local_workload_iface, 0) if r.local_workload_iface else 0
        next_hop = r.dst_node_ip if r.type.startswith("remote") else ""
        if next_hop:
            try:
                ipaddress.ip_address(next_hop)
            except ValueError:
                next_hop = ""
        entries[net] = (flags, ifindex, next_hop)
    for iface, addrs in sorted(state.local_addrs.items()):
        for addr in sorted(addrs):
            net = v4(addr.split("/")[0], f"interface {iface}: address")
            if net is not None:
                old = entries.get(net, (0, 0, ""))
                entries[net] = (old[0] | RouteFlags.LOCAL_HOST, old[1], old[2])
    for hostname, ip in sorted(state.host_ips.items()):
        net = v4(ip, f"host {hostname}: field ipv4_addr") if ip else None
        if net is None:
            continue
        local = hostname == state.hostname
        flags = RouteFlags.LOCAL_HOST if local else RouteFlags.REMOTE_HOST
        old = entries.get(net, (0, 0, ""))
        entries[net] = (old[0] | flags, old[1], old[2] or ("" if local else ip))
    pools = []
    for pid in sorted(state.pools):
        p = state.pools[pid]
        net = v4(p.cidr, f"IP pool {pid}: field cidr")
        if net is None or p.disabled:
            continue
        pflags = RouteFlags.IN_POOL | (RouteFlags.NAT_OUTGOING if p.masquerade else 0)
        pools.append((net, int(pflags)))
        old = entries.get(net, (0, 0, ""))
        entries[net] = (old[0] | pflags, old[1], old[2])
    out = {}
    for net, (flags, ifindex, nh) in entries.items():
        for pool, pflags in pools:
            if net.version == pool.version and net.subnet_of(pool):  # type: ignore[arg-type]
                flags |= pflags
        out[routes_map.encode_key(net)] = routes_map.encode_value(flags, ifindex, nh)
    return out

"""Benchmark `map-sync`: how fast the BPF policy manager writes IP-set members into the real
kernel trie, through its real apply path (compile, diff against the map, write).

Setup: real kernel maps with the pinned maps' exact layouts, created with the raw bpf()
syscall (agent.bpf.syscall.map_create; no BCC build is needed to write maps, and nothing is
pinned: the maps die with their fds), and one `BpfPolicyManager` over them. One policy uses
the set, one endpoint (ifindex given, nothing attached) uses the policy. No namespace, no
interface, no program.

Figures (median of `repeats` samples, with _min/_max):
- `seconds_100k_members`: `apply()` after an IPSetUpdate of 100,000 new members into an
  empty trie (compile + diff + 100,000 LPM updates: the trie has no batch update). Target
  <= 2 s. Between samples the set is removed (untimed).
- `seconds_1k_delta`: `apply()` after an IPSetDeltaUpdate adding 500 and removing 500
  members of the 100,000 (what a steady cluster does).
- `seconds_100k_removal`: `apply()` after the IPSetRemove of the 100,000-member set.
- `seconds_noop_apply`: `apply()` after the same state again (diff finds nothing to write).
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any

from pyfelix.agent import proto as p
from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark

MEMBERS = 100_000
SET_ID = "s:map-sync-bench"
IFACE = "calibench0"
IFINDEX = 7

MAP_SIZES = {"ipsets": 1 << 18, "rules": 4096, "endpoints": 64, "ids": 8192,
             "rule_counters": 1024, "ep_counters": 64, "routes": 1024, "untracked": 1024,
             "conntrack": 1024}


def kernel_maps(sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """Unpinned kernel maps with every pinned map's layout (close them with close_maps)."""
    from pyfelix.agent.bpf import syscall
    from pyfelix.agent.bpf.maps import ALL_MAPS
    from pyfelix.agent.bpf.maps.base import BpfMap

    sizes = {**MAP_SIZES, **(sizes or {})}
    maps = {}
    try:
        for params in ALL_MAPS:
            size = sizes.get(params.name, params.max_entries)
            fd = syscall.map_create(int(params.map_type), params.key_size, params.value_size,
                                    size, params.flags, name=params.name)
            maps[params.name] = BpfMap(params, fd, max_entries=size)
    except BaseException:
        close_maps(maps)
        raise
    return maps


def close_maps(maps: dict[str, Any]) -> None:
    for m in maps.values():
        m.close()


def members(n: int, base: str = "11.0.0.0") -> frozenset[str]:
    start = int(ipaddress.IPv4Address(base))
    return frozenset(f"{ipaddress.IPv4Address(start + i)}/32" for i in range(n))


def base_messages() -> list[object]:
    return [
        p.ActiveProfileUpdate("allow", p.Profile(inbound_rules=(p.Rule("allow"),),
                                                 outbound_rules=(p.Rule("allow"),))),
        p.ActivePolicyUpdate(p.PolicyID("default", "bench"), p.Policy(inbound_rules=(
            p.Rule("allow", protocol=6, src_ip_set_ids=(SET_ID,)),))),
        p.WorkloadEndpointUpdate(p.WorkloadEndpointID("k8s", "bench/pod", "eth0"),
                                 p.WorkloadEndpoint("active", IFACE, profile_ids=("allow",),
                                                    tiers=(p.TierInfo("default", (
                                                        "bench",)),))),
    ]


def timed_apply(manager: Any, msgs: list[object]) -> float:
    for msg in msgs:
        manager.on_update(msg)
    started = time.perf_counter()
    manager.apply()
    return time.perf_counter() - started


@benchmark("map-sync", description="IP-set members into the kernel trie via the manager")
def map_sync(ctx: BenchContext) -> Figures:
    from pyfelix.agent.dataplane.managers.bpf_policy import BpfPolicyManager

    if os.geteuid() != 0:
        raise PermissionError("map-sync needs root (BPF maps)")
    repeats = max(1, ctx.settings.repeats)
    maps = kernel_maps()
    try:
        manager = BpfPolicyManager(maps, list_interfaces=lambda: ({IFACE: IFINDEX}, {}))
        timed_apply(manager, [*base_messages(), p.IPSetUpdate(SET_ID, "net", frozenset()),
                              p.InSync()])
        full = members(MEMBERS)
        adds, deltas, removals, noops = [], [], [], []
        for i in range(repeats):
            adds.append(timed_apply(manager, [p.IPSetUpdate(SET_ID, "net", full)]))
            if manager.problems():
                raise RuntimeError(f"map-sync: compile problems {manager.problems()[:3]}")
            if len(maps["ipsets"].items()) != MEMBERS:
                raise RuntimeError("map-sync: the trie does not hold every member")
            noops.append(timed_apply(manager, [p.IPSetUpdate(SET_ID, "net", full)]))
            extra = members(500, base=f"12.{i}.0.0")
            gone = frozenset(sorted(full)[:500])
            deltas.append(timed_apply(manager, [p.IPSetDeltaUpdate(SET_ID, added=extra,
                                                                   removed=gone)]))
            removals.append(timed_apply(manager, [p.IPSetUpdate(SET_ID, "net", frozenset())]))
    finally:
        close_maps(maps)
    figures: Figures = {}
    figures.update(Stat.of(adds).figures("seconds_100k_members"))
    figures.update(Stat.of(deltas).figures("seconds_1k_delta"))
    figures.update(Stat.of(removals).figures("seconds_100k_removal"))
    figures.update(Stat.of(noops).figures("seconds_noop_apply"))
    figures["members"] = MEMBERS
    return figures

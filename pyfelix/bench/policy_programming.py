"""Benchmark `policy-programming`: installing and replacing a 10,000-rule policy on a node
with 100 endpoints, through the BPF policy manager's real apply path (compile, classifier
build, diff, batched map writes) into real kernel maps; and the raw map write rates.

Setup: unpinned kernel maps with the pinned maps' layouts (bench.map_sync.kernel_maps:
raw bpf() syscalls, no BCC build, nothing attached), one `BpfPolicyManager` over them, 100
endpoints (ifindexes given, no interfaces) that all use one tier with the policy, and 10 IP
sets of 100 members. Rule i: `allow tcp dport <1000 + i % 500> from <set i % 10>`.

Figures (median of `repeats` samples, with _min/_max):
- `install_seconds`: `apply()` after the 10,000-rule policy replaces a 1-rule one on the
  running node (the endpoints, sets and InSync were applied before, untimed: that first
  apply also reads every map, as an agent's start does). Target < 1 s.
- `replace_seconds`: `apply()` after the policy is replaced by another 10,000 rules
  (dports shifted): new chain and classifier written, endpoints repointed, old ones deleted.
  Target < 1 s.
- `rules`, `endpoints`, `classifier_words`: what the policy compiled to.
- `writes_per_second_array_batch`: 10,000 `rules` records (244 B) in one batched update;
  `writes_per_second_hash_batch`: 10,000 `cls_l4` entries (hash, batched);
  `writes_per_second_lpm`: 10,000 `cls_tries` entries (the trie has no batch update: one
  syscall each). Target >= 100,000/s where the kernel batches.
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any

from pyfelix.agent import proto as p
from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark

RULES = 10_000
ENDPOINTS = 100
SETS = 10
MAP_SIZES = {"rules": 65536, "ids": 65536, "rule_counters": 65536, "endpoints": 1024,
             "ep_counters": 1024, "ipsets": 1 << 16, "cls_words": 1 << 20,
             "cls_tries": 1 << 18, "cls_l4": 1 << 16, "routes": 1024, "untracked": 1024,
             "conntrack": 1024}


def _policy(shift: int, count: int = RULES) -> p.ActivePolicyUpdate:
    rules = tuple(p.Rule("allow", protocol=6,
                         dst_ports=(p.PortRange(1000 + shift + i % 500, 1000 + shift + i % 500),),
                         src_ip_set_ids=(f"s:bench-{i % SETS}",))
                  for i in range(count))
    return p.ActivePolicyUpdate(p.PolicyID("default", "bench"), p.Policy(inbound_rules=rules))


def _messages() -> list[object]:
    msgs: list[object] = []
    for s in range(SETS):
        base = int(ipaddress.IPv4Address("11.0.0.0")) + s * 256
        msgs.append(p.IPSetUpdate(f"s:bench-{s}", "net", frozenset(
            f"{ipaddress.IPv4Address(base + i)}/32" for i in range(100))))
    msgs.append(_policy(0, count=1))
    for e in range(ENDPOINTS):
        msgs.append(p.WorkloadEndpointUpdate(
            p.WorkloadEndpointID("k8s", f"bench/pod{e}", "eth0"),
            p.WorkloadEndpoint("active", f"calibench{e}", ipv4_nets=(f"10.65.{e}.1/32",),
                               tiers=(p.TierInfo("default", ("bench",)),))))
    return msgs


def _timed(manager: Any, msgs: list[object]) -> float:
    for msg in msgs:
        manager.on_update(msg)
    started = time.perf_counter()
    manager.apply()
    return time.perf_counter() - started


def _rate(m: Any, items: list[tuple[bytes, bytes]]) -> float:
    started = time.perf_counter()
    m.update_many(items)
    return len(items) / (time.perf_counter() - started)


def write_rates(maps: dict[str, Any]) -> dict[str, float]:
    """Raw update rates from Python (entries per second) for an array, a hash, a trie."""
    from pyfelix.agent.bpf.maps import cls_l4, cls_tries, rules
    from pyfelix.agent.bpf.maps.rules import Action, RuleRecord

    record = rules.encode(RuleRecord(Action.ALLOW, protocol=6))
    arr = [(rules.encode_index(i), record) for i in range(RULES)]
    hsh = [(cls_l4.encode_key(i + 1, 6, 1, 0, 0, 0), cls_l4.encode_value(i)) for i in range(RULES)]
    lpm = [(cls_tries.encode_key(1, 0, 0, 0, (10 << 24) + i, 32), cls_tries.encode_value(i))
           for i in range(RULES)]
    out = {"writes_per_second_array_batch": _rate(maps["rules"], arr),
           "writes_per_second_hash_batch": _rate(maps["cls_l4"], hsh),
           "writes_per_second_lpm": _rate(maps["cls_tries"], lpm)}
    maps["cls_l4"].delete_many([k for k, _ in hsh])
    maps["cls_tries"].delete_many([k for k, _ in lpm])
    return out


@benchmark("policy-programming",
           description="install/replace a 10,000-rule policy on 100 endpoints; map write rates")
def policy_programming(ctx: BenchContext) -> Figures:
    from pyfelix.agent.dataplane.managers.bpf_policy import BpfPolicyManager
    from pyfelix.bench.map_sync import close_maps, kernel_maps

    if os.geteuid() != 0:
        raise PermissionError("policy-programming needs root (BPF maps)")
    repeats = max(1, ctx.settings.repeats)
    ifaces = {f"calibench{e}": 100 + e for e in range(ENDPOINTS)}
    installs, replaces, rates = [], [], []
    figures: Figures = {}
    for i in range(repeats):
        maps = kernel_maps(MAP_SIZES)
        try:
            manager = BpfPolicyManager(maps, list_interfaces=lambda: (ifaces, {}))
            _timed(manager, [*_messages(), p.InSync()])
            installs.append(_timed(manager, [_policy(0)]))
            if manager.problems():
                raise RuntimeError(f"policy-programming: problems {manager.problems()[:3]}")
            compiled = manager.last_compiled
            assert compiled is not None
            if i == 0:
                figures["rules"] = sum(len(c) for c in compiled.chains_in_use)
                figures["endpoints"] = len(compiled.endpoints)
                figures["classifier_words"] = sum(ix.size
                                                  for ix in compiled.cls_indexes.values())
            replaces.append(_timed(manager, [_policy(600 + i)]))
            if manager.problems():
                raise RuntimeError(f"policy-programming: problems {manager.problems()[:3]}")
            rates.append(write_rates(maps))
        finally:
            close_maps(maps)
    figures.update(Stat.of(installs).figures("install_seconds"))
    figures.update(Stat.of(replaces).figures("replace_seconds"))
    for key in rates[0]:
        figures.update(Stat.of([r[key] for r in rates]).figures(key))
    return figures

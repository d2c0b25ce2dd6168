"""BPF policy manager: calc-graph messages -> PolicyCompiler -> the pinned maps, by difference.

Role: keeps the policy maps the tc/XDP programs read (ids, ipsets, rules, wep_sources,
endpoints, untracked, config) equal to what the calc graph's messages describe. Programs
are never recompiled: policy is data (bpf/README.md). The routes trie is not policy:
`BpfRouteManager` (bpf_routes.py) keeps it.

Inputs (`on_update`, cheap, no kernel I/O): IP sets (update/delta/remove), active policies
and profiles, workload and host endpoints, ConfigUpdate (over the agent's own
DefaultEndpointToHostAction and BPFEnforceRPF), InSync, and the interface monitor's
InterfaceUpdate / InterfaceAddrsUpdate (ifindexes for endpoints; addresses resolve host
endpoints known by their expected IPs).

`apply()`:
1. when a resync is due (the first apply, `request_resync()`, after a failure): read every
   map's ACTUAL contents from the kernel (batched), and list the interfaces. On the first
   apply the compiler is built from the pinned state (`AdoptedState.from_maps`): a restarted
   agent keeps every id, chain placement and entry it finds, so the programs (still attached)
   see no change unless the datastore changed.
2. compile the whole desired state (the compiler caches per policy/IP set: a change costs
   little) and write the DIFFERENCE against the mirror of each map, in make-before-break
   order: ids adds -> ipsets adds -> counter slots of new ids zeroed -> rules (chains in new
   regions) -> classifier instances whole (cls_words blocks, cls_l4 and cls_tries entries;
   a write that does not fit raises before any pointer moves) -> cls_chains pointers ->
   wep_sources adds (the sources each endpoint may send from) -> endpoints
   adds/changes (the hash, then its `ep_by_ifindex` array mirror:
   agent.bpf.maps.ep_by_ifindex) -> untracked, config adds/changes; then, ONLY
   after InSync: endpoints deletes (mirror slots cleared first, then the hash entries) ->
   wep_sources/untracked deletes -> stale classifier entries and cls_chains slots ->
   ipsets deletes -> ids deletes, and
   `PolicyCompiler.commit()` (frees ids and regions, which must not happen while stale
   entries may still point at them). Hash maps are written with batch syscalls.
   Applying the same state twice writes nothing.

Map full: never a silent drop and never the whole dataplane's problem.
- ipsets (the trie): the sets whose members did not fit are marked unavailable and the
  state recompiled with them left out: every chain that references one becomes DENY (fail
  closed, with a problem naming endpoint, policy and set); other endpoints are unaffected.
  An unavailable set is retried at a resync or once the trie has room for it.
- rules (the array): the compiler gives the endpoint that does not fit a DENY chain.
- cls_words / cls_tries / cls_l4 (the classifier): the compiler leaves the endpoint
  direction on the chain it had at the last commit (the previous policy stays in force),
  or gives it a DENY chain if it had none.
- endpoints (the hash): that endpoint gets no entry, so the programs drop its traffic.
- ids / untracked: the entry is left out; wep_sources: that source stays dropped.
Each counts `pyfelix_bpf_map_full_errors_total{map}` and logs an error; apply() succeeds
(retrying would not make room; a resync retries).

Other write errors raise: the mirrors are re-read at the next apply, which retries.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf.compiler import (
    AdoptedState,
    CompiledDataplane,
    CompileError,
    IPSetKeys,
    PolicyCompiler,
    PolicyState,
)
from pyfelix.agent.bpf.maps import cls_chains as cls_chains_map
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.maps import denied_sources as denied_sources_map
from pyfelix.agent.bpf.maps import ep_by_ifindex as ep_array
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps.base import MapFullError
from pyfelix.agent.bpf.maps.ids import IdKind
from pyfelix.agent.bpf.maps.rules import max_chain_records
from pyfelix.agent.dataplane.events import InterfaceAddrsUpdate, InterfaceUpdate
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics
from pyfelix.agent.dataplane.managers.bpf_ifaces import InterfaceTable, Lister
from pyfelix.agent.dataplane.managers.bpf_mirror import MapMirror
from pyfelix.agent.dataplane.managers.hostips import resolve_host_endpoints

log = logging.getLogger(__name__)

SYNCED_MAPS = ("ids", "ipsets", "rules", "wep_sources", "endpoints", "ep_by_ifindex",
               "untracked", "config", "cls_chains", "cls_l4", "cls_tries")
CLS_WORDS = "cls_words"  # written block by block (new instances), never read back whole
COUNTER_MAPS = ("rule_counters", "ep_counters", "ep_spoofed")
_STATE_MESSAGES = (
    proto.IPSetUpdate, proto.IPSetDeltaUpdate, proto.IPSetRemove,
    proto.ActivePolicyUpdate, proto.ActivePolicyRemove,
    proto.ActiveProfileUpdate, proto.ActiveProfileRemove,
    proto.WorkloadEndpointUpdate, proto.WorkloadEndpointRemove,
    proto.HostEndpointUpdate, proto.HostEndpointRemove,
    # tunnels in use: the config map's drops of VXLAN/IPIP sent by workloads
    proto.VXLANTunnelEndpointUpdate, proto.VXLANTunnelEndpointRemove,
    proto.IPIPTunnelUpdate, proto.IPIPTunnelRemove,
)
_SET_ID = struct.Struct("=I")  # ipset key: prefixlen u32, then set_id u32


class IPSetMirror:
    """The IP-set trie as this manager knows it, BY SET: set number -> keys in the kernel,
    and the compiled generation each set is known to equal (agent.bpf.compiler.IPSetKeys).
    An unchanged set costs nothing per apply; a set changed by a delta from the generation
    the kernel holds costs the delta; anything else a set difference of that one set."""

    def __init__(self, bpf_map: Any) -> None:
        self.map = bpf_map
        self.by_set: dict[int, set[bytes]] | None = None
        self.applied: dict[int, int] = {}  # set number -> generation the kernel equals
        self.count = 0

    def reload(self) -> None:
        """Read the trie (keys only: every member has the same value)."""
        by_set: dict[int, set[bytes]] = {}
        count = 0
        for key in self.map.iter_keys():
            by_set.setdefault(_SET_ID.unpack_from(key, 4)[0], set()).add(key)
            count += 1
        self.by_set, self.count, self.applied = by_set, count, {}

    def plan(self, groups: Mapping[int, IPSetKeys]
             ) -> dict[int, tuple[IPSetKeys, list[bytes], list[bytes]]]:
        """number -> (group, keys to add, keys to remove) for every set that may differ."""
        assert self.by_set is not None
        out = {}
        for number, group in groups.items():
            applied = self.applied.get(number)
            if applied == group.generation:
                continue
            if applied is not None and group.base_generation == applied:
                out[number] = (group, list(group.added), list(group.removed))
                continue
            have = self.by_set.get(number, set())
            want = group.keys.keys()
            out[number] = (group, [k for k in want if k not in have],
                           [k for k in have if k not in group.keys])
        return out

    def write(self, number: int, keys: list[bytes]) -> bool:
        """Add keys of one set; False if the trie ran full (what fit stays recorded)."""
        assert self.by_set is not None
        have = self.by_set.setdefault(number, set())
        value = ipsets_map.VALUE
        try:
            self.map.update_many([(key, value) for key in keys])
        except MapFullError:
            # what fit is unknown: write one by one (idempotent) to find out
            for i, key in enumerate(keys):
                try:
                    self.map.update(key, value)
                except MapFullError:
                    metrics.MAP_WRITES.labels("ipsets", "update").inc(i)
                    return False
                self._record(have, key)
        else:
            for key in keys:
                self._record(have, key)
        metrics.MAP_WRITES.labels("ipsets", "update").inc(len(keys))
        return True

    def _record(self, have: set[bytes], key: bytes) -> None:
        if key not in have:
            have.add(key)
            self.count += 1

    def delete(self, number: int, keys: Iterable[bytes]) -> None:
        assert self.by_set is not None
        todo = list(keys)
        if not todo:
            return
        self.map.delete_many(todo)
        have = self.by_set.get(number, set())
        for key in todo:
            if key in have:
                have.discard(key)
                self.count -= 1
        if not have:
            self.by_set.pop(number, None)
        metrics.MAP_WRITES.labels("ipsets", "delete").inc(len(todo))


class BpfPolicyManager(ManagerBase):
    """Programs the BPF data maps from the calc graph's messages (see module docstring)."""

    name = "bpf-policy"
    policy_critical = True

    def __init__(
        self,
        maps: Mapping[str, Any],
        *,
        interface_prefixes: tuple[str, ...] = ("cali",),
        base_config: Mapping[str, str] | None = None,
        rules_per_prog: int = 128,
        list_interfaces: Lister | None = None,
        hostname: str = "",
    ) -> None:
        super().__init__()
        missing = [n for n in (*SYNCED_MAPS, *COUNTER_MAPS, CLS_WORDS) if n not in maps]
        if missing:
            raise ValueError(f"BpfPolicyManager: maps {missing} not given")
        self._maps = dict(maps)
        self._mirrors = {n: MapMirror(maps[n]) for n in SYNCED_MAPS if n != "ipsets"}
        self._ipsets = IPSetMirror(maps["ipsets"])
        self._ipset_plan: dict[int, tuple[IPSetKeys, list[bytes], list[bytes]]] = {}
        self._prefixes = interface_prefixes
        # Keys lower-cased: the agent's own settings are spelled as Felix names them
        # (DefaultEndpointToHostAction), a FelixConfiguration's in camelCase
        # (defaultEndpointToHostAction); the datastore's value overrides the agent's.
        self._base_config = {k.lower(): v for k, v in (base_config or {}).items()}
        self._rules_per_prog = rules_per_prog
        self._list_interfaces = list_interfaces
        # Ipv6Support restarts the agent when it changes, so the agent's value holds for
        # this manager's life
        ipv6 = self._base_config.get("ipv6support", "true").strip().lower()
        self.state = PolicyState(hostname=hostname, config=dict(self._base_config),
                                 ipv6=ipv6 not in ("false", "0", "no", "off"))
        self.interfaces = InterfaceTable()
        self.compiler: PolicyCompiler | None = None
        self._dirty = True
        self._known_numbers: dict[str, set[int]] = {"rules": set(), "endpoints": set()}
        # ep_by_ifindex slots that are PRESENT in the kernel, and the ones the last compile
        # wants: kept as sets so an apply never scans the whole (65,536-slot) array
        self._ep_present: set[bytes] = set()
        self._ep_wanted: set[bytes] = set()
        # cls_l4 / cls_tries: the desired dict (by identity) the kernel was made equal to
        self._cls_in_kernel: dict[str, dict[bytes, bytes]] = {}
        self._unavailable_sets: set[str] = set()
        self._logged_problems: frozenset[str] = frozenset()
        self.last_compiled: CompiledDataplane | None = None
        self.full_this_round: dict[str, int] = {}
        self.on_close: Callable[[], None] | None = None  # releases the shared build

    # --- messages --------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, _STATE_MESSAGES):
            try:
                self.state.apply(msg)
            except CompileError as exc:
                log.error("BPF policy: %s; message ignored", exc)
                return
            self._dirty = True
        elif isinstance(msg, proto.ConfigUpdate):
            self.state.config = {**self._base_config,
                                 **{k.lower(): v for k, v in msg.config}}
            self._dirty = True
        elif isinstance(msg, InterfaceUpdate | InterfaceAddrsUpdate):
            if self.interfaces.observe(msg):
                self._dirty = True
        elif isinstance(msg, proto.InSync):
            self._datastore_in_sync = True
            self._dirty = True

    # --- apply -----------------------------------------------------------------------------

    def apply(self) -> None:
        if not self._dirty and not self._resync_requested:
            return
        try:
            self._apply()
        except Exception:
            self._resync_requested = True  # mirrors may be wrong now: re-read next time
            raise
        self._dirty = False

    def _apply(self) -> None:
        if self._resync_requested:
            self._read_kernel()
            self._resync_requested = False
            retry_all_sets = True
        else:
            retry_all_sets = False
        self.full_this_round = {}
        unavailable = self._sets_to_keep_out(retry_all_sets)
        compiled = self._compile(unavailable)
        for _ in range(3):
            failed_sets = self._write_ipset_adds(compiled)
            if not failed_sets:
                break
            unavailable |= failed_sets
            compiled = self._compile(unavailable)
        else:
            raise RuntimeError("BPF policy: IP sets kept failing to fit in the 'ipsets' map")
        self._unavailable_sets = unavailable
        self._write_rest(compiled)
        if self._datastore_in_sync:
            self._write_deletes(compiled)
            assert self.compiler is not None
            self.compiler.commit(compiled)
            self._known_numbers = {k: set(compiled.numbers_in_use[k])
                                   for k in ("rules", "endpoints")}
        self.last_compiled = compiled
        self._report(compiled)

    def _read_kernel(self) -> None:
        self._cls_in_kernel = {}
        for mirror in self._mirrors.values():
            mirror.reload()
        self._ep_present = {k for k, v in (self._mirrors["ep_by_ifindex"].actual or {}).items()
                            if v != ep_array.EMPTY}
        self._ipsets.reload()
        if self._list_interfaces is not None:
            self.interfaces.replace_all(self._list_interfaces())
        if self.compiler is None:
            adopted = AdoptedState.from_maps(self._maps["ids"], self._maps["endpoints"],
                                             self._maps["rules"], self._maps["cls_chains"],
                                             self._maps[CLS_WORDS], self._maps["cls_l4"],
                                             self._maps["cls_tries"])
            self.compiler = PolicyCompiler(
                rules_capacity=self._maps["rules"].max_entries,
                max_chain_records=max_chain_records(self._rules_per_prog),
                rule_counters=self._maps["rule_counters"].max_entries,
                endpoint_counters=self._maps["ep_counters"].max_entries,
                adopted=adopted,
                cls_words=self._maps[CLS_WORDS].max_entries,
                cls_tries=self._maps["cls_tries"].max_entries,
                cls_l4=self._maps["cls_l4"].max_entries,
            )
            self._known_numbers = {
                "rules": set(adopted.ids.get(IdKind.RULE, {})),
                "endpoints": set(adopted.ids.get(IdKind.ENDPOINT, {})),
            }
            if adopted.chains or any(adopted.ids.values()):
                log.info("BPF policy: adopted pinned state: %d chains, %d ids",
                         len(adopted.chains), sum(len(v) for v in adopted.ids.values()))

    def _compile(self, unavailable: set[str]) -> CompiledDataplane:
        assert self.compiler is not None
        heps = resolve_host_endpoints(self.state.host_endpoints, self.interfaces.addrs_by_name,
                                      self._prefixes) if self.state.host_endpoints else {}
        return self.compiler.compile(self.state, self.interfaces.index_by_name,
                                     unavailable_ipsets=frozenset(unavailable),
                                     host_endpoint_ifaces=heps)

    def _sets_to_keep_out(self, retry_all: bool) -> set[str]:
        """IP sets that did not fit before and still would not (retried at a resync, or
        when the trie has room for all their members)."""
        if retry_all or not self._unavailable_sets:
            return set()
        room = self._ipsets.map.max_entries - self._ipsets.count
        keep = set()
        for name in sorted(self._unavailable_sets):
            s = self.state.ipsets.get(name)
            if s is None:
                continue
            if len(s.members) > room:
                keep.add(name)
            else:
                room -= len(s.members)
        return keep

    # --- writes, in make-before-break order -----------------------------------------------

    def _write_ipset_adds(self, compiled: CompiledDataplane) -> set[str]:
        """ids adds, then IP-set members set by set; returns the sets that did not fit."""
        self._write_checked("ids", self._mirrors["ids"].updates(compiled.ids))
        ipsets = self._ipsets
        plan = self._ipset_plan = ipsets.plan(compiled.ipset_groups)
        failed: set[str] = set()
        # compiler-made net sets (a rule's nets, small) first, then IP sets smallest first:
        # when the trie is nearly full, as many sets as possible fit whole
        order = sorted((n for n in plan if plan[n][1]),
                       key=lambda n: (n in compiled.ipset_numbers, len(plan[n][1]), n))
        for number in order:
            adds = plan[number][1]
            if ipsets.write(number, adds):
                continue
            name = compiled.ipset_numbers.get(number)
            self._count_full("ipsets", len(adds))
            if name is None:  # a compiler-made net set (a rule's nets): not isolable
                raise MapFullError("ipsets", ipsets.map.max_entries,
                                   f"no room for the nets of set number {number}")
            log.error("BPF map 'ipsets' is full (max_entries=%d): IP set %r (%d new members) "
                      "left out; endpoints whose policy uses it deny that direction",
                      ipsets.map.max_entries, name, len(adds))
            failed.add(name)
        return failed

    def _write_rest(self, compiled: CompiledDataplane) -> None:
        self._zero_new_counters(compiled)
        self._write_checked("rules", self._mirrors["rules"].updates(compiled.all_rules()))
        self._write_classifiers(compiled)
        # an endpoint's allowed sources before its entry: its own traffic is never dropped
        # as spoofed for want of them
        self._write_checked("wep_sources",
                            self._mirrors["wep_sources"].updates(compiled.wep_sources))
        endpoints = self._mirrors["endpoints"]
        failed = endpoints.write(endpoints.updates(compiled.endpoints))
        if failed:
            self._count_full("endpoints", len(failed))
            log.error("BPF map 'endpoints' is full (max_entries=%d): %d endpoint(s) not "
                      "programmed; their traffic is dropped", endpoints.map.max_entries,
                      len(failed))
        array = self._mirrors["ep_by_ifindex"]
        not_programmed = set(failed)
        programmed = {k: v for k, v in compiled.endpoints.items() if k not in not_programmed}
        slots = ep_array.slots_for(programmed, array.map.max_entries)
        self._write_checked("ep_by_ifindex", array.updates(slots))
        self._ep_present.update(slots)
        self._ep_wanted = set(slots)
        for name in ("untracked", "config"):
            self._write_checked(name, self._mirrors[name].updates(getattr(compiled, name)))

    def _write_classifiers(self, compiled: CompiledDataplane) -> None:
        """Every new classifier instance whole (block, l4 and trie entries), THEN the
        cls_chains pointers: a chain is never pointed at an instance that is not complete.
        A write that does not fit raises (the pointers are not switched, the previous
        classifiers stay in force; the next apply re-reads and retries)."""
        words = compiled.cls_words()
        if words:
            self._maps[CLS_WORDS].update_many(words.items())
            metrics.MAP_WRITES.labels(CLS_WORDS, "update").inc(len(words))
        for name in ("cls_l4", "cls_tries"):
            mirror = self._mirrors[name]
            if self._cls_in_kernel.get(name) is getattr(compiled, name):
                continue  # the very entries the kernel was last made equal to
            failed = mirror.write(mirror.updates(getattr(compiled, name)))
            if failed:
                self._count_full(name, len(failed))
                raise MapFullError(name, mirror.map.max_entries,
                                   f"{len(failed)} classifier entries did not fit; the "
                                   f"previous policy stays in force")
        chains = self._mirrors["cls_chains"]
        self._write_checked("cls_chains", chains.updates(compiled.cls_chains))

    def _write_deletes(self, compiled: CompiledDataplane) -> None:
        # mirror slots first: a PRESENT slot must never outlive its endpoints entry
        stale_slots = sorted(self._ep_present - self._ep_wanted)
        self._write_checked("ep_by_ifindex", [(k, ep_array.EMPTY) for k in stale_slots])
        self._ep_present.difference_update(stale_slots)
        for name in ("endpoints", "wep_sources", "untracked"):
            mirror = self._mirrors[name]
            mirror.delete(mirror.stale(getattr(compiled, name)))
        # classifiers no chain points at any more (endpoints were repointed above)
        for name in ("cls_l4", "cls_tries"):
            mirror = self._mirrors[name]
            desired = getattr(compiled, name)
            if self._cls_in_kernel.get(name) is not desired:
                mirror.delete(mirror.stale(desired))
                self._cls_in_kernel[name] = desired
        chains = self._mirrors["cls_chains"]
        wanted = compiled.cls_chains
        self._write_checked("cls_chains", [
            (k, cls_chains_map.EMPTY) for k, v in (chains.actual or {}).items()
            if k not in wanted and v != cls_chains_map.EMPTY])
        ipsets = self._ipsets
        assert ipsets.by_set is not None
        for number, (group, _, removes) in self._ipset_plan.items():
            ipsets.delete(number, removes)
            ipsets.applied[number] = group.generation
        for number in [n for n in ipsets.by_set if n not in compiled.ipset_groups]:
            ipsets.delete(number, list(ipsets.by_set[number]))
            ipsets.applied.pop(number, None)
        for number in [n for n in ipsets.applied if n not in compiled.ipset_groups]:
            del ipsets.applied[number]
        ids = self._mirrors["ids"]
        ids.delete(ids.stale(compiled.ids))

    def _write_checked(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        failed = self._mirrors[name].write(items)
        if failed:
            self._count_full(name, len(failed))
            log.error("BPF map %r is full (max_entries=%d): %d entries left out", name,
                      self._mirrors[name].map.max_entries, len(failed))

    def _zero_new_counters(self, compiled: CompiledDataplane) -> None:
        """Counter slots of numbers given to a new owner start from zero."""
        for kind, map_name in (("rules", "rule_counters"), ("endpoints", "ep_counters"),
                               ("endpoints", "ep_spoofed")):
            new = compiled.numbers_in_use[kind] - self._known_numbers[kind]
            if not new:
                continue
            m = self._maps[map_name]
            zero = bytes(m.value_blob_size)
            m.update_many((counters_map.encode_index(n), zero) for n in sorted(new)
                          if n < m.max_entries)
            self._known_numbers[kind] |= new

    # --- reporting -------------------------------------------------------------------------

    def _count_full(self, map_name: str, entries: int) -> None:
        if map_name not in self.full_this_round:
            metrics.MAP_FULL_ERRORS.labels(map_name).inc()
        self.full_this_round[map_name] = self.full_this_round.get(map_name, 0) + entries

    def _report(self, compiled: CompiledDataplane) -> None:
        for name in compiled.full_maps:
            self._count_full(name, 0)
        problems = frozenset(compiled.problems)
        for problem in sorted(problems - self._logged_problems):
            log.warning("BPF policy: %s", problem)
        self._logged_problems = problems
        metrics.COMPILE_PROBLEMS.set(len(problems))
        metrics.MAP_ENTRIES.labels("ipsets").set(self._ipsets.count)
        metrics.MAP_MAX_ENTRIES.labels("ipsets").set(self._ipsets.map.max_entries)
        for name, mirror in self._mirrors.items():
            if name == "rules":
                used = sum(len(chain) for chain in compiled.chains_in_use)
                metrics.MAP_ENTRIES.labels(name).set(used)
            elif name == "ep_by_ifindex":
                metrics.MAP_ENTRIES.labels(name).set(len(self._ep_present))
            elif name == "cls_chains":
                metrics.MAP_ENTRIES.labels(name).set(len(compiled.cls_instances))
            else:
                metrics.MAP_ENTRIES.labels(name).set(len(mirror.actual or {}))
            metrics.MAP_MAX_ENTRIES.labels(name).set(mirror.map.max_entries)
        if self.compiler is not None:
            metrics.MAP_ENTRIES.labels(CLS_WORDS).set(self.compiler.word_regions.used)
            metrics.MAP_MAX_ENTRIES.labels(CLS_WORDS).set(self._maps[CLS_WORDS].max_entries)

    def close(self) -> None:
        """The maps stay pinned and programmed; only our handles go."""
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

    # --- introspection (tests, status) ---------------------------------------------------

    @property
    def unavailable_ipsets(self) -> frozenset[str]:
        return frozenset(self._unavailable_sets)

    def problems(self) -> list[str]:
        return list(self.last_compiled.problems) if self.last_compiled else []

    def rule_counters(self) -> list[tuple[proto.RuleMeta, int, int]]:
        """(the rule, packets, bytes) of every non-zero rule counter this agent's compiler
        knows (for the per-policy metrics; read at scrape time)."""
        compiler = self.compiler
        if compiler is None:
            return []
        out = []
        for row in counters_map.dump_rules(self._maps["rule_counters"]):
            meta = self._counter_meta(compiler, row["counter_id"])
            if meta is not None:
                out.append((meta, row["packets"], row["bytes"]))
        return out

    def denied_sources(self) -> list[tuple[proto.RuleMeta, str, int, int]]:
        """(the deciding rule, source address, packets, bytes) policy denied, from the
        `denied_sources` LRU map (Felix's calico_denied_packets / _bytes)."""
        compiler = self.compiler
        m = self._maps.get("denied_sources")
        if compiler is None or m is None:
            return []
        out = []
        for row in denied_sources_map.dump(m):
            meta = self._counter_meta(compiler, row["counter_id"])
            if meta is not None:
                out.append((meta, row["source"], row["packets"], row["bytes"]))
        return out

    def counter_meta(self, counter_id: int) -> proto.RuleMeta | None:
        """The rule a rule counter counts (None: unknown to this agent's compiler)."""
        compiler = self.compiler
        return None if compiler is None else self._counter_meta(compiler, counter_id)

    @staticmethod
    def _counter_meta(compiler: PolicyCompiler, counter_id: int) -> proto.RuleMeta | None:
        entry = compiler.rule_ids.by_number.get(counter_id)
        return None if entry is None else compiler.counter_meta.get(entry[1])

    def spoofed_by_endpoint(self) -> dict[str, int]:
        """Packets each programmed endpoint sent from a source it may not use (from the
        ep_spoofed map; for the metrics)."""
        compiled = self.last_compiled
        if compiled is None:
            return {}
        out = {}
        for wid, program in compiled.programs.items():
            if program.endpoint_id:
                packets, _bytes = counters_map.read_rule(self._maps["ep_spoofed"],
                                                         program.endpoint_id)
                out[f"{wid.workload}/{wid.endpoint}"] = packets
        return out


"""The policy compiler: calc-graph messages -> the desired contents of every BPF map.

Role: pure Python, no kernel. A manager folds messages into a `PolicyState` (`apply(msg)`)
and asks a long-lived `PolicyCompiler` to `compile(state, ifindexes)`; the result
(`CompiledDataplane`) holds, per map, `{key bytes: value bytes}` to diff against what the
pinned maps hold, plus the problems found. After writing it successfully the manager calls
`commit(result)`, which frees the ids and rule-array regions the result no longer uses.

What it computes:
- ids: numbers for IP sets (calc-graph ids), compiler-made net sets (a rule's nets /
  notNets become one set each, shared by content), rule counters (Rule.rule_id), endpoints.
  Allocation is stable: a name keeps its number while it is in use; new names get the
  lowest free number, in sorted name order, so the same state gives the same numbers.
  Numbers are freed only by `commit()`, so an id is never reused while the kernel may still
  reference it (make before break). `AdoptedState.from_maps()` seeds the allocators from the
  pinned maps so a restarted agent keeps every number.
- chains (see bpf/include/policy.h for the record format): per endpoint and direction,
  tiers -> policies -> rules, tier-end deny, profiles, final deny, lowered to records with
  slot overflow handled by splitting (OR) and guard records (AND). Chains are shared by
  content and placed in the rules array by `ChainLayout` (first fit, never overwriting a
  region in use: a changed chain goes to a new region, the endpoint is repointed, the old
  region is freed on commit).
- classifiers (bpf/include/classifier.h, agent.bpf.classifier): one instance per chain in
  use and generation of the sets it checks, in a `cls_words` block of its own
  (`WordRegions`, first fit, freed on commit) plus its `cls_l4` / `cls_tries` entries; a
  chain whose classifier does not fit leaves its endpoints on the chain of the last commit
  (the previous policy stays in force) or on DENY, with a problem naming map and endpoint.
- endpoints (by ifindex; interfaces without an ifindex yet are listed as pending), the
  sources each programmed endpoint may send from (`wep_sources`: its IPv4 addresses and
  allowSpoofedSourcePrefixes; the RPF check), the untracked (XDP) trie, the config entry.
  (The routes trie is not policy: `agent.bpf.route_table`, written by its own manager.)

Failure policy: bad input never crashes the compile. A problem confined to one endpoint
(unknown policy/profile/IP set, invalid rule field, chain too long) makes THAT endpoint's
chain a single DENY (fail closed) and is reported in `problems` with the resource and
field named. Running out of rule-array space raises MapFullError (nothing is half-placed).

Both families: IP sets and net sets hold IPv4 and IPv6 members (the trie is keyed by
family); a rule applies to the families Felix renders it for (`_rule_families`: its
ipVersion, and no family whose filtering would empty a non-empty nets / notNets list), and
a record restricted to one family carries ip_version (an L4 constraint of the classifier).
A rule that applies to no family is omitted.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf import classifier as cls
from pyfelix.agent.bpf.maps import cls_chains as cls_chains_map
from pyfelix.agent.bpf.maps import cls_tries as cls_tries_map
from pyfelix.agent.bpf.maps import cls_words as cls_words_map
from pyfelix.agent.bpf.maps import config as config_map
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.maps import endpoints as endpoints_map
from pyfelix.agent.bpf.maps import ids as ids_map
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps import untracked as untracked_map
from pyfelix.agent.bpf.maps import wep_sources as sources_map
from pyfelix.agent.bpf.maps.base import MapFullError
from pyfelix.agent.bpf.maps.ids import IdKind
from pyfelix.agent.bpf.maps.rules import (
    NAMED_PORT_SLOTS,
    PORT_SLOTS,
    SET_CHECKS,
    Action,
    PortMatch,
    RuleRecord,
    SetCheck,
)

INGRESS = "ingress"  # the POD's ingress: inbound rules, to_wep hook
EGRESS = "egress"  # the POD's egress: outbound rules, from_wep hook
DIRECTIONS = (INGRESS, EGRESS)

Chain = tuple[RuleRecord, ...]
DENY_ALL: Chain = (RuleRecord(Action.DENY),)


class CompileError(ValueError):
    """Input the compiler cannot turn into records; the message names resource and field."""


# --- state ---------------------------------------------------------------------------------


@dataclass
class IPSetState:
    type: str  # "net" | "ip_port"
    members: set[str]
    version: int = 0  # bumped by every change, so the compiler can cache encoded members
    # the last deltas: (version after, added, removed), so a compile costs O(delta)
    changes: list[tuple[int, frozenset[str], frozenset[str]]] = field(default_factory=list)

    MAX_CHANGES = 64

    def record(self, added: frozenset[str], removed: frozenset[str]) -> None:
        self.members -= removed
        self.members |= added
        self.version += 1
        self.changes.append((self.version, added, removed))
        if len(self.changes) > self.MAX_CHANGES:
            del self.changes[: len(self.changes) - self.MAX_CHANGES]

    def changes_since(self, version: int
                      ) -> list[tuple[int, frozenset[str], frozenset[str]]] | None:
        """The deltas from `version` to now, or None if they are not all recorded."""
        todo = [c for c in self.changes if c[0] > version]
        if len(todo) != self.version - version:
            return None
        return todo


@dataclass(eq=False)
class IPSetKeys:
    """The trie keys of one set (number) as compiled: `keys` (a dict used as an ordered
    set; never mutated once published) and its `generation`. When the compiler derived it
    from the previous generation by a delta, `base_generation` names that one and
    `added`/`removed` are the net difference, so a manager that holds the base in the
    kernel writes only the difference."""

    keys: dict[bytes, None]
    generation: int
    base_generation: int | None = None
    added: tuple[bytes, ...] = ()
    removed: tuple[bytes, ...] = ()


@dataclass(eq=False)
class _EncodedSet:
    state: IPSetState
    version: int
    number: int
    encoded: dict[str, bytes | str | None]  # member -> key, None (IPv6) or a problem
    counts: dict[bytes, int]  # key -> members producing it
    problems: dict[str, str]  # member -> problem text
    group: IPSetKeys


@dataclass
class PolicyState:
    """The policy inputs of the BPF dataplane: IP sets, policies, profiles, workload and host
    endpoints and the settings the programs read, as the calc graph's messages left them.
    `apply()` folds one message in; messages the policy maps do not depend on are ignored
    (routes: `agent.bpf.route_table`)."""

    hostname: str = ""
    ipsets: dict[str, IPSetState] = field(default_factory=dict)
    policies: dict[proto.PolicyID, proto.Policy] = field(default_factory=dict)
    profiles: dict[str, proto.Profile] = field(default_factory=dict)
    endpoints: dict[proto.WorkloadEndpointID, proto.WorkloadEndpoint] = field(
        default_factory=dict)
    host_endpoints: dict[proto.HostEndpointID, proto.HostEndpoint] = field(
        default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)  # Felix settings, keys lower-case
    # the nodes with a VXLAN tunnel endpoint / an IPIP tunnel: VXLAN / IPIP is in use
    vxlan_nodes: set[str] = field(default_factory=set)
    ipip_nodes: set[str] = field(default_factory=set)
    endpoints_version: int = 0  # bumped when a workload endpoint is added or removed
    # Ipv6Support (a restart setting): False keeps every IPv6 address out of the state, so
    # nothing IPv6 reaches a map; the programs drop workload IPv6 (CFG_IPV6_DISABLED)
    ipv6: bool = True

    @property
    def families(self) -> frozenset[int]:
        return frozenset((4, 6)) if self.ipv6 else frozenset((4,))

    def apply(self, msg: Any) -> None:
        """Fold one agent.proto message into the state. A delta for an unknown IP set
        raises CompileError naming it."""
        if not self.ipv6:
            msg = _without_ipv6(msg)
        match msg:
            case proto.IPSetUpdate():
                old = self.ipsets.get(msg.id)
                if old is not None and old.type == msg.type:
                    # a replacement is a delta (often empty): the compile costs its size
                    added = frozenset(msg.members - old.members)
                    removed = frozenset(old.members - msg.members)
                    if added or removed:
                        old.record(added, removed)
                else:
                    version = old.version + 1 if old else 0
                    self.ipsets[msg.id] = IPSetState(msg.type, set(msg.members), version)
            case proto.IPSetDeltaUpdate():
                s = self.ipsets.get(msg.id)
                if s is None:
                    raise CompileError(f"IPSetDeltaUpdate for unknown IP set {msg.id!r}")
                s.record(msg.added, msg.removed)
            case proto.IPSetRemove():
                self.ipsets.pop(msg.id, None)
            case proto.ActivePolicyUpdate():
                self.policies[msg.id] = msg.policy
            case proto.ActivePolicyRemove():
                self.policies.pop(msg.id, None)
            case proto.ActiveProfileUpdate():
                self.profiles[msg.id] = msg.profile
            case proto.ActiveProfileRemove():
                self.profiles.pop(msg.id, None)
            case proto.WorkloadEndpointUpdate():
                if msg.id not in self.endpoints:
                    self.endpoints_version += 1
                self.endpoints[msg.id] = msg.endpoint
            case proto.WorkloadEndpointRemove():
                if self.endpoints.pop(msg.id, None) is not None:
                    self.endpoints_version += 1
            case proto.HostEndpointUpdate():
                self.host_endpoints[msg.id] = msg.endpoint
            case proto.HostEndpointRemove():
                self.host_endpoints.pop(msg.id, None)
            case proto.ConfigUpdate():
                self.config = {k.lower(): v for k, v in msg.config}
            case proto.VXLANTunnelEndpointUpdate():
                self.vxlan_nodes.add(msg.node)
            case proto.VXLANTunnelEndpointRemove():
                self.vxlan_nodes.discard(msg.node)
            case proto.IPIPTunnelUpdate():
                self.ipip_nodes.add(msg.node)
            case proto.IPIPTunnelRemove():
                self.ipip_nodes.discard(msg.node)
            case _:
                pass


def _is_ipv6_member(member: str) -> bool:
    """An IP-set member ("10.0.0.1/32", "fd00::1/128", "fd00::1/128,tcp:80") of IPv6?"""
    return ":" in member.split(",", 1)[0]


def _ipv4_only(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in prefixes if ":" not in p)


def _without_ipv6(msg: Any) -> Any:
    """`msg` with its IPv6 addresses left out (Ipv6Support false): IP-set members, an
    endpoint's IPv6 nets and IPv6 allowed source prefixes. Rules are filtered where they are
    lowered (`_RuleLowerer.lower`), so their indices and counters stay as written."""
    match msg:
        case proto.IPSetUpdate():
            return replace(msg, members=frozenset(
                m for m in msg.members if not _is_ipv6_member(m)))
        case proto.IPSetDeltaUpdate():
            return replace(msg,
                           added=frozenset(m for m in msg.added if not _is_ipv6_member(m)),
                           removed=frozenset(m for m in msg.removed if not _is_ipv6_member(m)))
        case proto.WorkloadEndpointUpdate():
            ep = msg.endpoint
            return replace(msg, endpoint=replace(
                ep, ipv6_nets=(),
                allow_spoofed_source_prefixes=_ipv4_only(ep.allow_spoofed_source_prefixes)))
    return msg


def _truthy(text: str) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes", "on")


# --- id allocation ---------------------------------------------------------------------------


class IdAllocator:
    """Stable (kind, name) -> number allocation over one number space. Numbers start at 1
    (0 = none) and stay below `limit`. Several kinds may share a space (IP sets and
    compiler-made net sets share the trie's set ids). Names are compared in their stored
    form (ids.stored_name)."""

    def __init__(self, kinds: tuple[IdKind, ...], limit: int = 2**32,
                 adopted: Mapping[IdKind, Mapping[int, str]] | None = None) -> None:
        self.kinds = kinds
        self.limit = limit
        self.by_name: dict[tuple[IdKind, str], int] = {}
        self.by_number: dict[int, tuple[IdKind, str]] = {}
        self._encoded: dict[int, tuple[tuple[IdKind, str], bytes, bytes]] = {}
        self._next_free = 1
        for kind in kinds:
            for number, name in sorted((adopted or {}).get(kind, {}).items()):
                if 0 < number < limit and number not in self.by_number \
                        and (kind, name) not in self.by_name:
                    self.by_name[(kind, name)] = number
                    self.by_number[number] = (kind, name)

    def get(self, name: str, kind: IdKind | None = None) -> int | None:
        return self.by_name.get((kind or self.kinds[0], ids_map.stored_name(name)))

    def allocate(self, name: str, kind: IdKind | None = None) -> int:
        """The number for name, allocating the lowest free one. Raises MapFullError when
        every number below `limit` is taken."""
        key = (kind or self.kinds[0], ids_map.stored_name(name))
        number = self.by_name.get(key)
        if number is not None:
            return number
        n = self._next_free
        while n in self.by_number:
            n += 1
        if n >= self.limit:
            raise MapFullError(f"ids ({key[0].name.lower()})", self.limit - 1,
                               f"no free {key[0].name.lower()} id for {name!r}")
        self._next_free = n + 1
        self.by_name[key] = n
        self.by_number[n] = key
        return n

    def retain_only(self, numbers: Iterable[int]) -> list[int]:
        """Free every number not in `numbers`; returns the freed ones."""
        keep = set(numbers)
        freed = [n for n in self.by_number if n not in keep]
        for n in freed:
            del self.by_name[self.by_number.pop(n)]
            self._encoded.pop(n, None)
        if freed:
            self._next_free = min(self._next_free, *freed)
        return freed

    def entries(self, numbers: Iterable[int]) -> dict[bytes, bytes]:
        """ids-map entries for the given numbers (encodings cached per number and name)."""
        out = {}
        cache = self._encoded
        for n in numbers:
            owner = self.by_number[n]
            hit = cache.get(n)
            if hit is None or hit[0] != owner:
                hit = cache[n] = (owner, ids_map.encode_key(owner[0], n),
                                  ids_map.encode_value(owner[1]))
            out[hit[1]] = hit[2]
        return out


# --- rule-array layout ------------------------------------------------------------------------


class ChainLayout:
    """Where each chain lives in the rules array. A chain keeps its region while in use;
    a new chain takes the first gap that fits; regions are freed by `retain_only()`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.starts: dict[Chain, int] = {}
        self._extra: list[tuple[int, int]] = []  # adopted duplicate regions, freed on commit

    def adopt(self, chain: Chain, start: int) -> None:
        """Record a chain found in the kernel (restart adoption)."""
        if not chain:
            return
        if chain in self.starts and self.starts[chain] != start:
            self._extra.append((start, len(chain)))
        else:
            self.starts[chain] = start

    def _used(self) -> list[tuple[int, int]]:
        regions = [(s, len(c)) for c, s in self.starts.items()] + self._extra
        return sorted(regions)

    def place(self, chain: Chain) -> tuple[int, bool]:
        """(start, newly_placed). Raises MapFullError if no gap is long enough."""
        if not chain:
            return 0, False
        start = self.starts.get(chain)
        if start is not None:
            return start, False
        pos = 0
        for s, n in self._used():
            if s - pos >= len(chain):
                break
            pos = max(pos, s + n)
        if pos + len(chain) > self.capacity:
            raise MapFullError("rules", self.capacity,
                               f"no room for a chain of {len(chain)} records")
        self.starts[chain] = pos
        return pos, True

    def retain_only(self, chains: Iterable[Chain]) -> None:
        keep = set(chains)
        self.starts = {c: s for c, s in self.starts.items() if c in keep}
        self._extra = []


class WordRegions:
    """Blocks of the cls_words array: first fit, never overlapping a block in use; index 0
    is never used (instance 0 means "none"). Blocks are freed by `retain_only()`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: dict[int, int] = {}  # base -> size

    def allocate(self, size: int) -> int:
        pos = 1
        for base, n in sorted(self.blocks.items()):
            if base - pos >= size:
                break
            pos = max(pos, base + n)
        if pos + size > self.capacity:
            raise MapFullError("cls_words", self.capacity,
                               f"no room for a classifier block of {size} words")
        self.blocks[pos] = size
        return pos

    def reserve(self, base: int, size: int) -> None:
        self.blocks[base] = size

    def retain_only(self, bases: Iterable[int]) -> None:
        keep = set(bases)
        self.blocks = {b: n for b, n in self.blocks.items() if b in keep}

    @property
    def used(self) -> int:
        return sum(self.blocks.values())


_IPSET_KEY = struct.Struct("=IIBBH16s")  # struct ipset_key


def _members_of(group: IPSetKeys) -> tuple[cls.Member, ...]:
    return _members_from_keys(group.keys)


def _members_from_keys(keys: Iterable[bytes]) -> tuple[cls.Member, ...]:
    out = []
    for key in keys:
        prefixlen, _, proto_num, family, port, addr = _IPSET_KEY.unpack(key)
        value = int.from_bytes(addr if family == 6 else addr[:4], "big")
        out.append((value, prefixlen - ipsets_map.KEY_FIXED_BITS, proto_num, port, family))
    return tuple(out)


def _referenced_sets(chain: Chain) -> tuple[int, ...]:
    numbers: set[int] = set()
    for r in chain:
        numbers.update(c.set_id for c in r.set_checks)
        for pm in (r.src_ports, r.dst_ports, r.not_src_ports, r.not_dst_ports):
            numbers.update(pm.named_sets)
    return tuple(sorted(numbers))


# --- lowering rules to records ---------------------------------------------------------------


class _Label:
    __slots__ = ("pos",)

    def __init__(self) -> None:
        self.pos: int | None = None


@dataclass(frozen=True)
class _Fragment:
    """Records of one policy/profile direction with symbolic jumps: `jumps[i]` is None,
    "pass" (to the caller's pass target) or an int offset inside the fragment."""

    records: tuple[RuleRecord, ...]
    jumps: tuple[int | str | None, ...]
    ipsets_used: frozenset[tuple[str, str]]  # (IP set id, type) the records reference
    netsets: tuple[tuple[int, tuple[str, ...]], ...]  # net sets the records reference
    counter_ids: frozenset[int]


class _ChainBuilder:
    def __init__(self) -> None:
        self.records: list[RuleRecord] = []
        self.targets: list[_Label | int | None] = []

    def emit(self, rec: RuleRecord, target: _Label | int | None = None) -> None:
        self.records.append(rec)
        self.targets.append(target)

    def add_fragment(self, frag: _Fragment, pass_target: _Label) -> None:
        base = len(self.records)
        for rec, j in zip(frag.records, frag.jumps, strict=True):
            if j is None:
                self.emit(rec)
            elif j == "pass":
                self.emit(rec, pass_target)
            else:
                self.emit(rec, base + int(j))

    def mark(self, label: _Label) -> None:
        label.pos = len(self.records)

    def finish(self) -> Chain:
        out = []
        for rec, t in zip(self.records, self.targets, strict=True):
            if t is None:
                out.append(rec)
                continue
            pos = t.pos if isinstance(t, _Label) else t
            assert pos is not None, "unmarked label"
            out.append(dataclasses.replace(rec, jump=pos))
        return tuple(out)


_NO_PORTS = PortMatch()


def _chunks(items: tuple, size: int) -> list[tuple]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _ports(ranges: tuple[proto.PortRange, ...], where: str, fld: str
           ) -> tuple[tuple[int, int], ...]:
    """Validated ranges, sorted and merged where they overlap or touch (same union)."""
    if not ranges:
        return ()
    where = f"{where}: field {fld}"
    checked = []
    for r in ranges:
        if not (isinstance(r.first, int) and isinstance(r.last, int)
                and 0 <= r.first <= r.last <= 65535):
            raise CompileError(f"{where}: bad port range {r.first}-{r.last}")
        checked.append((r.first, r.last))
    merged: list[tuple[int, int]] = []
    for first, last in sorted(checked):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


def _byte(value: int | None, where: str, fld: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise CompileError(f"{where}: field {fld}: {value!r} is not a number 0-255")
    return value


def _nets(nets: tuple[str, ...], where: str, fld: str) -> tuple[tuple[str, ...], set[int]]:
    """(sorted canonical nets of both families, the families present)."""
    if not nets:
        return (), set()
    where = f"{where}: field {fld}"
    out: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for text in nets:
        try:
            out.add(ipaddress.ip_network(text, strict=False))
        except ValueError as e:
            raise CompileError(f"{where}: bad CIDR {text!r}: {e}") from None
    ordered = sorted(out, key=lambda n: (n.version, int(n.network_address), n.prefixlen))
    return tuple(str(n) for n in ordered), {n.version for n in out}


def _rule_families(rule: proto.Rule, *net_families: set[int]) -> set[int]:
    """The families Felix renders `rule` for: its ipVersion (both when unset), less each
    family for which a non-empty nets / notNets list has no net (Felix's
    FilterRuleToIPVersion drops the rule there rather than widen the list)."""
    fams = {4, 6} if rule.ip_version not in (4, 6) else {rule.ip_version}
    for present in net_families:
        if present:
            fams &= present
    return fams


class _RuleLowerer:
    """Turns one proto.Rule into records (guards + main records)."""

    def __init__(self, compiler: PolicyCompiler, state: PolicyState) -> None:
        self.c = compiler
        self.state = state
        self.ipsets_used: set[tuple[str, str]] = set()  # (IP set id, type)
        self.netsets: dict[int, tuple[str, ...]] = {}  # number -> nets

    def set_id(self, set_name: str, where: str, expect_type: str) -> int:
        s = self.state.ipsets.get(set_name)
        if s is None:
            raise CompileError(f"{where}: unknown IP set {set_name!r}")
        if set_name in self.c.unavailable_ipsets:
            raise CompileError(f"{where}: IP set {set_name!r} could not be programmed "
                               f"(BPF map 'ipsets' full)")
        if s.type != expect_type:
            raise CompileError(f"{where}: IP set {set_name!r} is {s.type!r}, not {expect_type!r}")
        self.ipsets_used.add((set_name, expect_type))
        return self.c.set_ids.allocate(set_name, IdKind.IPSET)

    def net_set(self, nets: tuple[str, ...]) -> int:
        number = self.c.set_ids.allocate(",".join(nets), IdKind.NETSET)
        self.netsets[number] = nets
        return number

    def lower(self, rule: proto.Rule, where: str, counter_name: str
              ) -> tuple[list[RuleRecord], list[int | str | None]] | None:
        """(records, jumps) or None if the rule matches no family."""
        if rule.ip_version is not None and rule.ip_version not in (4, 6):
            raise CompileError(f"{where}: field ip_version: {rule.ip_version!r} is not 4 or 6")
        actions = {"allow": Action.ALLOW, "deny": Action.DENY, "pass": Action.PASS,
                   "log": Action.LOG}
        action = actions.get(str(rule.action).lower())
        if action is None:
            raise CompileError(f"{where}: field action: unknown action {rule.action!r}")

        src_nets, f_src = _nets(rule.src_nets, where, "src_nets")
        dst_nets, f_dst = _nets(rule.dst_nets, where, "dst_nets")
        not_src_nets, f_nsrc = _nets(rule.not_src_nets, where, "not_src_nets")
        not_dst_nets, f_ndst = _nets(rule.not_dst_nets, where, "not_dst_nets")
        families = _rule_families(rule, f_src, f_dst, f_nsrc, f_ndst) & self.state.families
        if 6 not in self.state.families:  # Ipv6Support false: IPv6 nets are never programmed
            src_nets, dst_nets = _ipv4_only(src_nets), _ipv4_only(dst_nets)
            not_src_nets, not_dst_nets = _ipv4_only(not_src_nets), _ipv4_only(not_dst_nets)
        if not families:
            return None  # e.g. IPv6 nets with ipVersion 4: matches nothing
        ip_version = None if len(families) == 2 else min(families)
        if rule.icmp_code is not None and rule.icmp_type is None:
            raise CompileError(f"{where}: field icmp_code: set without icmp_type")
        if rule.not_icmp_code is not None and rule.not_icmp_type is None:
            raise CompileError(f"{where}: field not_icmp_code: set without not_icmp_type")

        def sets(names: tuple[str, ...], fld: str) -> tuple[int, ...]:
            if not names:
                return ()
            return tuple(self.set_id(n, f"{where}: field {fld}", "net") for n in names)

        def named(names: tuple[str, ...], fld: str) -> tuple[int, ...]:
            if not names:
                return ()
            return tuple(self.set_id(n, f"{where}: field {fld}", "ip_port") for n in names)

        src_sets = sets(rule.src_ip_set_ids, "src_ip_set_ids")
        not_src_sets = sets(rule.not_src_ip_set_ids, "not_src_ip_set_ids")
        dst_sets = sets(rule.dst_ip_set_ids, "dst_ip_set_ids")
        not_dst_sets = sets(rule.not_dst_ip_set_ids, "not_dst_ip_set_ids")
        src_np = named(rule.src_named_port_ip_set_ids, "src_named_port_ip_set_ids")
        not_src_np = named(rule.not_src_named_port_ip_set_ids, "not_src_named_port_ip_set_ids")
        dst_np = named(rule.dst_named_port_ip_set_ids, "dst_named_port_ip_set_ids")
        not_dst_np = named(rule.not_dst_named_port_ip_set_ids, "not_dst_named_port_ip_set_ids")
        src_ports = _ports(rule.src_ports, where, "src_ports")
        not_src_ports = _ports(rule.not_src_ports, where, "not_src_ports")
        dst_ports = _ports(rule.dst_ports, where, "dst_ports")
        not_dst_ports = _ports(rule.not_dst_ports, where, "not_dst_ports")

        # Address constraints, all ANDed: nets (one compiler-made set per list), selectors.
        checks: list[SetCheck] = []
        if src_nets:
            checks.append(SetCheck(self.net_set(src_nets), src=True))
        if dst_nets:
            checks.append(SetCheck(self.net_set(dst_nets), src=False))
        checks += [SetCheck(x, src=True) for x in src_sets]
        checks += [SetCheck(x, src=False) for x in dst_sets]
        if not_src_nets:
            checks.append(SetCheck(self.net_set(not_src_nets), src=True, negate=True))
        if not_dst_nets:
            checks.append(SetCheck(self.net_set(not_dst_nets), src=False, negate=True))
        checks += [SetCheck(x, src=True, negate=True) for x in not_src_sets]
        checks += [SetCheck(x, src=False, negate=True) for x in not_dst_sets]

        base = dict(
            protocol=_byte(rule.protocol, where, "protocol"),
            not_protocol=_byte(rule.not_protocol, where, "not_protocol"),
            icmp_type=_byte(rule.icmp_type, where, "icmp_type"),
            icmp_code=_byte(rule.icmp_code, where, "icmp_code"),
            not_icmp_type=_byte(rule.not_icmp_type, where, "not_icmp_type"),
            not_icmp_code=_byte(rule.not_icmp_code, where, "not_icmp_code"),
            set_checks=tuple(checks[:SET_CHECKS]),
            ip_version=ip_version,
            not_src_ports=PortMatch(not_src_ports[:PORT_SLOTS], not_src_np[:NAMED_PORT_SLOTS]),
            not_dst_ports=PortMatch(not_dst_ports[:PORT_SLOTS], not_dst_np[:NAMED_PORT_SLOTS]),
        )

        # Guards: each skips the whole rule when one overflowing AND-constraint fails.
        guards: list[RuleRecord] = []
        if len(checks) > SET_CHECKS:
            for chk in checks[SET_CHECKS:]:
                inverse = SetCheck(chk.set_id, src=chk.src, negate=not chk.negate)
                guards.append(RuleRecord(Action.SKIP, set_checks=(inverse,)))
        if len(not_src_ports) > PORT_SLOTS or len(not_dst_ports) > PORT_SLOTS \
                or len(not_src_np) > NAMED_PORT_SLOTS or len(not_dst_np) > NAMED_PORT_SLOTS:
            for chunk in _chunks(not_src_ports[PORT_SLOTS:], PORT_SLOTS):
                guards.append(RuleRecord(Action.SKIP, src_ports=PortMatch(ranges=chunk)))
            for chunk in _chunks(not_dst_ports[PORT_SLOTS:], PORT_SLOTS):
                guards.append(RuleRecord(Action.SKIP, dst_ports=PortMatch(ranges=chunk)))
            for chunk in _chunks(not_src_np[NAMED_PORT_SLOTS:], NAMED_PORT_SLOTS):
                guards.append(RuleRecord(Action.SKIP, src_ports=PortMatch(named_sets=chunk)))
            for chunk in _chunks(not_dst_np[NAMED_PORT_SLOTS:], NAMED_PORT_SLOTS):
                guards.append(RuleRecord(Action.SKIP, dst_ports=PortMatch(named_sets=chunk)))

        # Main records: positive port alternatives (OR) split across records.
        def alternatives(ranges: tuple, np: tuple) -> list[PortMatch]:
            # a group is ranges-only or named-only: the classifier looks ports and named
            # ports up as different fields, and "in ranges OR in a named set" is an OR
            if not np and len(ranges) <= PORT_SLOTS:
                return [PortMatch(ranges=ranges)] if ranges else [_NO_PORTS]
            return ([PortMatch(ranges=c) for c in _chunks(ranges, PORT_SLOTS)]
                    + [PortMatch(named_sets=c) for c in _chunks(np, NAMED_PORT_SLOTS)]
                    ) or [_NO_PORTS]

        counter_id = self.c.counter_id(counter_name)
        mains = [
            RuleRecord(action, counter_id=counter_id, src_ports=sp, dst_ports=dp, **base)
            for sp in alternatives(src_ports, src_np)
            for dp in alternatives(dst_ports, dst_np)
        ]
        after = len(guards) + len(mains)
        records = guards + mains
        jumps: list[int | str | None] = [after] * len(guards)
        jumps += ["pass" if action == Action.PASS else None] * len(mains)
        return records, jumps


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainRef:
    start: int
    records: Chain

    @property
    def length(self) -> int:
        return len(self.records)


@dataclass(frozen=True)
class EndpointProgram:
    """What one workload endpoint compiled to."""

    iface: str
    ifindex: int | None  # None: interface not known yet (pending)
    endpoint_id: int
    flags: int
    ingress: ChainRef
    egress: ChainRef


@dataclass
class CompiledDataplane:
    """Desired contents per map ({key: value} bytes), plus diagnostics.

    `rules` holds only the records of chains placed by THIS compile (new regions the manager
    must write before pointing endpoints at them); `all_rules()` gives every used index
    (for a full resync against the kernel)."""

    ipset_groups: dict[int, IPSetKeys]  # set number -> its trie keys
    ids: dict[bytes, bytes]
    rules: dict[bytes, bytes]
    endpoints: dict[bytes, bytes]
    wep_sources: dict[bytes, bytes]
    untracked: dict[bytes, bytes]
    config: dict[bytes, bytes]
    programs: dict[proto.WorkloadEndpointID, EndpointProgram]
    problems: list[str]
    pending_interfaces: list[str]
    chains_in_use: dict[Chain, int]  # chain -> start
    numbers_in_use: dict[str, set[int]]  # "sets" | "rules" | "endpoints" -> numbers
    full_maps: set[str] = field(default_factory=set)  # maps this compile ran out of
    ipset_numbers: dict[int, str] = field(default_factory=dict)  # set number -> IP set id
    # classifier (classifier.h): chain start -> instance; instance -> its index; the
    # instances this compile created (their cls_words blocks must be written)
    cls_instances: dict[int, int] = field(default_factory=dict)
    cls_indexes: dict[int, cls.Index] = field(default_factory=dict)
    cls_new: set[int] = field(default_factory=set)
    cls_l4: dict[bytes, bytes] = field(default_factory=dict)
    cls_tries: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def cls_chains(self) -> dict[bytes, bytes]:
        return {cls_chains_map.encode_index(start): cls_chains_map.encode_value(inst)
                for start, inst in self.cls_instances.items()}

    def cls_words(self, instances: Iterable[int] | None = None) -> dict[bytes, bytes]:
        """cls_words entries of `instances` (default: the new ones)."""
        out: dict[bytes, bytes] = {}
        for inst in (self.cls_new if instances is None else instances):
            out.update(self.cls_indexes[inst].entries(inst)[0])
        return out

    @property
    def ipsets(self) -> dict[bytes, bytes]:
        """Every trie entry (built on demand: managers use `ipset_groups`)."""
        value = ipsets_map.VALUE
        out: dict[bytes, bytes] = {}
        for group in self.ipset_groups.values():
            out.update(dict.fromkeys(group.keys, value))
        return out

    def all_rules(self) -> dict[bytes, bytes]:
        out = {}
        for chain, start in self.chains_in_use.items():
            for i, rec in enumerate(chain):
                out[rules_map.encode_index(start + i)] = _encode_record(rec)
        return out

    def maps(self) -> dict[str, dict[bytes, bytes]]:
        """Map name -> desired entries (rules: only the newly placed chains)."""
        return {"ipsets": self.ipsets, "ids": self.ids, "rules": self.rules,
                "endpoints": self.endpoints, "wep_sources": self.wep_sources,
                "untracked": self.untracked, "config": self.config,
                "cls_chains": self.cls_chains, "cls_words": self.cls_words(),
                "cls_l4": self.cls_l4, "cls_tries": self.cls_tries}


_ENCODED: dict[RuleRecord, bytes] = {}
_MISSING = object()


def _encode_record(rec: RuleRecord) -> bytes:
    raw = _ENCODED.get(rec)
    if raw is None:
        if len(_ENCODED) > 200_000:
            _ENCODED.clear()
        raw = _ENCODED[rec] = rules_map.encode(rec)
    return raw


# --- adoption ----------------------------------------------------------------------------------


@dataclass
class AdoptedState:
    """What a restarted agent finds pinned: id allocations and placed chains."""

    ids: dict[IdKind, dict[int, str]] = field(default_factory=dict)
    chains: list[tuple[int, Chain]] = field(default_factory=list)  # (start, records)
    cls_blocks: dict[int, int] = field(default_factory=dict)  # instance -> block size
    # chain start -> (instance, its cls_words, cls_l4 and cls_tries entries as found)
    cls_found: dict[int, tuple[int, dict[bytes, bytes], dict[bytes, bytes],
                               dict[bytes, bytes]]] = field(default_factory=dict)

    @classmethod
    def from_maps(cls, ids: Any, endpoints: Any, rules: Any, cls_chains: Any = None,
                  cls_words: Any = None, cls_l4: Any = None, cls_tries: Any = None
                  ) -> AdoptedState:
        """Read the pinned ids, endpoints and rules maps (BpfMap or FakeMap), and the
        classifier blocks the adopted chains use (kept until new ones replace them)."""
        by_kind = ids_map.read_all(ids)
        regions = set()
        for _, v in endpoints.items():
            e = endpoints_map.decode_value(v)
            for d in DIRECTIONS:
                if e[d]["len"]:
                    regions.add((e[d]["start"], e[d]["len"]))
        chains = []
        for start, length in sorted(regions):
            try:
                chains.append((start, rules_map.read_chain(rules, start, length)))
            except IndexError:
                continue  # a region outside the array: nothing to adopt
        blocks: dict[int, int] = {}
        found: dict[int, tuple[int, dict[bytes, bytes], dict[bytes, bytes],
                               dict[bytes, bytes]]] = {}
        if cls_chains is not None and cls_words is not None:
            by_inst: dict[int, tuple[dict[bytes, bytes], dict[bytes, bytes]]] = {}
            for m, pos in ((cls_l4, 0), (cls_tries, 1)):
                for k, v in (m.items() if m is not None else ()):
                    inst = struct.unpack_from("=I", k, 0 if pos == 0 else 4)[0]
                    by_inst.setdefault(inst, ({}, {}))[pos][k] = v
            for start, _ in chains:
                raw = cls_chains.lookup(cls_chains_map.encode_index(start))
                inst = cls_chains_map.decode_u32(raw) if raw is not None else 0
                if not inst:
                    continue
                size = cls_words_map.read_header(cls_words, inst)["block_words"]
                if not size or inst + size > cls_words.max_entries:
                    continue
                blocks[inst] = size
                words = {}
                for i in range(inst, inst + size):
                    key = cls_words_map.encode_index(i)
                    words[key] = cls_words.lookup(key) or b""
                l4, tries = by_inst.get(inst, ({}, {}))
                found[start] = (inst, words, l4, tries)
        return cls(ids=by_kind, chains=chains, cls_blocks=blocks, cls_found=found)


# --- the compiler ----------------------------------------------------------------------------


class PolicyCompiler:
    """Long-lived: owns the id allocators and the chain layout across compiles."""

    def __init__(
        self,
        *,
        rules_capacity: int = rules_map.PARAMS.max_entries,
        max_chain_records: int = rules_map.max_chain_records(),
        rule_counters: int = counters_map.RULE_COUNTERS.max_entries,
        endpoint_counters: int = counters_map.EP_COUNTERS.max_entries,
        adopted: AdoptedState | None = None,
        cls_words: int = cls_words_map.PARAMS.max_entries,
        cls_tries: int = 1 << 20,
        cls_l4: int = 65536,
    ) -> None:
        adopted = adopted or AdoptedState()
        self.max_chain_records = min(max_chain_records, cls.MAX_RECORDS)
        # classifier instances: key (chain, set generations) -> instance; the blocks of
        # cls_words; what the last committed compile used (kept while it may be in force)
        self.cls_capacity = {"cls_tries": cls_tries, "cls_l4": cls_l4}
        self.word_regions = WordRegions(cls_words)
        for inst, size in adopted.cls_blocks.items():
            self.word_regions.reserve(inst, size)
        self._cls_found = dict(adopted.cls_found)  # checked against the first builds
        self._instances: dict[tuple, int] = {}
        self._indexes: dict[int, cls.Index] = {}
        self._index_entries: dict[int, tuple[dict[bytes, bytes], dict[bytes, bytes]]] = {}
        self._members_cache: dict[tuple[int, int], tuple[cls.Member, ...]] = {}
        self._committed_cls: dict[int, int] = {}  # chain start -> instance, last commit
        self._cls_union: tuple[tuple, dict[bytes, bytes], dict[bytes, bytes]] | None = None
        self._uncommitted_cls: set[int] = set()
        self._committed_refs: dict[tuple[proto.WorkloadEndpointID, str], ChainRef] = {}
        # IP sets and compiler-made net sets share the trie's set-id space
        self.set_ids = IdAllocator((IdKind.IPSET, IdKind.NETSET), adopted=adopted.ids)
        self.rule_ids = IdAllocator((IdKind.RULE,), limit=rule_counters, adopted=adopted.ids)
        self.endpoint_ids = IdAllocator((IdKind.ENDPOINT,), limit=endpoint_counters,
                                        adopted=adopted.ids)
        self.layout = ChainLayout(rules_capacity)
        for start, chain in adopted.chains:
            self.layout.adopt(chain, start)
        self._netset_members: dict[int, tuple[str, ...]] = {}
        self._encoded_sets: dict[str, _EncodedSet] = {}  # by IP set id
        self._netset_groups: dict[int, tuple[tuple[str, ...], IPSetKeys]] = {}
        self._generation = 0
        self._fragments: dict[tuple[Any, str], tuple[Any, _Fragment]] = {}
        self._counter_problems: list[str] = []
        # counter name (ids form) -> the rule it counts, for the metrics; pruned with the
        # counter ids by commit()
        self.counter_meta: dict[str, proto.RuleMeta] = {}
        self.unavailable_ipsets: frozenset[str] = frozenset()
        self.host_endpoint_ifaces: Mapping[str, proto.HostEndpointID] | None = None
        self._ep_keys: dict[int, tuple[proto.WorkloadEndpoint, tuple]] = {}
        self._key_intern: dict[tuple, tuple] = {}
        self._endpoint_order: tuple[Any, int, int, list[proto.WorkloadEndpointID]] | None = None

    # ids

    def counter_id(self, name: str) -> int:
        """Counter for a rule; 0 (uncounted) if the counter map is exhausted."""
        try:
            return self.rule_ids.allocate(name)
        except MapFullError as e:
            self._counter_problems.append(f"rule {name!r}: not counted: {e}")
            return 0

    # per-endpoint memo keys

    def _chain_key(self, ep: proto.WorkloadEndpoint) -> tuple:
        """(tiers, profile_ids) of `ep`, as ONE shared tuple object per distinct content, so
        the per-compile chain memo hashes a small key and compares it by identity (hashing
        the tiers of a thousand endpoints on every compile was a visible cost)."""
        hit = self._ep_keys.get(id(ep))
        if hit is not None and hit[0] is ep:
            return hit[1]
        content = (ep.tiers, ep.profile_ids)
        if len(self._ep_keys) > 100_000 or len(self._key_intern) > 100_000:
            self._ep_keys.clear()  # bounded memory; entries are rebuilt on demand
            self._key_intern.clear()
        key = self._key_intern.setdefault(content, content)
        self._ep_keys[id(ep)] = (ep, key)
        return key

    def _sorted_endpoints(self, state: PolicyState) -> list[proto.WorkloadEndpointID]:
        """Endpoint ids in order, re-sorted only when the set of ids changed."""
        cached = self._endpoint_order
        if cached is None or cached[0] is not state or cached[1] != len(state.endpoints) \
                or cached[2] != state.endpoints_version:
            cached = self._endpoint_order = (state, len(state.endpoints),
                                             state.endpoints_version, sorted(state.endpoints))
        return cached[3]

    # fragments

    def _fragment(self, key: Any, obj: Any, rules: tuple[proto.Rule, ...], where: str,
                  counter_prefix: str, state: PolicyState) -> _Fragment:
        cached = self._fragments.get(key)
        if cached is not None and cached[0] is obj and self._fragment_valid(cached[1], state):
            frag = cached[1]
            self._netset_members.update(frag.netsets)
            return frag
        lowerer = _RuleLowerer(self, state)
        records: list[RuleRecord] = []
        jumps: list[int | str | None] = []
        for i, rule in enumerate(rules):
            rwhere = f"{where} rule {i}"
            counter_name = rule.rule_id or f"{counter_prefix}/{i}"
            kind, owner, direction = key
            self.counter_meta[ids_map.stored_name(counter_name)] = proto.RuleMeta(
                kind, owner.tier if kind == "policy" else "",
                owner.name if kind == "policy" else owner, direction, i, rule.action)
            lowered = lowerer.lower(rule, rwhere, counter_name)
            if lowered is None:
                continue
            recs, js = lowered
            base = len(records)
            records += recs
            jumps += [base + j if isinstance(j, int) else j for j in js]
        frag = _Fragment(tuple(records), tuple(jumps), frozenset(lowerer.ipsets_used),
                         tuple(sorted(lowerer.netsets.items())),
                         frozenset(r.counter_id for r in records if r.counter_id))
        self._netset_members.update(frag.netsets)
        self._fragments[key] = (obj, frag)
        return frag

    def _fragment_valid(self, frag: _Fragment, state: PolicyState) -> bool:
        """A cached fragment is reusable if every number it holds is still allocated to
        the same thing and every IP set it references still exists with its type."""
        for name, typ in frag.ipsets_used:
            s = state.ipsets.get(name)
            if s is None or s.type != typ or self.set_ids.get(name, IdKind.IPSET) is None \
                    or name in self.unavailable_ipsets:
                return False
        return all(n in self.set_ids.by_number for n, _ in frag.netsets) and all(
            n in self.rule_ids.by_number for n in frag.counter_ids)

    def _chain(self, state: PolicyState, tiers: tuple[proto.TierInfo, ...],
               profile_ids: tuple[str, ...], direction: str) -> Chain:
        b = _ChainBuilder()
        inbound = direction == INGRESS
        for tier in tiers:
            names = tier.ingress_policies if inbound else tier.egress_policies
            if not names:
                continue
            next_tier = _Label()
            for name in names:
                pid = proto.PolicyID(tier.name, name)
                policy = state.policies.get(pid)
                where = f"policy {tier.name}/{name} ({direction})"
                if policy is None:
                    raise CompileError(f"{where}: unknown policy")
                rules = policy.inbound_rules if inbound else policy.outbound_rules
                frag = self._fragment(("policy", pid, direction), policy, rules, where,
                                      f"policy:{tier.name}/{name}/{direction}", state)
                b.add_fragment(frag, next_tier)
            action = str(tier.default_action).lower()
            if action == "deny":
                name = f"tier-end:{tier.name}/{direction}"
                self.counter_meta[name] = proto.RuleMeta("tier-end", tier.name, "", direction, -1,
                                                   "deny")
                b.emit(RuleRecord(Action.DENY, counter_id=self.counter_id(name)))
            elif action != "pass":
                raise CompileError(f"tier {tier.name!r}: field default_action: "
                                   f"{tier.default_action!r} is not deny or pass")
            b.mark(next_tier)
        for profile_id in profile_ids:
            profile = state.profiles.get(profile_id)
            where = f"profile {profile_id} ({direction})"
            if profile is None:
                raise CompileError(f"{where}: unknown profile")
            next_profile = _Label()
            rules = profile.inbound_rules if inbound else profile.outbound_rules
            frag = self._fragment(("profile", profile_id, direction), profile, rules, where,
                                  f"profile:{profile_id}/{direction}", state)
            b.add_fragment(frag, next_profile)
            b.mark(next_profile)
        self.counter_meta[f"default-deny/{direction}"] = proto.RuleMeta(
            "default-deny", "", "", direction, -1, "deny")
        b.emit(RuleRecord(Action.DENY, counter_id=self.counter_id(f"default-deny/{direction}")))
        chain = b.finish()
        if len(chain) > self.max_chain_records:
            raise CompileError(f"{direction} chain has {len(chain)} records, more than the "
                               f"{self.max_chain_records} the walker can evaluate")
        return chain

    # the whole dataplane

    def compile(self, state: PolicyState, ifindexes: Mapping[str, int], *,
                unavailable_ipsets: frozenset[str] = frozenset(),
                host_endpoint_ifaces: Mapping[str, proto.HostEndpointID] | None = None,
                ) -> CompiledDataplane:
        """Desired map contents for `state`; `ifindexes` maps interface names to ifindexes
        (from netlink). `unavailable_ipsets`: IP sets the manager could not write (the
        trie was full): their members are left out and every chain direction that
        references one becomes DENY (fail closed), with a problem naming it.
        When the rules array has no room for an endpoint's chain, that endpoint direction
        gets a DENY chain instead ("rules" in `full_maps`, a problem names it); other
        endpoints are unaffected. `host_endpoint_ifaces` (interface or "*" -> host endpoint,
        as the dataplane resolved them from names and expected IPs) places host endpoints'
        untracked denies; without it they are placed by name."""
        self._counter_problems = []
        self.host_endpoint_ifaces = host_endpoint_ifaces
        self._netset_members = {}
        self.unavailable_ipsets = frozenset(unavailable_ipsets)
        return self._compile(state, ifindexes)

    def _compile(self, state: PolicyState, ifindexes: Mapping[str, int]) -> CompiledDataplane:
        problems: list[str] = []
        pending: list[str] = []
        programs: dict[proto.WorkloadEndpointID, EndpointProgram] = {}
        chains_in_use: dict[Chain, int] = {}
        new_rules: dict[bytes, bytes] = {}
        endpoints: dict[bytes, bytes] = {}
        sources: dict[bytes, bytes] = {}
        memo: dict[tuple, Chain] = {}
        placed: dict[int, int] = {}  # id(chain) -> start, for chains held alive by memo
        used_endpoint_ids: set[int] = set()
        full_maps: set[str] = set()

        # IP sets first: every set in state gets a number (sorted: deterministic numbers)
        for set_name in sorted(state.ipsets):
            self.set_ids.allocate(set_name, IdKind.IPSET)

        def chain_for(ep: proto.WorkloadEndpoint, direction: str) -> Chain:
            key = (self._chain_key(ep), direction)
            chain = memo.get(key)
            if chain is None:
                chain = memo[key] = self._chain(state, ep.tiers, ep.profile_ids, direction)
            return chain

        ifindex_owner: dict[int, proto.WorkloadEndpointID] = {}
        for wid in self._sorted_endpoints(state):
            ep = state.endpoints[wid]
            name = f"{wid.orchestrator}/{wid.workload}/{wid.endpoint}"
            try:
                endpoint_id = self.endpoint_ids.allocate(name)
            except MapFullError as e:
                problems.append(f"endpoint {name}: not counted: {e}")
                endpoint_id = 0
            used_endpoint_ids.add(endpoint_id)
            flags = 0 if ep.state == "active" else endpoints_map.FLAG_ADMIN_DOWN
            chains: dict[str, Chain] = {}
            for direction in DIRECTIONS:
                if flags:
                    chains[direction] = ()
                    continue
                try:
                    chains[direction] = chain_for(ep, direction)
                except CompileError as e:
                    problems.append(f"endpoint {name}: {e}; denying all {direction} traffic")
                    chains[direction] = DENY_ALL
            refs = {}
            unplaced = False
            for direction in DIRECTIONS:
                chain = chains[direction]
                # chains are memoised tuples: place each distinct object once (hashing a
                # long chain is the expensive part)
                start = placed.get(id(chain))
                if start is None:
                    try:
                        start, is_new = self.layout.place(chain)
                    except MapFullError as e:
                        full_maps.add("rules")
                        if chain is DENY_ALL:
                            problems.append(f"endpoint {name}: {e}; not programmed (its "
                                            f"traffic is dropped)")
                            unplaced = True
                            break
                        problems.append(f"endpoint {name}: {e}; denying all {direction} "
                                        f"traffic")
                        chain = DENY_ALL
                        start = placed.get(id(chain))
                        is_new = False
                        if start is None:
                            try:
                                start, is_new = self.layout.place(chain)
                            except MapFullError:
                                problems.append(f"endpoint {name}: not programmed (its "
                                                f"traffic is dropped)")
                                unplaced = True
                                break
                    placed[id(chain)] = start
                    if chain:
                        chains_in_use[chain] = start
                    if is_new:
                        for i, rec in enumerate(chain):
                            new_rules[rules_map.encode_index(start + i)] = _encode_record(rec)
                refs[direction] = ChainRef(start, chain)
            if unplaced:
                continue  # no endpoints entry: the programs drop its traffic (fail closed)
            ifindex = ifindexes.get(ep.name)
            if ifindex is None:
                pending.append(ep.name)
            elif ifindex in ifindex_owner:
                problems.append(f"endpoint {name}: interface {ep.name!r} (ifindex {ifindex}) "
                                f"is already used by {ifindex_owner[ifindex]}; ignored")
                ifindex = None
            else:
                ifindex_owner[ifindex] = wid
                endpoints[endpoints_map.encode_key(ifindex)] = endpoints_map.encode_value(
                    endpoint_id, flags,
                    (refs[INGRESS].start, refs[INGRESS].length),
                    (refs[EGRESS].start, refs[EGRESS].length))
                sources.update(self._sources(name, ep, ifindex, problems))
            programs[wid] = EndpointProgram(ep.name, ifindex, endpoint_id, flags,
                                            refs[INGRESS], refs[EGRESS])

        untracked = self._untracked(state, ifindexes, problems, pending)
        ipsets = self._ipset_entries(state, problems)
        cfg = self._config(state, problems)
        cls_instances, cls_new = self._attach_classifiers(
            chains_in_use, new_rules, programs, endpoints, ipsets, problems, full_maps)
        parts = sorted((inst, *self._encoded_entries(inst))
                       for inst in set(cls_instances.values()))
        union_key = tuple((inst, id(l4), id(tries)) for inst, l4, tries in parts)
        if self._cls_union is not None and self._cls_union[0] == union_key:
            cls_l4, cls_tries = self._cls_union[1], self._cls_union[2]
        else:  # the same dicts when nothing changed: the manager then skips its diff
            cls_l4, cls_tries = {}, {}
            for _, l4, tries in parts:
                cls_l4.update(l4)
                cls_tries.update(tries)
            self._cls_union = (union_key, cls_l4, cls_tries)

        used_rule_ids = {r.counter_id for c in chains_in_use for r in c if r.counter_id}
        used_rule_ids |= {untracked_map.decode_value(v)["counter_id"] for v in untracked.values()}
        used_rule_ids.discard(0)
        set_numbers = {self.set_ids.allocate(n, IdKind.IPSET) for n in state.ipsets}
        set_numbers |= set(self._netset_members)
        numbers = {"sets": set_numbers, "rules": used_rule_ids,
                   "endpoints": used_endpoint_ids - {0}}
        ids_entries = self.set_ids.entries(set_numbers)
        ids_entries.update(self.rule_ids.entries(numbers["rules"]))
        ids_entries.update(self.endpoint_ids.entries(numbers["endpoints"]))
        problems += self._counter_problems
        return CompiledDataplane(
            ipset_groups=ipsets, ids=ids_entries, rules=new_rules, endpoints=endpoints,
            wep_sources=sources, untracked=untracked, config=cfg, programs=programs,
            problems=problems, pending_interfaces=sorted(set(pending)),
            chains_in_use=chains_in_use, numbers_in_use=numbers, full_maps=full_maps,
            ipset_numbers={self.set_ids.allocate(n, IdKind.IPSET): n for n in state.ipsets},
            cls_instances=cls_instances,
            cls_indexes={i: self._indexes[i] for i in set(cls_instances.values())},
            cls_new=cls_new, cls_l4=cls_l4, cls_tries=cls_tries,
        )

    # classifier instances (classifier.h, agent.bpf.classifier)

    def _members(self, number: int, groups: Mapping[int, IPSetKeys]) -> tuple[cls.Member, ...]:
        group = groups.get(number)
        if group is None:
            return ()
        key = (number, group.generation)
        hit = self._members_cache.get(key)
        if hit is None:
            if len(self._members_cache) > 4096:
                self._members_cache.clear()
            hit = self._members_cache[key] = _members_of(group)
        return hit

    def _instance(self, chain: Chain, start: int, groups: Mapping[int, IPSetKeys]
                  ) -> tuple[int, bool]:
        """(instance, new) for `chain` with the current members of the sets it checks.
        Raises ClassifierError, or MapFullError("cls_words")."""
        gens = tuple((n, groups[n].generation if n in groups else -1)
                     for n in _referenced_sets(chain))
        key = (chain, gens)
        inst = self._instances.get(key)
        if inst is not None:
            return inst, False
        inst = self._update_in_place(chain, gens, groups)
        if inst is not None:
            self._instances[key] = inst
            return inst, False
        index = cls.build_index(chain, lambda n: self._members(n, groups))
        found = self._cls_found.pop(start, None)
        if found is not None and (found[1], found[2], found[3]) == index.entries(found[0]):
            inst = found[0]  # a restarted agent: the pinned classifier is this one
            self._instances[key] = inst
            self._indexes[inst] = index
            return inst, False
        for (old_chain, _), old in self._instances.items():
            prev = self._indexes.get(old)
            if prev is not None and (old_chain is chain or old_chain == chain) \
                    and prev.words == index.words \
                    and prev.l4 == index.l4 and prev.fixed == index.fixed:
                # only trie entries differ (set members came or went, and their
                # signatures' vectors already exist): update that instance in place, entry
                # by entry, as the ipsets trie is
                self._instances = {k: v for k, v in self._instances.items() if v != old}
                self._instances[key] = old
                self._indexes[old] = index
                self._index_entries.pop(old, None)
                return old, False
        inst = self.word_regions.allocate(index.size)
        self._instances[key] = inst
        self._indexes[inst] = index
        return inst, True

    def _update_in_place(self, chain: Chain, gens: tuple[tuple[int, int], ...],
                         groups: Mapping[int, IPSetKeys]) -> int | None:
        """The instance of `chain` built for earlier generations of its sets, brought up to
        date from the sets' deltas (trie entries only, written entry by entry), or None
        when that needs a rebuild (cls.update_members says when)."""
        for (old_chain, old_gens), inst in list(self._instances.items()):
            if not (old_chain is chain or old_chain == chain):
                continue
            index = self._indexes.get(inst)
            if index is None or [n for n, _ in old_gens] != [n for n, _ in gens]:
                continue
            changed = {n: old for (n, g), (_, old) in zip(gens, old_gens, strict=True) if g != old}
            if not all((group := groups.get(n)) is not None and group.base_generation == old
                       for n, old in changed.items()):
                continue
            if not cls.can_update(index, changed) or sum(
                    len(groups[n].added) + len(groups[n].removed) for n in changed) > 50_000:
                return None  # a rebuild: a side without a trie, or a delta as big as a set
            deltas = {n: (_members_from_keys(groups[n].added),
                          _members_from_keys(groups[n].removed)) for n in changed}
            changes = cls.update_members(index, deltas)
            if changes is None:
                return None
            tries = dict(index.tries)
            for k, v in changes.items():
                if v is None:
                    tries.pop(k, None)
                else:
                    tries[k] = v
            index.tries = tries
            encoded = self._index_entries.get(inst)
            if encoded is not None:
                enc_tries = dict(encoded[1])
                for (side, proto_num, port, value, plen), v in changes.items():
                    k = cls_tries_map.encode_key(inst, side, proto_num, port, value, plen)
                    if v is None:
                        enc_tries.pop(k, None)
                    else:
                        enc_tries[k] = cls_tries_map.encode_value(inst + v)
                self._index_entries[inst] = (encoded[0], enc_tries)
            del self._instances[(old_chain, old_gens)]
            return inst
        return None

    def _forget_instance(self, inst: int) -> None:
        self._uncommitted_cls.discard(inst)
        self.word_regions.blocks.pop(inst, None)
        self._indexes.pop(inst, None)
        self._index_entries.pop(inst, None)
        self._instances = {k: v for k, v in self._instances.items() if v != inst}

    def _encoded_entries(self, inst: int) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        hit = self._index_entries.get(inst)
        if hit is None:
            _, l4, tries = self._indexes[inst].entries(inst)
            hit = self._index_entries[inst] = (l4, tries)
        return hit

    def _attach_classifiers(self, chains_in_use: dict[Chain, int], new_rules: dict[bytes, bytes],
                            programs: dict[proto.WorkloadEndpointID, EndpointProgram],
                            endpoints: dict[bytes, bytes], groups: Mapping[int, IPSetKeys],
                            problems: list[str], full_maps: set[str]
                            ) -> tuple[dict[int, int], set[int]]:
        """A classifier instance for every chain in use: (chain start -> instance, new
        instances). A chain whose classifier cannot be built or does not fit the classifier
        maps is not installed: its endpoints keep the chain they had at the last commit
        (the previous policy stays in force), or deny that direction if they had none."""
        instances: dict[int, int] = {}
        new: set[int] = set()
        failed: dict[int, tuple[str, str]] = {}  # start -> (map, reason)
        used = dict.fromkeys(self.cls_capacity, 0)
        counted: set[int] = set()

        def count(inst: int) -> None:
            index = self._indexes.get(inst)
            if index is not None and inst not in counted:
                counted.add(inst)
                used["cls_tries"] += len(index.tries)
                used["cls_l4"] += len(index.l4)

        # still in the kernel until this compile's deletes: the last commit's instances and
        # those of compiles since (before InSync nothing is committed or deleted)
        for inst in set(self._committed_cls.values()) | self._uncommitted_cls:
            count(inst)

        def attach(chain: Chain, start: int) -> tuple[str, str] | None:
            try:
                inst, is_new = self._instance(chain, start, groups)
            except cls.ClassifierError as e:
                return "classifier", f"the classifier cannot index it: {e}"
            except MapFullError as e:
                return e.map_name, str(e)
            if inst not in counted:
                index = self._indexes[inst]
                for name, n in (("cls_tries", len(index.tries)), ("cls_l4", len(index.l4))):
                    if used[name] + n > self.cls_capacity[name]:
                        if is_new:
                            self._forget_instance(inst)
                        return name, (f"BPF map {name!r} is full (max_entries="
                                      f"{self.cls_capacity[name]}): {n} entries do not fit")
                count(inst)
            instances[start] = inst
            if is_new:
                new.add(inst)
            return None

        for chain, start in sorted(chains_in_use.items(), key=lambda kv: kv[1]):
            err = attach(chain, start)
            if err is not None:
                failed[start] = err
        self._uncommitted_cls |= set(instances.values())
        if not failed:
            return instances, new
        for chain, start in list(chains_in_use.items()):
            if start in failed:
                del chains_in_use[chain]
                for i in range(len(chain)):
                    new_rules.pop(rules_map.encode_index(start + i), None)
        for wid, prog in list(programs.items()):
            refs = {INGRESS: prog.ingress, EGRESS: prog.egress}
            changed = False
            name = f"{wid.orchestrator}/{wid.workload}/{wid.endpoint}"
            for direction, ref in refs.items():
                if not ref.length or ref.start not in failed:
                    continue
                map_name, reason = failed[ref.start]
                full_maps.add(map_name)
                changed = True
                prev = self._committed_refs.get((wid, direction))
                if prev is not None and prev.start in self._committed_cls \
                        and prev.start not in failed:
                    refs[direction] = prev
                    chains_in_use[prev.records] = prev.start
                    instances[prev.start] = self._committed_cls[prev.start]
                    counted.add(instances[prev.start])
                    problems.append(f"endpoint {name}: {direction} policy not installed: "
                                    f"{reason}; the previous policy stays in force")
                    continue
                problems.append(f"endpoint {name}: {direction} policy not installed: "
                                f"{reason}; denying all {direction} traffic")
                try:
                    start, is_new = self.layout.place(DENY_ALL)
                except MapFullError:
                    refs[direction] = ChainRef(0, ())  # empty chain: the programs deny
                    continue
                if is_new:
                    new_rules[rules_map.encode_index(start)] = _encode_record(DENY_ALL[0])
                if start not in instances and attach(DENY_ALL, start) is not None:
                    refs[direction] = ChainRef(0, ())
                    continue
                chains_in_use[DENY_ALL] = start
                refs[direction] = ChainRef(start, DENY_ALL)
            if not changed:
                continue
            programs[wid] = EndpointProgram(prog.iface, prog.ifindex, prog.endpoint_id,
                                            prog.flags, refs[INGRESS], refs[EGRESS])
            if prog.ifindex is not None:
                key = endpoints_map.encode_key(prog.ifindex)
                if key in endpoints:
                    endpoints[key] = endpoints_map.encode_value(
                        prog.endpoint_id, prog.flags,
                        (refs[INGRESS].start, refs[INGRESS].length),
                        (refs[EGRESS].start, refs[EGRESS].length))
        self._uncommitted_cls |= set(instances.values())
        return instances, new

    def commit(self, compiled: CompiledDataplane) -> None:
        """The kernel now holds `compiled`: free ids and regions it no longer uses."""
        freed = bool(self.set_ids.retain_only(compiled.numbers_in_use["sets"]))
        freed |= bool(self.rule_ids.retain_only(compiled.numbers_in_use["rules"]))
        live = {name for _, name in self.rule_ids.by_name}
        for name in [n for n in self.counter_meta if n not in live]:
            del self.counter_meta[name]
        freed |= bool(self.endpoint_ids.retain_only(compiled.numbers_in_use["endpoints"]))
        self.layout.retain_only(compiled.chains_in_use)
        in_force = set(compiled.cls_instances.values())
        self.word_regions.retain_only(in_force)
        self._instances = {k: v for k, v in self._instances.items() if v in in_force}
        self._indexes = {k: v for k, v in self._indexes.items() if k in in_force}
        self._index_entries = {k: v for k, v in self._index_entries.items() if k in in_force}
        self._committed_cls = dict(compiled.cls_instances)
        self._uncommitted_cls = set()
        self._committed_refs = {}
        for wid, prog in compiled.programs.items():
            self._committed_refs[(wid, INGRESS)] = prog.ingress
            self._committed_refs[(wid, EGRESS)] = prog.egress
        if freed:
            self._fragments.clear()

    # other maps

    @staticmethod
    def _sources(name: str, ep: proto.WorkloadEndpoint, ifindex: int, problems: list[str]
                 ) -> dict[bytes, bytes]:
        """`wep_sources` entries of one endpoint: its own addresses (both families) and its
        allowed spoofed prefixes. A prefix that does not parse is left out (its sources stay
        dropped) and reported."""
        out: dict[bytes, bytes] = {}
        for field_name, prefixes in (("ipNetworks", ep.ipv4_nets + ep.ipv6_nets),
                                     ("allowSpoofedSourcePrefixes",
                                      ep.allow_spoofed_source_prefixes)):
            for prefix in prefixes:
                try:
                    out.update(sources_map.entries_for(ifindex, [prefix]))
                except ValueError:
                    problems.append(f"endpoint {name}: {field_name} {prefix!r} is not a "
                                    f"CIDR; sources in it are dropped")
        return out

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def _ipset_entries(self, state: PolicyState, problems: list[str]
                       ) -> dict[int, IPSetKeys]:
        groups: dict[int, IPSetKeys] = {}
        cache: dict[str, _EncodedSet] = {}
        for set_name in sorted(state.ipsets):
            s = state.ipsets[set_name]
            number = self.set_ids.allocate(set_name, IdKind.IPSET)
            if set_name in self.unavailable_ipsets:
                continue  # left out whole; rules using it compile to DENY
            enc = self._encoded_sets.get(set_name)
            if enc is None or enc.number != number or enc.state is not s:
                enc = self._encode_set(set_name, s, number, enc)
            elif enc.version != s.version:
                changes = s.changes_since(enc.version)
                enc = (self._encode_delta(set_name, enc, changes) if changes is not None
                       else self._encode_set(set_name, s, number, enc))
            cache[set_name] = enc
            problems += enc.problems.values()
            groups[number] = enc.group
        self._encoded_sets = cache
        netsets = {}
        for number, nets in self._netset_members.items():
            hit = self._netset_groups.get(number)
            if hit is None or hit[0] != nets:
                keys = dict.fromkeys(ipsets_map.key_for(number, ipaddress.ip_network(n))
                                     for n in nets)
                hit = (nets, IPSetKeys(keys, self._next_generation()))
            netsets[number] = hit
            groups[number] = hit[1]
        self._netset_groups = netsets
        return groups

    def _encode_set(self, set_name: str, s: IPSetState, number: int,
                    previous: _EncodedSet | None) -> _EncodedSet:
        """Every member's key (members seen before under the same number are looked up,
        not parsed again)."""
        known = previous.encoded if previous is not None and previous.number == number else {}
        encoded: dict[str, bytes | str | None] = {}
        for member in s.members:
            key = known.get(member, _MISSING)
            if key is _MISSING:
                try:
                    key = ipsets_map.member_key(number, member)
                except ValueError as e:
                    key = f"IP set {set_name}: {e}; member ignored"
            encoded[member] = key  # type: ignore[assignment]
        counts: dict[bytes, int] = {}
        problems: dict[str, str] = {}
        for member, key in encoded.items():
            if isinstance(key, bytes):
                counts[key] = counts.get(key, 0) + 1
            elif isinstance(key, str):
                problems[member] = key
        group = IPSetKeys(dict.fromkeys(counts), self._next_generation())
        return _EncodedSet(s, s.version, number, encoded, counts, problems, group)

    def _encode_delta(self, set_name: str, enc: _EncodedSet,
                      changes: list[tuple[int, frozenset[str], frozenset[str]]]
                      ) -> _EncodedSet:
        """The next generation from the recorded deltas: O(size of the deltas) plus a
        C-level copy of the key dict (published generations are never mutated)."""
        counts = enc.counts  # owned by this cache entry only: mutated in place
        before: dict[bytes, bool] = {}  # key -> present before these deltas
        for _, added, removed in changes:
            for member in removed:
                key = enc.encoded.pop(member, None)
                enc.problems.pop(member, None)
                if isinstance(key, bytes):
                    before.setdefault(key, True)
                    left = counts.get(key, 0) - 1
                    if left > 0:
                        counts[key] = left
                    else:
                        counts.pop(key, None)
            for member in added:
                if member in enc.encoded:
                    continue
                try:
                    key = ipsets_map.member_key(enc.number, member)
                except ValueError as e:
                    enc.encoded[member] = enc.problems[member] = (
                        f"IP set {set_name}: {e}; member ignored")
                    continue
                enc.encoded[member] = key
                if isinstance(key, bytes):
                    before.setdefault(key, key in counts)
                    counts[key] = counts.get(key, 0) + 1
        added_keys = tuple(k for k, was in before.items() if not was and k in counts)
        removed_keys = tuple(k for k, was in before.items() if was and k not in counts)
        keys = dict(enc.group.keys)
        for k in removed_keys:
            del keys[k]
        keys.update(dict.fromkeys(added_keys))
        group = IPSetKeys(keys, self._next_generation(), enc.group.generation, added_keys,
                          removed_keys)
        enc.version = enc.state.version
        enc.group = group
        return enc

    def _untracked(self, state: PolicyState, ifindexes: Mapping[str, int],
                   problems: list[str], pending: list[str]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        if self.host_endpoint_ifaces is not None:
            pairs = sorted((iface, hid) for iface, hid in self.host_endpoint_ifaces.items()
                           if hid in state.host_endpoints)
        else:  # by name only (an endpoint known by its expected IPs needs the resolution)
            pairs = sorted((hep.name, hid) for hid, hep in state.host_endpoints.items()
                           if hep.name)
        for iface, hid in pairs:
            hep = state.host_endpoints[hid]
            if iface == "*":
                ifindex: int | None = 0
            else:
                ifindex = ifindexes.get(iface)
                if ifindex is None:
                    pending.append(iface)
                    continue
            for src, counter in self._leading_src_denies(state, hep, problems):
                key = untracked_map.encode_key(ifindex, src)
                out.setdefault(key, untracked_map.encode_value(counter))
        return out

    def _leading_src_denies(self, state: PolicyState, hep: proto.HostEndpoint,
                            problems: list[str]) -> list[tuple[str, int]]:
        """(source prefix, counter id) of the untracked inbound deny rules that come before
        any rule that could allow, pass or needs more than a source match."""
        out: list[tuple[str, int]] = []
        for tier in hep.untracked_tiers:
            for name in tier.ingress_policies:
                policy = state.policies.get(proto.PolicyID(tier.name, name))
                if policy is None:
                    problems.append(f"host endpoint {hep.name}: untracked policy "
                                    f"{tier.name}/{name} unknown; XDP rules stop there")
                    return out
                for i, rule in enumerate(policy.inbound_rules):
                    if str(rule.action).lower() == "log":
                        continue
                    srcs = self._simple_src_deny(state, rule)
                    if srcs is None:
                        return out
                    families = state.families
                    if rule.ip_version in (4, 6):  # the other family's prefixes do not apply
                        families &= {rule.ip_version}
                    srcs = [s for s in srcs if ipaddress.ip_network(s).version in families]
                    counter = self.counter_id(
                        rule.rule_id or f"policy:{tier.name}/{name}/{INGRESS}/{i}")
                    out += [(s, counter) for s in srcs]
        return out

    @staticmethod
    def _simple_src_deny(state: PolicyState, rule: proto.Rule) -> list[str] | None:
        """Source prefixes if `rule` is a deny whose only constraint is its source."""
        if str(rule.action).lower() != "deny":
            return None
        others = [
            rule.protocol, rule.not_protocol, rule.icmp_type, rule.icmp_code,
            rule.not_icmp_type, rule.not_icmp_code,
        ]
        if any(v is not None for v in others):
            return None
        if (rule.not_src_nets or rule.dst_nets or rule.not_dst_nets or rule.not_src_ip_set_ids
                or rule.dst_ip_set_ids or rule.not_dst_ip_set_ids or rule.src_ports
                or rule.not_src_ports or rule.dst_ports or rule.not_dst_ports
                or rule.src_named_port_ip_set_ids or rule.not_src_named_port_ip_set_ids
                or rule.dst_named_port_ip_set_ids or rule.not_dst_named_port_ip_set_ids):
            return None
        if rule.src_nets and not rule.src_ip_set_ids:
            try:
                nets = [ipaddress.ip_network(n, strict=False) for n in rule.src_nets]
            except ValueError:
                return None
            return sorted({str(n) for n in nets})
        if len(rule.src_ip_set_ids) == 1 and not rule.src_nets:
            s = state.ipsets.get(rule.src_ip_set_ids[0])
            if s is None or s.type != "net":
                return None
            out = set()
            for m in s.members:
                try:
                    net, _, _ = ipsets_map.parse_member(m)
                except ValueError:
                    continue
                out.add(str(net))
            return sorted(out)
        return None

    @staticmethod
    def _config(state: PolicyState, problems: list[str]) -> dict[bytes, bytes]:
        text = state.config.get("defaultendpointtohostaction", "Drop")
        try:
            action = config_map.action_from_felix(text)
        except ValueError as e:
            problems.append(f"config: {e}; using Drop")
            action = config_map.EndpointToHostAction.DROP
        try:
            rpf = config_map.rpf_from_felix(state.config.get("bpfenforcerpf", "Strict"))
        except ValueError as e:
            problems.append(f"config: {e}; using Strict")
            rpf = config_map.RpfMode.STRICT
        try:
            redirect = config_map.redirect_from_felix(
                state.config.get("bpfredirecttopeer", "Enabled"))
        except ValueError as e:
            problems.append(f"config: {e}; using Disabled")
            redirect = False
        ctlb_udp = str(state.config.get("bpfconnecttimeloadbalancing", "TCP")).lower() \
            == "enabled"
        ipv6 = str(state.config.get("ipv6support", "true")).strip().lower()
        if ipv6 not in ("true", "false", "1", "0", "yes", "no", "on", "off", ""):
            problems.append(f"config: Ipv6Support: {ipv6!r} is not a boolean; using true")
        flow_events = str(state.config.get("flowlogsfileenabled", "false")).lower() == "true"
        enabled = ipv6 not in ("false", "0", "no", "off")
        drop_vxlan_port = 0
        if state.vxlan_nodes and not _truthy(state.config.get(
                "allowvxlanpacketsfromworkloads", "false")):
            try:
                drop_vxlan_port = int(state.config.get("vxlanport", "4789"))
            except ValueError:
                drop_vxlan_port = 4789
        drop_ipip = bool(state.ipip_nodes) and not _truthy(state.config.get(
            "allowipippacketsfromworkloads", "false"))
        return {config_map.KEY: config_map.encode_value(
            action, rpf, redirect=redirect, ctlb_udp=ctlb_udp, ipv6=enabled,
            flow_events=flow_events, drop_vxlan_port=drop_vxlan_port, drop_ipip=drop_ipip)}

"""The classifier index: a chain's records -> per-field bitvector lookups (classifier.h).

Role: pure Python, no kernel. `build_index(chain, members)` turns one chain (the ordered
`RuleRecord`s the compiler emits; their fields DEFINE what each record matches, policy.h)
into an `Index`: for each packet field, the lookup entries and the bitvectors over the
chain's records that the program ANDs. `Index.entries(base)` encodes it for the maps
`cls_words` (header + sparse vectors), `cls_l4` and `cls_tries`, keyed by instance `base`.
`decide()` evaluates those encoded entries exactly as calico_policy does, so tests can
check the data the kernel reads against the reference semantics without a kernel.

Inputs: the chain, and `members(set_number) -> tuple[Member, ...]` (the members of an IP
set or compiler-made net set, both families: prefix value, prefix length, protocol, port,
family 4 or 6).
Families: the address sides keep each family's member prefixes apart (IPv6 trie entries
have SIDE_V6 in their side byte; a signature is computed within one family), and a record's
ipVersion is an L4 constraint (the L4 key carries PKT_F_IPV6), so neither adds a per-record
test: the per-packet cost stays flat.
Invariants: bit i of every vector is record i; a record's bit is set in a field's vector
exactly when the record's constraints on that field hold for every packet that reaches
the vector; the AND over fields is therefore exactly `record matches` (policy.h). Every
positive port group is ranges-only or named-only (the compiler splits mixed groups:
ranges OR named ports spans two fields). Raises `ClassifierError` for a chain it cannot
index (too many records, a mixed positive port group).

Cost model (per chain instance): n_words = ceil(records / 64). Each distinct vector costs
2 * ceil(n_words / 64) + (its non-zero words) u64s; a field has one vector per distinct
answer (port interval, address signature, protocol/ICMP key), shared when equal. Trie
entries: one per member prefix of every set the chain checks (per side), plus up to 30
per elementary port interval; l4 entries: a few per protocol / ICMP type the chain names.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pyfelix.agent.bpf.maps import cls_chains as cls_chains_map
from pyfelix.agent.bpf.maps import cls_l4 as l4_map
from pyfelix.agent.bpf.maps import cls_tries as tries_map
from pyfelix.agent.bpf.maps import cls_words as words_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps.rules import Action, RuleRecord

MAX_WORDS = 512  # must match CLS_MAX_WORDS
MAX_RECORDS = MAX_WORDS * 64
STEPS_PER_PROG = 8  # must match CLS_STEPS_PER_PROG
MAX_TAIL_CALLS = 32  # must match POLICY_MAX_TAIL_CALLS
VEC_ALL = words_map.VEC_ALL
F_L4, F_SPORT, F_DPORT, F_SADDR, F_DADDR, F_SNAMED, F_DNAMED = range(7)
N_FIELDS = 7
PORT_PROTOS = (6, 17, 132)
ICMP_PROTO = {4: 1, 6: 58}  # the ICMP protocol of each family (PKT_F_ICMP is set for it)
_M64 = (1 << 64) - 1
ADDR_BITS = {4: 32, 6: 128}

# (prefix value (host int), prefix length, protocol, port, family 4 or 6)
Member = tuple[int, int, int, int, int]


def _mask(family: int, plen: int) -> int:
    bits = ADDR_BITS[family]
    return ((1 << bits) - 1) ^ ((1 << (bits - plen)) - 1)


def _side_key(side: int, family: int) -> int:
    return side | (tries_map.SIDE_V6 if family == 6 else 0)


class ClassifierError(ValueError):
    """A chain the classifier cannot index; the message says why."""


def _bits(indices: Iterable[int], n: int) -> int:
    buf = bytearray((n + 7) // 8)
    for i in indices:
        buf[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(buf, "little")


def port_prefixes(first: int, last: int) -> list[tuple[int, int]]:
    """[first, last] (16-bit) as (value, prefix length) prefixes."""
    out = []
    while first <= last:
        size = first & -first if first else 1 << 16
        while size > last - first + 1:
            size >>= 1
        out.append((first, 16 - size.bit_length() + 1))
        first += size
    return out


@dataclass
class _SideState:
    # (family, proto, port, value, plen) -> sets
    exact: dict[tuple[int, int, int, int, int], set[int]]
    lengths: dict[tuple[int, int, int], set[int]]  # (family, proto, port) -> lengths present
    vector: Callable[[frozenset[int]], int]
    memo: dict[frozenset[int], int]


@dataclass
class Index:
    """One chain's classifier, with vector ids RELATIVE to the instance block (0 = the
    block's first word, which is the header)."""

    n_records: int
    n_words: int
    flags: int  # bit f: field f is looked up
    fixed: list[int]  # per field: relative vector id, or VEC_ALL
    l4: dict[tuple[int, int, int, int, int], int]  # (proto, pflags, type, code, level) -> vec
    tries: dict[tuple[int, int, int, int, int], int]  # (side, proto, port, value, plen) -> vec
    words: list[int]  # the block: header words are filled by entries()
    vectors: int = 0  # distinct vectors stored
    # for member deltas without a rebuild (update_members): per trie side looked up, its
    # signature state; which set numbers each side checks; vector value -> relative id
    inc: dict[int, _SideState] = field(default_factory=dict)
    referenced: dict[int, frozenset[int]] = field(default_factory=dict)
    vec_rel: dict[int, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Words of the block in cls_words."""
        return len(self.words)

    def entries(self, base: int) -> tuple[dict[bytes, bytes], dict[bytes, bytes],
                                          dict[bytes, bytes]]:
        """(cls_words, cls_l4, cls_tries) entries of this index placed at `base`."""

        def absolute(vec: int) -> int:
            return VEC_ALL if vec == VEC_ALL else base + vec

        fixed = [absolute(v) for v in self.fixed] + [self.size]  # word 4 high: block size
        header = [self.n_words | (self.flags << 32)]
        header += [fixed[2 * i] | (fixed[2 * i + 1] << 32) for i in range(4)]
        block = header + self.words[words_map.HEADER_WORDS:]
        enc_i, enc_w = words_map.encode_index, words_map.encode_word
        words = {enc_i(base + i): enc_w(w) for i, w in enumerate(block)}
        l4 = {l4_map.encode_key(base, *k): l4_map.encode_value(base + v)
              for k, v in self.l4.items()}
        tries = {tries_map.encode_key(base, side, proto, port, value, plen):
                 tries_map.encode_value(base + v)
                 for (side, proto, port, value, plen), v in self.tries.items()}
        return words, l4, tries


class _Builder:
    def __init__(self, n_records: int) -> None:
        self.n = n_records
        self.n_words = max(1, (n_records + 63) // 64)
        self.n_sum = (self.n_words + 63) // 64
        self.all = (1 << n_records) - 1
        self.words: list[int] = [0] * words_map.HEADER_WORDS
        self.vec_ids: dict[int, int] = {}

    def vec(self, v: int) -> int:
        """A token for vector v (one per distinct value); `finish()` turns tokens into
        relative ids."""
        token = self.vec_ids.get(v)
        if token is None:
            token = self.vec_ids[v] = len(self.vec_ids)
        return token

    def _encode(self, v: int) -> list[int]:
        raw = v.to_bytes(self.n_words * 8, "little")
        ws = struct.unpack(f"<{self.n_words}Q", raw)
        summary = [0] * self.n_sum
        packed = []
        for i, w in enumerate(ws):
            if w:
                summary[i >> 6] |= 1 << (i & 63)
                packed.append(w)
        rank, total = [], 0
        for s in summary:
            rank.append(total)
            total += s.bit_count()
        return summary + rank + packed

    def finish(self, idx: Index) -> None:
        """Lay the vectors out in a canonical order (by value), so the same vectors give
        the same block whatever order the fields produced them in, and rewrite the
        index's tokens as relative ids."""
        ids: dict[int, int] = {}
        for v in sorted(self.vec_ids):
            ids[self.vec_ids[v]] = len(self.words)
            self.words += self._encode(v)
        idx.vec_rel = {v: ids[t] for v, t in self.vec_ids.items()}
        idx.fixed = [v if v == VEC_ALL else ids[v] for v in idx.fixed]
        idx.l4 = {k: ids[v] for k, v in idx.l4.items()}
        idx.tries = {k: ids[v] for k, v in idx.tries.items()}
        idx.words = self.words
        idx.vectors = len(ids)


# --- per-field predicates -----------------------------------------------------------------


def _l4_sig(r: RuleRecord) -> tuple:
    has_ports = bool(r.src_ports or r.dst_ports or r.not_src_ports or r.not_dst_ports)
    return (r.protocol, r.not_protocol, r.icmp_type, r.icmp_code, r.not_icmp_type,
            r.not_icmp_code, has_ports, r.ip_version)


_NO_L4 = (None,) * 6 + (False, None)


def _l4_ok(sig: tuple, proto: int | None, pflags: int, itype: int | None,
           icode: int | None) -> bool:
    """proto/itype/icode None = a value no record names."""
    protocol, not_protocol, t, c, nt, nc, has_ports, ip_version = sig
    if ip_version is not None and (ip_version == 6) != bool(pflags & l4_map.PKT_F_IPV6):
        return False
    if protocol is not None and proto != protocol:
        return False
    if not_protocol is not None and proto == not_protocol:
        return False
    if t is not None or c is not None or nt is not None:
        if not pflags & l4_map.PKT_F_ICMP:
            return False
        if t is not None and itype != t:
            return False
        if c is not None and icode != c:
            return False
        if nt is not None and itype == nt and (nc is None or icode == nc):
            return False
    return not (has_ports and not pflags & l4_map.PKT_F_PORTS)


def _build_l4(b: _Builder, chain: tuple[RuleRecord, ...], idx: Index) -> None:
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(chain):
        groups.setdefault(_l4_sig(r), []).append(i)
    if list(groups) == [_NO_L4]:
        idx.fixed[F_L4] = VEC_ALL
        return
    masks = {sig: _bits(ix, b.n) for sig, ix in groups.items()}

    def vector(proto: int | None, pflags: int, t: int | None, c: int | None) -> int:
        v = 0
        for sig, m in masks.items():
            if _l4_ok(sig, proto, pflags, t, c):
                v |= m
        return v

    protos = {x for sig in groups for x in sig[:2] if x is not None}
    types: dict[int, set[int]] = {}
    for sig in groups:
        for t, c in ((sig[2], sig[3]), (sig[4], sig[5])):
            if t is not None:
                types.setdefault(t, set())
                if c is not None:
                    types[t].add(c)
    v6 = l4_map.PKT_F_IPV6
    icmp = l4_map.PKT_F_ICMP
    # the parser sets PKT_F_ICMP only for the family's own ICMP protocol
    pflag_values = (0, l4_map.PKT_F_PORTS, icmp, v6, l4_map.PKT_F_PORTS | v6, icmp | v6)

    def icmp_of(p: int, pf: int) -> bool:
        return bool(pf & icmp) and p == ICMP_PROTO[6 if pf & v6 else 4]

    entries: dict[tuple[int, int, int, int, int], int] = {}
    for p in sorted(protos):
        for pf in pflag_values:
            entries[(p, pf, 0, 0, l4_map.LEVEL_PROTO)] = vector(
                p, pf, None if icmp_of(p, pf) else 0, None)
    if types:
        for fam_flag in (0, v6):
            q, pf = ICMP_PROTO[6 if fam_flag else 4], icmp | fam_flag
            for t, codes in sorted(types.items()):
                for c in sorted(codes):
                    entries[(q, pf, t, c, l4_map.LEVEL_TYPE_CODE)] = vector(q, pf, t, c)
                if len(codes) < 256:
                    entries[(q, pf, t, 0, l4_map.LEVEL_TYPE)] = vector(q, pf, t, None)
            if q not in protos and len(types) < 256:
                entries[(q, pf, 0, 0, l4_map.LEVEL_PROTO)] = vector(q, pf, None, None)
    for pf in pflag_values:
        entries[(0, pf, 0, 0, l4_map.LEVEL_OTHER)] = vector(
            None, pf, None, None)
    default = entries[(0, 0, 0, 0, l4_map.LEVEL_OTHER)]
    values = set(entries.values())
    if values == {b.all}:
        idx.fixed[F_L4] = VEC_ALL
        return
    idx.fixed[F_L4] = b.vec(default)
    if len(values) == 1:
        return
    idx.flags |= 1 << F_L4
    idx.l4 = {k: b.vec(v) for k, v in entries.items()}


def _build_ports(b: _Builder, chain: tuple[RuleRecord, ...], idx: Index, src: bool) -> None:
    fld, side = (F_SPORT, tries_map.SIDE_SPORT) if src else (F_DPORT, tries_map.SIDE_DPORT)
    toggles_pos: dict[int, list[int]] = {}
    toggles_neg: dict[int, list[int]] = {}
    no_pos: list[int] = []
    for i, r in enumerate(chain):
        pos = r.src_ports if src else r.dst_ports
        neg = r.not_src_ports if src else r.not_dst_ports
        if pos.ranges and pos.named_sets:
            raise ClassifierError(f"record {i}: a positive port group mixes ranges and "
                                  f"named ports")
        if not pos.ranges:
            no_pos.append(i)
        for first, last in pos.ranges:
            toggles_pos.setdefault(first, []).append(i)
            toggles_pos.setdefault(last + 1, []).append(i)
        for first, last in neg.ranges:
            toggles_neg.setdefault(first, []).append(i)
            toggles_neg.setdefault(last + 1, []).append(i)
    if not toggles_pos and not toggles_neg:
        idx.fixed[fld] = VEC_ALL
        return
    base = _bits(no_pos, b.n)
    bounds = sorted({0, *toggles_pos, *toggles_neg} - {65536})
    pos_bits = neg_bits = 0
    intervals: list[tuple[int, int, int]] = []
    for k, start in enumerate(bounds):
        pos_bits ^= _bits(toggles_pos.get(start, ()), b.n)
        neg_bits ^= _bits(toggles_neg.get(start, ()), b.n)
        end = bounds[k + 1] - 1 if k + 1 < len(bounds) else 65535
        intervals.append((start, end, (base | pos_bits) & ~neg_bits & b.all))
    values = {v for _, _, v in intervals}
    if values == {b.all}:
        idx.fixed[fld] = VEC_ALL
        return
    if len(values) == 1:
        idx.fixed[fld] = b.vec(values.pop())
        return
    # the widest interval's vector is the default; the trie holds the others
    counts: dict[int, int] = {}
    for start, end, v in intervals:
        counts[v] = counts.get(v, 0) + end - start + 1
    default = max(counts, key=lambda v: counts[v])
    idx.fixed[fld] = b.vec(default)
    idx.flags |= 1 << fld
    for start, end, v in intervals:
        if v == default:
            continue
        vid = b.vec(v)
        for value, plen in port_prefixes(start, end):
            idx.tries[(side, 0, 0, value << 16, plen)] = vid


def _signatures(members_by_set: Mapping[int, Iterable[Member]],
                state: list[_SideState] | None = None
                ) -> dict[tuple[int, int, int, int, int], frozenset[int]]:
    """(family, proto, port, value, plen) -> the sets with a member CONTAINING that prefix
    (same family, proto, port). With those as LPM entries, the longest hit for an address is
    exactly the set of sets that contain it."""
    exact: dict[tuple[int, int, int, int, int], set[int]] = {}
    lengths: dict[tuple[int, int, int], set[int]] = {}
    for number, members in members_by_set.items():
        for value, plen, proto, port, fam in members:
            exact.setdefault((fam, proto, port, value, plen), set()).add(number)
            lengths.setdefault((fam, proto, port), set()).add(plen)
    out: dict[tuple[int, int, int, int, int], frozenset[int]] = {}
    ordered = {k: sorted(v) for k, v in lengths.items()}
    shared: dict[frozenset[int], frozenset[int]] = {}  # one frozenset per distinct signature
    for key, sets in exact.items():
        fam, proto, port, value, plen = key
        sig = set(sets)
        for shorter in ordered[(fam, proto, port)]:
            if shorter >= plen:
                break
            more = exact.get((fam, proto, port, value & _mask(fam, shorter), shorter))
            if more:
                sig |= more
        fsig = frozenset(sig)
        out[key] = shared.setdefault(fsig, fsig)
    if state is not None:
        state.append(_SideState(exact, lengths, lambda sig: 0, {}))
    return out


def _ancestor_sets(st: _SideState, fam: int, proto: int, port: int, value: int, plen: int
                   ) -> set[int]:
    sig: set[int] = set()
    for shorter in st.lengths.get((fam, proto, port), ()):
        if shorter < plen:
            sig |= st.exact.get((fam, proto, port, value & _mask(fam, shorter), shorter), set())
    return sig


def can_update(idx: Index, numbers: Iterable[int]) -> bool:
    """Whether every side that checks one of these sets keeps a signature state (the
    precondition of update_members; checked before decoding any delta)."""
    return all(side in idx.inc for number in numbers
               for side, nums in idx.referenced.items() if number in nums)


def update_members(idx: Index, deltas: Mapping[int, tuple[Iterable[Member], Iterable[Member]]]
                   ) -> dict[tuple[int, int, int, int, int], int | None] | None:
    """The trie changes (key -> relative vector id, None = delete) that bring `idx` up to
    date after members of the sets in `deltas` (number -> (added, removed)) changed, or
    None when that needs a rebuild: a changed member shorter than /32 (it would change
    longer prefixes' signatures), a side that checks the set without a trie lookup, or a
    signature whose vector the block does not hold. On success `idx`'s signature state is
    updated; on None it is untouched."""
    overlay: dict[tuple[int, tuple[int, int, int, int, int]], set[int]] = {}
    touched: list[tuple[int, tuple[int, int, int, int, int]]] = []
    for number, (added, removed) in deltas.items():
        sides = [side for side, nums in idx.referenced.items() if number in nums]
        for side in sides:
            st = idx.inc.get(side)
            if st is None:
                return None
            named = side in (tries_map.SIDE_SNAMED, tries_map.SIDE_DNAMED)
            for members, add in ((removed, False), (added, True)):
                for value, plen, proto, port, fam in members:
                    if plen != ADDR_BITS[fam]:
                        return None
                    if not named:
                        proto = port = 0
                    elif not proto:
                        continue  # the named-port sides only hold members with a port
                    key = (fam, proto, port, value, plen)
                    cur = overlay.get((side, key))
                    if cur is None:
                        cur = overlay[(side, key)] = set(st.exact.get(key, ()))
                        touched.append((side, key))
                    if add:
                        cur.add(number)
                    else:
                        cur.discard(number)
    changes: dict[tuple[int, int, int, int, int], int | None] = {}
    for side, key in touched:
        st = idx.inc[side]
        fam, proto, port, value, plen = key
        sets = overlay[(side, key)]
        tkey = (_side_key(side, fam), proto, port, value, plen)
        if not sets:
            changes[tkey] = None
            continue
        sig = frozenset(sets | _ancestor_sets(st, fam, proto, port, value, plen))
        v = st.memo.get(sig)
        if v is None:
            v = st.memo[sig] = st.vector(sig)
        vid = idx.vec_rel.get(v)
        if vid is None:
            return None
        changes[tkey] = vid
    for side, key in touched:
        st = idx.inc[side]
        sets = overlay[(side, key)]
        if sets:
            st.exact[key] = sets
            st.lengths.setdefault(key[:3], set()).add(key[4])
        else:
            st.exact.pop(key, None)
    return changes


def _build_addrs(b: _Builder, chain: tuple[RuleRecord, ...], idx: Index, src: bool,
                 members: Callable[[int], tuple[Member, ...]]) -> None:
    fld, side = (F_SADDR, tries_map.SIDE_SADDR) if src else (F_DADDR, tries_map.SIDE_DADDR)
    no_pos: list[int] = []
    pos1: dict[int, list[int]] = {}
    multi: list[tuple[int, frozenset[int]]] = []
    neg: dict[int, list[int]] = {}
    for i, r in enumerate(chain):
        positives = [c.set_id for c in r.set_checks if c.src == src and not c.negate]
        for c in r.set_checks:
            if c.src == src and c.negate:
                neg.setdefault(c.set_id, []).append(i)
        if not positives:
            no_pos.append(i)
        elif len(set(positives)) == 1:
            pos1.setdefault(positives[0], []).append(i)
        else:
            multi.append((i, frozenset(positives)))
    if not pos1 and not multi and not neg:
        idx.fixed[fld] = VEC_ALL
        return
    base = _bits(no_pos, b.n)
    pos_m = {s: _bits(ix, b.n) for s, ix in pos1.items()}
    neg_m = {s: _bits(ix, b.n) for s, ix in neg.items()}

    def vector(sig: frozenset[int]) -> int:
        v = base
        for s in sig:
            v |= pos_m.get(s, 0)
        for i, need in multi:
            if need <= sig:
                v |= 1 << i
        for s in sig:
            v &= ~neg_m.get(s, 0)
        return v & b.all

    referenced = set(pos1) | set(neg) | {s for _, need in multi for s in need}
    idx.referenced[side] = frozenset(referenced)
    state: list[_SideState] = []
    sigs = _signatures({s: [(v, p, 0, 0, f) for v, p, _, _, f in members(s)]
                        for s in referenced}, state)
    default = vector(frozenset())
    memo: dict[frozenset[int], int] = {}
    state[0].vector, state[0].memo = vector, memo
    entries: dict[tuple[int, int, int, int, int], int] = {}
    for (fam, _, _, value, plen), sig in sigs.items():
        v = memo.get(sig)
        if v is None:
            v = memo[sig] = vector(sig)
        entries[(_side_key(side, fam), 0, 0, value, plen)] = v
    _finish_trie_field(b, idx, fld, default, entries)
    if idx.flags >> fld & 1:
        idx.inc[side] = state[0]


def _build_named(b: _Builder, chain: tuple[RuleRecord, ...], idx: Index, src: bool,
                 members: Callable[[int], tuple[Member, ...]]) -> None:
    fld, side = (F_SNAMED, tries_map.SIDE_SNAMED) if src else (F_DNAMED, tries_map.SIDE_DNAMED)
    no_pos: list[int] = []
    pos: dict[int, list[int]] = {}
    neg: dict[int, list[int]] = {}
    for i, r in enumerate(chain):
        pgroup = r.src_ports if src else r.dst_ports
        ngroup = r.not_src_ports if src else r.not_dst_ports
        if not pgroup.named_sets:
            no_pos.append(i)
        for s in pgroup.named_sets:
            pos.setdefault(s, []).append(i)
        for s in ngroup.named_sets:
            neg.setdefault(s, []).append(i)
    if not pos and not neg:
        idx.fixed[fld] = VEC_ALL
        return
    base = _bits(no_pos, b.n)
    pos_m = {s: _bits(ix, b.n) for s, ix in pos.items()}
    neg_m = {s: _bits(ix, b.n) for s, ix in neg.items()}

    def vector(sig: frozenset[int]) -> int:
        v = base
        for s in sig:
            v |= pos_m.get(s, 0)
        for s in sig:
            v &= ~neg_m.get(s, 0)
        return v & b.all

    idx.referenced[side] = frozenset(set(pos) | set(neg))
    state: list[_SideState] = []
    sigs = _signatures({s: [m for m in members(s) if m[2]] for s in set(pos) | set(neg)},
                       state)
    default = vector(frozenset())
    memo: dict[frozenset[int], int] = {}
    state[0].vector, state[0].memo = vector, memo
    entries: dict[tuple[int, int, int, int, int], int] = {}
    for (fam, proto, port, value, plen), sig in sigs.items():
        v = memo.get(sig)
        if v is None:
            v = memo[sig] = vector(sig)
        entries[(_side_key(side, fam), proto, port, value, plen)] = v
    _finish_trie_field(b, idx, fld, default, entries)
    if idx.flags >> fld & 1:
        idx.inc[side] = state[0]


def _finish_trie_field(b: _Builder, idx: Index, fld: int, default: int,
                       entries: dict[tuple[int, int, int, int, int], int]) -> None:
    values = set(entries.values()) | {default}
    if values == {b.all}:
        idx.fixed[fld] = VEC_ALL
        return
    idx.fixed[fld] = b.vec(default)
    if len(values) == 1:
        return
    idx.flags |= 1 << fld
    for key, v in entries.items():
        idx.tries[key] = b.vec(v)


def build_index(chain: tuple[RuleRecord, ...],
                members: Callable[[int], tuple[Member, ...]]) -> Index:
    """The classifier of `chain` (see the module docstring)."""
    n = len(chain)
    if not 0 < n <= MAX_RECORDS:
        raise ClassifierError(f"a chain of {n} records (the classifier takes 1 to "
                              f"{MAX_RECORDS})")
    b = _Builder(n)
    idx = Index(n_records=n, n_words=b.n_words, flags=0, fixed=[VEC_ALL] * N_FIELDS,
                l4={}, tries={}, words=b.words)
    _build_l4(b, chain, idx)
    _build_ports(b, chain, idx, True)
    _build_ports(b, chain, idx, False)
    _build_addrs(b, chain, idx, True, members)
    _build_addrs(b, chain, idx, False, members)
    _build_named(b, chain, idx, True, members)
    _build_named(b, chain, idx, False, members)
    b.finish(idx)
    return idx


# --- the program's algorithm over encoded map contents (for tests and tools) -------------


@dataclass(frozen=True)
class Packet:
    """What calico_policy knows: addresses as host ints (128-bit for IPv6), flags as in
    pkt_info."""

    saddr: int
    daddr: int
    proto: int
    pflags: int  # PKT_F_PORTS | PKT_F_ICMP | PKT_F_IPV6 (family 6)
    sport: int = 0
    dport: int = 0
    icmp_type: int = 0
    icmp_code: int = 0


@dataclass
class MapContents:
    """Encoded entries as the kernel holds them: map name -> {key: value}."""

    maps: dict[str, dict[bytes, bytes]] = field(default_factory=dict)

    def get(self, name: str, key: bytes) -> bytes | None:
        return self.maps.get(name, {}).get(key)


def _word(m: MapContents, i: int) -> int:
    raw = m.get("cls_words", words_map.encode_index(i))
    if raw is None:
        raise LookupError(f"cls_words[{i}] missing")
    return words_map.decode_word(raw)


def _trie(m: MapContents, inst: int, side: int, proto: int, port: int, value: int,
          dflt: int, family: int = 4) -> int:
    side = _side_key(side, family)
    for plen in range(ADDR_BITS[family], -1, -1):
        masked = value & _mask(family, plen)
        raw = m.get("cls_tries", tries_map.encode_key(inst, side, proto, port, masked, plen))
        if raw is not None:
            return tries_map.decode_value(raw)
    return dflt


def _l4(m: MapContents, inst: int, pkt: Packet, dflt: int) -> int:
    tries = []
    if pkt.pflags & l4_map.PKT_F_ICMP:
        tries += [(pkt.proto, pkt.icmp_type, pkt.icmp_code, l4_map.LEVEL_TYPE_CODE),
                  (pkt.proto, pkt.icmp_type, 0, l4_map.LEVEL_TYPE)]
    tries += [(pkt.proto, 0, 0, l4_map.LEVEL_PROTO), (0, 0, 0, l4_map.LEVEL_OTHER)]
    for proto, t, c, level in tries:
        raw = m.get("cls_l4", l4_map.encode_key(inst, proto, pkt.pflags, t, c, level))
        if raw is not None:
            return l4_map.decode_value(raw)
    return dflt


def _vec_word(m: MapContents, vec: int, n_sum: int, w: int) -> int:
    s, bit = w // 64, 1 << (w % 64)
    summary = _word(m, vec + s)
    if not summary & bit:
        return 0
    rank = _word(m, vec + n_sum + s) + (summary & (bit - 1)).bit_count()
    return _word(m, vec + 2 * n_sum + rank)


def decide(m: MapContents, chain_start: int, chain_len: int, pkt: Packet
           ) -> tuple[str, int]:
    """(verdict, counter id) as calico_policy decides from the maps' contents: "allow",
    "deny", or "error" (the program drops and counts GCNT_CLASSIFIER_ERROR)."""
    if chain_len == 0:
        return "deny", 0
    raw = m.get("cls_chains", cls_chains_map.encode_index(chain_start))
    inst = cls_chains_map.decode_u32(raw) if raw is not None else 0
    if not inst:
        return "error", 0
    try:
        head = _word(m, inst)
        n_words, flags = head & 0xFFFFFFFF, head >> 32
        if not 0 < n_words <= MAX_WORDS:
            return "error", 0
        n_sum = (n_words + 63) // 64
        fixed = []
        for i in range(N_FIELDS):
            w = _word(m, inst + 1 + i // 2)
            fixed.append((w >> 32) & 0xFFFFFFFF if i % 2 else w & 0xFFFFFFFF)
        fam = 6 if pkt.pflags & l4_map.PKT_F_IPV6 else 4
        lookups = {
            F_L4: lambda d: _l4(m, inst, pkt, d),
            F_SPORT: lambda d: _trie(m, inst, tries_map.SIDE_SPORT, 0, 0, pkt.sport << 16, d),
            F_DPORT: lambda d: _trie(m, inst, tries_map.SIDE_DPORT, 0, 0, pkt.dport << 16, d),
            F_SADDR: lambda d: _trie(m, inst, tries_map.SIDE_SADDR, 0, 0, pkt.saddr, d, fam),
            F_DADDR: lambda d: _trie(m, inst, tries_map.SIDE_DADDR, 0, 0, pkt.daddr, d, fam),
            F_SNAMED: lambda d: _trie(m, inst, tries_map.SIDE_SNAMED, pkt.proto, pkt.sport,
                                      pkt.saddr, d, fam),
            F_DNAMED: lambda d: _trie(m, inst, tries_map.SIDE_DNAMED, pkt.proto, pkt.dport,
                                      pkt.daddr, d, fam),
        }
        for f, look in lookups.items():
            if flags >> f & 1:
                fixed[f] = look(fixed[f])
        vecs = [v for v in fixed if v != VEC_ALL]
        cand = []
        for s in range(n_sum):
            c = _M64
            for v in vecs:
                c &= _word(m, v + s)
            cand.append(c)
        pos = 0
        for _ in range(STEPS_PER_PROG * (MAX_TAIL_CALLS + 1)):
            w = next((s * 64 + (c & -c).bit_length() - 1 for s, c in enumerate(cand) if c),
                     None)
            if w is None:
                return "deny", 0
            x = _M64
            for v in vecs:
                x &= _vec_word(m, v, n_sum, w)
            if w == pos // 64:
                x &= ~((1 << (pos % 64)) - 1) & _M64
            if not x:
                cand[w // 64] &= ~(1 << (w % 64))
                continue
            i = w * 64 + (x & -x).bit_length() - 1
            if i >= chain_len:
                return "error", 0
            rec_raw = m.get("rules", rules_map.encode_index(chain_start + i))
            if rec_raw is None:
                return "error", 0
            rec = rules_map.decode(rec_raw)
            if rec.action == Action.ALLOW:
                return "allow", rec.counter_id
            if rec.action == Action.DENY:
                return "deny", rec.counter_id
            nxt = rec.jump if rec.action in (Action.PASS, Action.SKIP) else i + 1
            if nxt <= i:
                return "error", 0
            pos = nxt
            for s in range(len(cand)):
                if (s + 1) * 64 <= pos // 64:
                    cand[s] = 0
                elif s * 64 <= pos // 64:
                    cand[s] &= ~((1 << (pos // 64 - s * 64)) - 1)
        return "error", 0  # the tail-call limit
    except LookupError:
        return "error", 0

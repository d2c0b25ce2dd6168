"""The `rules` map: policy chains as rule records in one array (bpf/include/policy.h).

A chain is [start, start + len) of this array; the endpoints map points at one chain per
direction. `RuleRecord` is the Python form of one `struct policy_rule`: plain values, frozen
and hashable, so a chain is a tuple of records and chains are shared by content.
policy.h documents the match semantics and the action set; the compiler (agent.bpf.compiler)
is the only producer.

Invariants: unused slots are 0; jumps are relative to the chain start and go forward;
counter id 0 = not counted; set id 0 = no set.
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct
from dataclasses import dataclass

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType

PORT_SLOTS = 8  # must match RULE_PORT_SLOTS
SET_CHECKS = 6  # must match RULE_SET_CHECKS
NAMED_PORT_SLOTS = 2  # must match RULE_NAMED_PORT_SLOTS
SET_CHECK_SRC = 0x01  # must match SET_CHECK_SRC
SET_CHECK_NEGATE = 0x02  # must match SET_CHECK_NEGATE
MAX_TAIL_CALLS = 32  # must match POLICY_MAX_TAIL_CALLS
DEFAULT_RULES_PER_PROG = 128  # must match the default POLICY_RULES_PER_PROG


MAX_CHAIN_RECORDS = 512 * 64  # must match POLICY_MAX_CHAIN_RECORDS (CLS_MAX_WORDS * 64)


def max_chain_records(rules_per_prog: int = DEFAULT_RULES_PER_PROG) -> int:
    """Longest chain the classifier indexes (POLICY_MAX_CHAIN_RECORDS). `rules_per_prog`
    (the old walker's batch) no longer limits it and is ignored."""
    del rules_per_prog
    return MAX_CHAIN_RECORDS


class Action(enum.IntEnum):
    """must match RULE_ACTION_* in bpf/include/policy.h"""

    ALLOW = 1
    DENY = 2
    PASS = 3
    LOG = 4
    SKIP = 5


class Match(enum.IntFlag):
    """must match RM_* in bpf/include/policy.h"""

    PROTOCOL = 0x00001
    NOT_PROTOCOL = 0x00002
    SRC_PORTS = 0x00400
    NOT_SRC_PORTS = 0x00800
    DST_PORTS = 0x01000
    NOT_DST_PORTS = 0x02000
    ICMP_TYPE = 0x04000
    ICMP_CODE = 0x08000
    NOT_ICMP_TYPE = 0x10000
    NOT_ICMP_CODE = 0x20000
    IPV4_ONLY = 0x40000  # the rule's ipVersion (explicit, or implied by its nets) is 4
    IPV6_ONLY = 0x80000  # ... is 6


class PortRangeC(ctypes.Structure):
    """must match struct port_range in bpf/include/policy.h"""

    _fields_ = [("first", ctypes.c_uint16), ("last", ctypes.c_uint16)]


class PortMatchC(ctypes.Structure):
    """must match struct port_match in bpf/include/policy.h"""

    _fields_ = [
        ("n_ranges", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("named_sets", ctypes.c_uint32 * NAMED_PORT_SLOTS),
        ("ranges", PortRangeC * PORT_SLOTS),
    ]


class SetCheckC(ctypes.Structure):
    """must match struct set_check in bpf/include/policy.h"""

    _fields_ = [("set_id", ctypes.c_uint32), ("flags", ctypes.c_uint8),
                ("pad", ctypes.c_uint8 * 3)]


class Value(ctypes.Structure):
    """must match struct policy_rule in bpf/include/policy.h"""

    _fields_ = [
        ("match_flags", ctypes.c_uint32),
        ("action", ctypes.c_uint8),
        ("protocol", ctypes.c_uint8),
        ("not_protocol", ctypes.c_uint8),
        ("icmp_type", ctypes.c_uint8),
        ("icmp_code", ctypes.c_uint8),
        ("not_icmp_type", ctypes.c_uint8),
        ("not_icmp_code", ctypes.c_uint8),
        ("n_set_checks", ctypes.c_uint8),
        ("jump", ctypes.c_uint32),
        ("counter_id", ctypes.c_uint32),
        ("set_checks", SetCheckC * SET_CHECKS),
        ("src_ports", PortMatchC),
        ("not_src_ports", PortMatchC),
        ("dst_ports", PortMatchC),
        ("not_dst_ports", PortMatchC),
    ]


PARAMS = MapParams(
    name="rules", map_type=MapType.ARRAY, key_type=ctypes.c_uint32, value_type=Value,
    max_entries=32768, version=1, header="policy.h",
)


@dataclass(frozen=True)
class PortMatch:
    """One port group: ANY range OR ANY named-port set (≤ PORT_SLOTS / NAMED_PORT_SLOTS)."""

    ranges: tuple[tuple[int, int], ...] = ()
    named_sets: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ranges or self.named_sets)


@dataclass(frozen=True)
class SetCheck:
    """The source (src=True) or destination address is in set_id (or NOT, negate=True)."""

    set_id: int
    src: bool
    negate: bool = False

    @property
    def flags(self) -> int:
        return (SET_CHECK_SRC if self.src else 0) | (SET_CHECK_NEGATE if self.negate else 0)


@dataclass(frozen=True)
class RuleRecord:
    """One record. Fields left at their defaults are unconstrained; `match_flags` is derived."""

    action: Action
    jump: int = 0
    counter_id: int = 0
    protocol: int | None = None
    not_protocol: int | None = None
    set_checks: tuple[SetCheck, ...] = ()  # AND, at most SET_CHECKS
    src_ports: PortMatch = PortMatch()
    not_src_ports: PortMatch = PortMatch()
    dst_ports: PortMatch = PortMatch()
    not_dst_ports: PortMatch = PortMatch()
    icmp_type: int | None = None
    icmp_code: int | None = None
    not_icmp_type: int | None = None
    not_icmp_code: int | None = None
    ip_version: int | None = None  # 4 or 6: the record matches that family only

    def __hash__(self) -> int:
        # cached: chains (tuples of thousands of records) are dict keys, hashed often
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.action, self.jump, self.counter_id, self.protocol,
                           self.not_protocol, self.set_checks, self.src_ports,
                           self.not_src_ports, self.dst_ports, self.not_dst_ports,
                           self.icmp_type, self.icmp_code, self.not_icmp_type,
                           self.not_icmp_code, self.ip_version))
            object.__setattr__(self, "_hash", cached)
        return cached

    @property
    def match_flags(self) -> Match:
        m = Match(0)
        pairs = [
            (self.protocol is not None, Match.PROTOCOL),
            (self.not_protocol is not None, Match.NOT_PROTOCOL),
            (bool(self.src_ports), Match.SRC_PORTS),
            (bool(self.not_src_ports), Match.NOT_SRC_PORTS),
            (bool(self.dst_ports), Match.DST_PORTS),
            (bool(self.not_dst_ports), Match.NOT_DST_PORTS),
            (self.icmp_type is not None, Match.ICMP_TYPE),
            (self.icmp_code is not None, Match.ICMP_CODE),
            (self.not_icmp_type is not None, Match.NOT_ICMP_TYPE),
            (self.not_icmp_code is not None, Match.NOT_ICMP_CODE),
            (self.ip_version == 4, Match.IPV4_ONLY),
            (self.ip_version == 6, Match.IPV6_ONLY),
        ]
        for present, flag in pairs:
            if present:
                m |= flag
        return m


_HEAD = struct.Struct("=I8BII")  # match_flags .. n_set_checks, jump, counter_id
_CHECK = struct.Struct("=IB3x")
_PORT_HEAD = struct.Struct(f"=B3x{NAMED_PORT_SLOTS}I")
_RANGE = struct.Struct("=HH")
_EMPTY_CHECK = _CHECK.pack(0, 0)
_EMPTY_RANGE = _RANGE.pack(0, 0)
_EMPTY_PORTS = _PORT_HEAD.pack(0, *[0] * NAMED_PORT_SLOTS) + _EMPTY_RANGE * PORT_SLOTS


def _port_bytes(pm: PortMatch, what: str) -> bytes:
    if not pm.ranges and not pm.named_sets:
        return _EMPTY_PORTS
    if len(pm.ranges) > PORT_SLOTS or len(pm.named_sets) > NAMED_PORT_SLOTS:
        raise ValueError(f"rule record {what}: more than {PORT_SLOTS} ranges or "
                         f"{NAMED_PORT_SLOTS} named-port sets")
    named = list(pm.named_sets) + [0] * (NAMED_PORT_SLOTS - len(pm.named_sets))
    return (_PORT_HEAD.pack(len(pm.ranges), *named)
            + b"".join(_RANGE.pack(first, last) for first, last in pm.ranges)
            + _EMPTY_RANGE * (PORT_SLOTS - len(pm.ranges)))


def encode(rec: RuleRecord) -> bytes:
    """RuleRecord -> struct policy_rule bytes (the layout of `Value`, packed with struct:
    this runs once per record of every new chain). Raises ValueError if a slot
    overflows."""
    checks = rec.set_checks
    if len(checks) > SET_CHECKS:
        raise ValueError(f"rule record set_checks: more than {SET_CHECKS} set checks")
    for c in checks:
        if not 0 < c.set_id < 2**31:
            raise ValueError(f"rule record set_checks: set id {c.set_id} outside 1..2^31-1")
    flags = 0
    for value, flag in ((rec.protocol, Match.PROTOCOL), (rec.not_protocol, Match.NOT_PROTOCOL),
                        (rec.icmp_type, Match.ICMP_TYPE), (rec.icmp_code, Match.ICMP_CODE),
                        (rec.not_icmp_type, Match.NOT_ICMP_TYPE),
                        (rec.not_icmp_code, Match.NOT_ICMP_CODE)):
        if value is not None:
            flags |= flag.value
    for pm, flag in ((rec.src_ports, Match.SRC_PORTS), (rec.not_src_ports, Match.NOT_SRC_PORTS),
                     (rec.dst_ports, Match.DST_PORTS), (rec.not_dst_ports, Match.NOT_DST_PORTS)):
        if pm.ranges or pm.named_sets:
            flags |= flag.value
    if rec.ip_version == 4:
        flags |= Match.IPV4_ONLY.value
    elif rec.ip_version == 6:
        flags |= Match.IPV6_ONLY.value
    elif rec.ip_version is not None:
        raise ValueError(f"rule record ip_version: {rec.ip_version!r} is not 4 or 6")
    head = _HEAD.pack(flags, int(rec.action), rec.protocol or 0, rec.not_protocol or 0,
                      rec.icmp_type or 0, rec.icmp_code or 0, rec.not_icmp_type or 0,
                      rec.not_icmp_code or 0, len(checks), rec.jump, rec.counter_id)
    return b"".join((
        head, *(_CHECK.pack(c.set_id, c.flags) for c in checks),
        _EMPTY_CHECK * (SET_CHECKS - len(checks)),
        _port_bytes(rec.src_ports, "src_ports"), _port_bytes(rec.not_src_ports, "not_src_ports"),
        _port_bytes(rec.dst_ports, "dst_ports"), _port_bytes(rec.not_dst_ports, "not_dst_ports"),
    ))


def _ports(pm: PortMatchC) -> PortMatch:
    n = min(pm.n_ranges, PORT_SLOTS)
    return PortMatch(
        ranges=tuple((pm.ranges[i].first, pm.ranges[i].last) for i in range(n)),
        named_sets=tuple(s for s in pm.named_sets if s),
    )


def decode(raw: bytes) -> RuleRecord:
    v = Value.from_buffer_copy(raw)
    m = Match(v.match_flags)
    try:
        action = Action(v.action)
    except ValueError:
        action = Action.LOG  # what the walker does with an unknown action
    return RuleRecord(
        action=action, jump=v.jump, counter_id=v.counter_id,
        protocol=v.protocol if m & Match.PROTOCOL else None,
        not_protocol=v.not_protocol if m & Match.NOT_PROTOCOL else None,
        set_checks=tuple(
            SetCheck(c.set_id, bool(c.flags & SET_CHECK_SRC), bool(c.flags & SET_CHECK_NEGATE))
            for c in v.set_checks[:min(v.n_set_checks, SET_CHECKS)]),
        src_ports=_ports(v.src_ports), not_src_ports=_ports(v.not_src_ports),
        dst_ports=_ports(v.dst_ports), not_dst_ports=_ports(v.not_dst_ports),
        icmp_type=v.icmp_type if m & Match.ICMP_TYPE else None,
        icmp_code=v.icmp_code if m & Match.ICMP_CODE else None,
        not_icmp_type=v.not_icmp_type if m & Match.NOT_ICMP_TYPE else None,
        not_icmp_code=v.not_icmp_code if m & Match.NOT_ICMP_CODE else None,
        ip_version=4 if m & Match.IPV4_ONLY else 6 if m & Match.IPV6_ONLY else None,
    )


_U32 = struct.Struct("=I")


def encode_index(i: int) -> bytes:
    return _U32.pack(i)


def describe(rec: RuleRecord) -> dict:
    """A record as a plain dict with only its set fields (for dumps and debugging)."""
    out: dict = {"action": rec.action.name.lower()}
    if rec.action in (Action.PASS, Action.SKIP):
        out["jump"] = rec.jump
    if rec.counter_id:
        out["counter_id"] = rec.counter_id
    for name in ("protocol", "not_protocol", "icmp_type", "icmp_code", "not_icmp_type",
                 "not_icmp_code", "ip_version"):
        if getattr(rec, name) is not None:
            out[name] = getattr(rec, name)
    if rec.set_checks:
        out["set_checks"] = [
            f"{'src' if c.src else 'dst'} {'not in' if c.negate else 'in'} {c.set_id}"
            for c in rec.set_checks]
    for name in ("src_ports", "not_src_ports", "dst_ports", "not_dst_ports"):
        pm: PortMatch = getattr(rec, name)
        if pm:
            out[name] = {"ranges": [list(r) for r in pm.ranges], "named_sets": list(pm.named_sets)}
    return out


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def read_chain(m: BpfMap, start: int, length: int) -> tuple[RuleRecord, ...]:
    out = []
    for i in range(start, start + length):
        raw = m.lookup(encode_index(i))
        if raw is None:
            raise IndexError(f"rules map: index {i} outside the array")
        out.append(decode(raw))
    return tuple(out)


def dump(m: BpfMap, chains: list[tuple[int, int]] | None = None) -> list[dict]:
    """Records of the given (start, len) chains, or every non-empty record:
    [{"index": n, "action": "allow", ...}]."""
    rows = []
    if chains is None:
        for k, v in m.items():
            if any(v):
                rows.append({"index": _U32.unpack(k)[0], **describe(decode(v))})
    else:
        for start, length in sorted(set(chains)):
            for i, rec in enumerate(read_chain(m, start, length)):
                rows.append({"index": start + i, **describe(rec)})
    return sorted(rows, key=lambda r: r["index"])

"""Two reference evaluators for BPF policy tests (no kernel).

- `expected_verdict()`: Calico's semantics straight from agent.proto (Rule docstring,
  TierInfo): tiers in order, first Allow/Deny final, Pass ends the tier, a tier with policies
  and no match denies unless its default is pass, then profiles, then deny. This is the
  oracle the compiled records and the real programs are checked against.
- `walk_chain()`: a line-by-line Python mirror of calico_policy / rule_matches in
  bpf/tc.c and bpf/include/policy.h over compiled RuleRecords and the compiled ipsets trie.

Packets are `Pkt` of either family (from their addresses); ports only count for
TCP/UDP/SCTP, ICMP type/code only for the family's ICMP (1 for IPv4, 58 for IPv6): any port
constraint needs a packet with ports; any ICMP constraint an ICMP packet. A rule applies to
the families Felix renders it for: its ipVersion, and not a family for which a non-empty
nets / notNets list has no net (Felix's FilterRuleToIPVersion).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pyfelix.agent import proto
from pyfelix.agent.bpf.compiler import PolicyState
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps.rules import Action, PortMatch, RuleRecord

PORT_PROTOS = (6, 17, 132)


@dataclass(frozen=True)
class Pkt:
    src: str
    dst: str
    proto: int
    sport: int = 0
    dport: int = 0
    icmp_type: int = 0
    icmp_code: int = 0

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.src).version

    @property
    def has_ports(self) -> bool:
        return self.proto in PORT_PROTOS

    @property
    def is_icmp(self) -> bool:
        return self.proto == (58 if self.family == 6 else 1)


def _in_net(addr: str, nets: tuple[str, ...]) -> bool:
    a = ipaddress.ip_address(addr)
    return any(
        n.version == a.version and a in n
        for n in (ipaddress.ip_network(x, strict=False) for x in nets))


def rule_applies_to(r: proto.Rule, family: int) -> bool:
    if r.ip_version is not None and r.ip_version != family:
        return False
    for nets in (r.src_nets, r.dst_nets, r.not_src_nets, r.not_dst_nets):
        if nets and not any(ipaddress.ip_network(x, strict=False).version == family
                            for x in nets):
            return False
    return True


def _in_set(state: PolicyState, set_id: str, addr: str, proto_num: int = 0,
            port: int = 0, named: bool = False) -> bool:
    s = state.ipsets[set_id]
    a = ipaddress.ip_address(addr)
    for m in s.members:
        net, p, prt = ipsets_map.parse_member(m)
        if net.version != a.version or a not in net:
            continue
        if not named or (p == proto_num and prt == port):
            return True
    return False


def _port_ok(state: PolicyState, pkt: Pkt, port: int, addr: str,
             ranges: tuple[proto.PortRange, ...], named: tuple[str, ...]) -> bool:
    return any(r.first <= port <= r.last for r in ranges) or any(
        _in_set(state, n, addr, pkt.proto, port, named=True) for n in named)


def rule_matches(state: PolicyState, r: proto.Rule, pkt: Pkt) -> bool:
    if not rule_applies_to(r, pkt.family):
        return False
    if r.protocol is not None and pkt.proto != r.protocol:
        return False
    if r.not_protocol is not None and pkt.proto == r.not_protocol:
        return False
    if r.src_nets and not _in_net(pkt.src, r.src_nets):
        return False
    if r.not_src_nets and _in_net(pkt.src, r.not_src_nets):
        return False
    if r.dst_nets and not _in_net(pkt.dst, r.dst_nets):
        return False
    if r.not_dst_nets and _in_net(pkt.dst, r.not_dst_nets):
        return False
    if not all(_in_set(state, s, pkt.src) for s in r.src_ip_set_ids):
        return False
    if any(_in_set(state, s, pkt.src) for s in r.not_src_ip_set_ids):
        return False
    if not all(_in_set(state, s, pkt.dst) for s in r.dst_ip_set_ids):
        return False
    if any(_in_set(state, s, pkt.dst) for s in r.not_dst_ip_set_ids):
        return False
    port_fields = (r.src_ports, r.src_named_port_ip_set_ids, r.not_src_ports,
                   r.not_src_named_port_ip_set_ids, r.dst_ports, r.dst_named_port_ip_set_ids,
                   r.not_dst_ports, r.not_dst_named_port_ip_set_ids)
    if any(port_fields):
        if not pkt.has_ports:
            return False
        if (r.src_ports or r.src_named_port_ip_set_ids) and not _port_ok(
                state, pkt, pkt.sport, pkt.src, r.src_ports, r.src_named_port_ip_set_ids):
            return False
        if (r.dst_ports or r.dst_named_port_ip_set_ids) and not _port_ok(
                state, pkt, pkt.dport, pkt.dst, r.dst_ports, r.dst_named_port_ip_set_ids):
            return False
        if _port_ok(state, pkt, pkt.sport, pkt.src, r.not_src_ports,
                    r.not_src_named_port_ip_set_ids):
            return False
        if _port_ok(state, pkt, pkt.dport, pkt.dst, r.not_dst_ports,
                    r.not_dst_named_port_ip_set_ids):
            return False
    icmp_fields = (r.icmp_type, r.icmp_code, r.not_icmp_type, r.not_icmp_code)
    if any(v is not None for v in icmp_fields):
        if not pkt.is_icmp:
            return False
        if r.icmp_type is not None and pkt.icmp_type != r.icmp_type:
            return False
        if r.icmp_code is not None and pkt.icmp_code != r.icmp_code:
            return False
        if (r.not_icmp_type is not None and pkt.icmp_type == r.not_icmp_type
                and (r.not_icmp_code is None or pkt.icmp_code == r.not_icmp_code)):
            return False
    return True


def expected_verdict(state: PolicyState, ep: proto.WorkloadEndpoint, direction: str,
                     pkt: Pkt) -> str:
    """'allow' or 'deny' by Calico's semantics. direction: 'ingress' | 'egress' (the pod's)."""
    inbound = direction == "ingress"
    for tier in ep.tiers:
        names = tier.ingress_policies if inbound else tier.egress_policies
        if not names:
            continue
        passed = False
        for name in names:
            pol = state.policies[proto.PolicyID(tier.name, name)]
            for r in pol.inbound_rules if inbound else pol.outbound_rules:
                if not rule_matches(state, r, pkt):
                    continue
                if r.action in ("allow", "deny"):
                    return r.action
                if r.action == "pass":
                    passed = True
                    break
            if passed:
                break
        if not passed and tier.default_action == "deny":
            return "deny"
    for pid in ep.profile_ids:
        prof = state.profiles[pid]
        for r in prof.inbound_rules if inbound else prof.outbound_rules:
            if not rule_matches(state, r, pkt):
                continue
            if r.action in ("allow", "deny"):
                return r.action
            if r.action == "pass":
                break
    return "deny"


# --- mirror of the C walker ------------------------------------------------------------------


class Trie:
    """The compiled ipsets entries, looked up as the LPM trie would."""

    def __init__(self, entries: dict[bytes, bytes]) -> None:
        self.by_set: dict[int, list[tuple[ipaddress.IPv4Network, int, int]]] = {}
        for key in entries:
            d = ipsets_map.decode_key(key)
            net, p, port = ipsets_map.parse_member(d["member"])
            self.by_set.setdefault(d["set_id"], []).append((net, p, port))

    def contains(self, set_id: int, proto_num: int, port: int, addr: str) -> bool:
        a = ipaddress.ip_address(addr)
        return any(n.version == a.version and a in n and p == proto_num and prt == port
                   for n, p, prt in self.by_set.get(set_id, ()))


def _pm_hit(trie: Trie, pm: PortMatch, proto_num: int, port: int, addr: str) -> bool:
    return any(f <= port <= last for f, last in pm.ranges) or any(
        trie.contains(s, proto_num, port, addr) for s in pm.named_sets)


def record_matches(trie: Trie, r: RuleRecord, pkt: Pkt) -> bool:
    if r.ip_version is not None and r.ip_version != pkt.family:
        return False
    if r.protocol is not None and pkt.proto != r.protocol:
        return False
    if r.not_protocol is not None and pkt.proto == r.not_protocol:
        return False
    if any(v is not None for v in (r.icmp_type, r.icmp_code, r.not_icmp_type)):
        if not pkt.is_icmp:
            return False
        if r.icmp_type is not None and pkt.icmp_type != r.icmp_type:
            return False
        if r.icmp_code is not None and pkt.icmp_code != r.icmp_code:
            return False
        if (r.not_icmp_type is not None and pkt.icmp_type == r.not_icmp_type
                and (r.not_icmp_code is None or pkt.icmp_code == r.not_icmp_code)):
            return False
    if r.src_ports or r.dst_ports or r.not_src_ports or r.not_dst_ports:
        if not pkt.has_ports:
            return False
        if r.src_ports and not _pm_hit(trie, r.src_ports, pkt.proto, pkt.sport, pkt.src):
            return False
        if r.dst_ports and not _pm_hit(trie, r.dst_ports, pkt.proto, pkt.dport, pkt.dst):
            return False
        if r.not_src_ports and _pm_hit(trie, r.not_src_ports, pkt.proto, pkt.sport, pkt.src):
            return False
        if r.not_dst_ports and _pm_hit(trie, r.not_dst_ports, pkt.proto, pkt.dport, pkt.dst):
            return False
    for chk in r.set_checks:
        addr = pkt.src if chk.src else pkt.dst
        if trie.contains(chk.set_id, 0, 0, addr) == chk.negate:
            return False
    return True


def walk_chain(trie: Trie, chain: tuple[RuleRecord, ...], pkt: Pkt) -> tuple[str, int]:
    """(verdict, counter id of the deciding record; 0 if none) as calico_policy decides."""
    idx = 0
    while idx < len(chain):
        r = chain[idx]
        if not record_matches(trie, r, pkt):
            idx += 1
            continue
        if r.action == Action.ALLOW:
            return "allow", r.counter_id
        if r.action == Action.DENY:
            return "deny", r.counter_id
        if r.action in (Action.PASS, Action.SKIP):
            assert r.jump > idx, "backward jump"
            idx = r.jump
        else:
            idx += 1
    return "deny", 0

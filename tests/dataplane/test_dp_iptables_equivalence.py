"""Randomised check: rendered chains decide exactly as a direct reading of the rule semantics.

A reference evaluator implements `agent.proto.Rule`'s documented semantics and Calico's tier /
Pass / profile / default-deny order in plain Python. Random policies (every rule field,
every action, several tiers, default actions, profiles) and random packets are judged by
both the reference and PacketWalker over what the managers programmed into FakeIptables.
"""

from __future__ import annotations

import ipaddress
import random

from pyfelix.agent.proto import (
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    IPSetUpdate,
    Policy,
    PolicyID,
    PortRange,
    Profile,
    Rule,
    TierInfo,
)
from tests.dataplane.dp_harness import Harness, endpoint
from tests.fakes.netfilter import Packet

ADDRS = ["10.65.0.1", "10.65.0.2", "10.65.0.3", "10.65.1.7", "10.70.0.9"]
NETS = ["10.65.0.1/32", "10.65.0.0/30", "10.65.0.0/16", "10.70.0.0/16", "10.65.1.0/24",
        "fd00::/64"]
PORTS = [22, 53, 80, 443, 8080, 9000]
SETS = {
    "s1": ("net", {"10.65.0.1/32", "10.70.0.0/16"}),
    "s2": ("net", {"10.65.0.0/30"}),
    "np1": ("ip_port", {"10.65.0.2/32,tcp:8080", "10.65.0.3/32,udp:53"}),
    "np2": ("ip_port", {"10.65.0.1/32,tcp:22", "10.65.0.2/32,tcp:443"}),
}
A, B = "calia", "calib"


# --- the reference ---------------------------------------------------------------------------

def _in_net(addr: str, net: str) -> bool:
    n = ipaddress.ip_network(net)
    return n.version == 4 and ipaddress.ip_address(addr) in n


def _in_set(set_id: str, addr: str, port: int, proto: int) -> bool:
    kind, members = SETS[set_id]
    for m in members:
        net, _, pp = m.partition(",")
        if not _in_net(addr, net):
            continue
        if kind == "net":
            return True
        pname, _, pnum = pp.partition(":")
        if {"tcp": 6, "udp": 17}[pname] == proto and int(pnum) == port:
            return True
    return False


def _ports_ok(ranges, named, not_ranges, not_named, addr, port, proto) -> bool:  # type: ignore[no-untyped-def]
    if ranges or named:
        hit = any(r.first <= port <= r.last for r in ranges) or any(
            _in_set(s, addr, port, proto) for s in named)
        if not hit:
            return False
    if any(r.first <= port <= r.last for r in not_ranges):
        return False
    return not any(_in_set(s, addr, port, proto) for s in not_named)


def rule_matches(r: Rule, p: Packet) -> bool:
    if r.ip_version == 6:
        return False
    if r.protocol is not None and p.proto != r.protocol:
        return False
    if r.not_protocol is not None and p.proto == r.not_protocol:
        return False
    for addr, nets, not_nets, sets, not_sets in (
        (p.src, r.src_nets, r.not_src_nets, r.src_ip_set_ids, r.not_src_ip_set_ids),
        (p.dst, r.dst_nets, r.not_dst_nets, r.dst_ip_set_ids, r.not_dst_ip_set_ids),
    ):
        if nets and not any(_in_net(addr, n) for n in nets):
            return False
        if any(_in_net(addr, n) for n in not_nets):
            return False
        if not all(_in_set(s, addr, 0, 0) for s in sets):
            return False
        if any(_in_set(s, addr, 0, 0) for s in not_sets):
            return False
    if not _ports_ok(r.src_ports, r.src_named_port_ip_set_ids, r.not_src_ports,
                     r.not_src_named_port_ip_set_ids, p.src, p.sport, p.proto):
        return False
    if not _ports_ok(r.dst_ports, r.dst_named_port_ip_set_ids, r.not_dst_ports,
                     r.not_dst_named_port_ip_set_ids, p.dst, p.dport, p.proto):
        return False
    if r.icmp_type is not None and (p.icmp_type != r.icmp_type or (
            r.icmp_code is not None and p.icmp_code != r.icmp_code)):
        return False
    return not (r.not_icmp_type is not None and p.icmp_type == r.not_icmp_type and (
        r.not_icmp_code is None or p.icmp_code == r.not_icmp_code))


def rules_verdict(rules: tuple[Rule, ...], p: Packet) -> str | None:
    for r in rules:
        if rule_matches(r, p) and r.action != "log":
            return r.action
    return None


def endpoint_allows(tiers, profiles, policies, profile_defs, p: Packet, ingress: bool) -> bool:  # type: ignore[no-untyped-def]
    for tier in tiers:
        names = tier.ingress_policies if ingress else tier.egress_policies
        if not names:
            continue
        passed = False
        for name in names:
            pol = policies[PolicyID(tier.name, name)]
            v = rules_verdict(pol.inbound_rules if ingress else pol.outbound_rules, p)
            if v == "allow":
                return True
            if v == "deny":
                return False
            if v == "pass":
                passed = True
                break
        if not passed and tier.default_action != "pass":
            return False
    for prof in profiles:
        pr = profile_defs[prof]
        v = rules_verdict(pr.inbound_rules if ingress else pr.outbound_rules, p)
        if v == "allow":
            return True
        if v == "deny":
            return False
    return False


# --- random generation -----------------------------------------------------------------------

def _ranges(rng: random.Random) -> tuple[PortRange, ...]:
    out = []
    for _ in range(rng.randint(1, 3)):
        a = rng.choice(PORTS)
        out.append(PortRange(a, a) if rng.random() < 0.6 else PortRange(a, a + rng.randint(1, 500)))
    return tuple(out)


def random_rule(rng: random.Random, actions=("allow", "deny", "pass", "log")) -> Rule:  # type: ignore[no-untyped-def]
    kw: dict = {"action": rng.choice(actions)}
    proto = rng.choice([None, 6, 17, 1])
    if proto is not None:
        kw["protocol"] = proto
    elif rng.random() < 0.2:
        kw["not_protocol"] = rng.choice([6, 17])
    for f in ("src_nets", "dst_nets", "not_src_nets", "not_dst_nets"):
        if rng.random() < 0.25:
            kw[f] = tuple(rng.sample(NETS, rng.randint(1, 3)))
    for f, pool in (("src_ip_set_ids", ["s1", "s2"]), ("dst_ip_set_ids", ["s1", "s2"]),
                    ("not_src_ip_set_ids", ["s1", "s2"]), ("not_dst_ip_set_ids", ["s2"])):
        if rng.random() < 0.15:
            kw[f] = (rng.choice(pool),)
    if proto in (6, 17):
        for f in ("dst_ports", "not_dst_ports", "src_ports", "not_src_ports"):
            if rng.random() < 0.25:
                kw[f] = _ranges(rng)
    for f in ("dst_named_port_ip_set_ids", "not_dst_named_port_ip_set_ids",
              "src_named_port_ip_set_ids"):
        if rng.random() < 0.15:
            kw[f] = tuple(rng.sample(["np1", "np2"], rng.randint(1, 2)))
    if proto == 1:
        if rng.random() < 0.5:
            kw["icmp_type"] = rng.choice([0, 3, 8])
            if rng.random() < 0.5:
                kw["icmp_code"] = rng.choice([0, 1])
        if rng.random() < 0.3:
            kw["not_icmp_type"] = rng.choice([0, 3, 8])
            if rng.random() < 0.5:
                kw["not_icmp_code"] = rng.choice([0, 1])
    if rng.random() < 0.05:
        kw["ip_version"] = 6
    return Rule(**kw)


def random_packet(rng: random.Random) -> Packet:
    proto = rng.choice([6, 17, 1])
    if proto == 1:
        return Packet(src=rng.choice(ADDRS), dst=rng.choice(ADDRS), proto=1, sport=0, dport=0,
                      icmp_type=rng.choice([0, 3, 8]), icmp_code=rng.choice([0, 1]),
                      iif=A, oif=B)
    return Packet(src=rng.choice(ADDRS), dst=rng.choice(ADDRS), proto=proto,
                  sport=rng.choice([*PORTS, 40000]), dport=rng.choice([*PORTS, 40000, 700]),
                  iif=A, oif=B)


def test_rendered_chains_agree_with_reference_semantics() -> None:
    rng = random.Random(20240607)
    checked = 0
    for _scenario in range(60):
        policies: dict[PolicyID, Policy] = {}
        tiers = []
        for t in range(rng.randint(0, 3)):
            tier = f"t{t}"
            names_in, names_out = [], []
            for n in range(rng.randint(1, 3)):
                pid = PolicyID(tier, f"p{n}")
                policies[pid] = Policy(
                    inbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 4))),
                    outbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 4))))
                if rng.random() < 0.8:
                    names_in.append(pid.name)
                if rng.random() < 0.5:
                    names_out.append(pid.name)
            tiers.append(TierInfo(tier, tuple(names_in), tuple(names_out),
                                  default_action=rng.choice(["deny", "deny", "pass"])))
        profile_defs = {
            f"pr{i}": Profile(
                inbound_rules=tuple(random_rule(rng, ("allow", "deny", "log"))
                                    for _ in range(rng.randint(0, 3))),
                outbound_rules=tuple(random_rule(rng, ("allow", "deny", "log"))
                                     for _ in range(rng.randint(0, 3))))
            for i in range(2)
        }
        profiles_a = tuple(rng.sample(sorted(profile_defs), rng.randint(0, 2)))
        profiles_b = tuple(rng.sample(sorted(profile_defs), rng.randint(0, 2)))
        tiers_a = tuple(rng.sample(tiers, len(tiers))) if rng.random() < 0.3 else ()
        h = Harness()
        msgs: list[object] = [IPSetUpdate(k, t, frozenset(m)) for k, (t, m) in SETS.items()]
        msgs += [ActiveProfileUpdate(k, v) for k, v in profile_defs.items()]
        msgs += [ActivePolicyUpdate(k, v) for k, v in policies.items()]
        msgs += [endpoint(A, "10.65.0.1", tiers=tiers_a, profiles=profiles_a),
                 endpoint(B, "10.65.0.2", tiers=tuple(tiers), profiles=profiles_b)]
        h.sync(msgs)
        for _ in range(40):
            p = random_packet(rng)
            expected = (endpoint_allows(tiers_a, profiles_a, policies, profile_defs, p, False)
                        and endpoint_allows(tiers, profiles_b, policies, profile_defs, p, True))
            got = h.walker.verdict("FORWARD", p)
            assert got == ("ACCEPT" if expected else "DROP"), (p, tiers, policies)
            checked += 1
    assert checked == 2400

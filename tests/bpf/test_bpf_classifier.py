"""The classifier (agent/bpf/classifier.py) against the reference semantics, without a kernel.

The property test compiles random policies (tiers with Pass and both default actions, log
rules, profiles, nets / notNets, selectors / notSelectors through IP sets with nested
prefixes, ports / notPorts, named ports and their negation, protocol / notProtocol, ICMP
type / code and their negation) and checks, for random packets, that `classifier.decide()`
over the ENCODED map contents (the bytes the manager writes and the kernel reads) gives the
verdict of `tests.bpf.bpf_reference.expected_verdict` (Calico's semantics straight from the
proto messages). tests/privileged/bpf/test_priv_bpf_classifier.py runs the real program on
a sample of the same cases.
"""

from __future__ import annotations

import ipaddress
import random

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import classifier as cls
from pyfelix.agent.bpf import compiler as c
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps.rules import Action, PortMatch, RuleRecord, SetCheck
from tests.bpf.bpf_reference import Pkt, expected_verdict

WID = p.WorkloadEndpointID("k8s", "default/a", "eth0")
# both families: the sets hold IPv4 and IPv6 members, nested prefixes in each
SETS = {
    "sA": ("net", frozenset({"10.0.0.0/30", "10.0.1.1/32", "10.2.0.0/16", "fd00::/126",
                             "fd00:2::/32"})),
    "sB": ("net", frozenset({"10.0.0.2/31", "10.0.2.0/24", "10.2.3.0/24", "fd00::2/127",
                             "fd00:2:3::/48"})),
    "sC": ("net", frozenset({"10.0.1.0/24", "0.0.0.0/1", "::/1", "fd00:1::/64"})),
    "npA": ("ip_port", frozenset({"10.0.0.1/32,tcp:80", "10.0.1.1/32,udp:53",
                                  "10.0.2.2/32,tcp:8080", "10.2.0.0/16,tcp:80",
                                  "fd00::1/128,tcp:80", "fd00:2::/32,tcp:80"})),
    "npB": ("ip_port", frozenset({"10.0.0.2/32,tcp:81", "10.0.2.2/32,sctp:80",
                                  "fd00::2,tcp:81"})),
}
ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1", "10.0.2.2", "10.2.3.4", "10.2.9.9",
         "10.9.9.9", "192.168.1.1"]
ADDRS6 = ["fd00::1", "fd00::2", "fd00::3", "fd00:1::1", "fd00:2:3::4", "fd00:2:9::9",
          "fd09::9", "2001:db8::1", "::1"]
NETS = ["10.0.0.0/31", "10.0.1.0/24", "10.0.0.3/32", "10.2.0.0/15", "fd00::/8",
        "fd00::/127", "fd00:2::/32"]
PORTS = [0, 53, 79, 80, 81, 1000, 8080, 65535]
PROTOS = [1, 6, 17, 132, 47, 58]
ICMP_VALUES = [0, 3, 8, 11]


def _ranges(rng: random.Random) -> tuple[p.PortRange, ...]:
    out = []
    for _ in range(rng.choice([1, 1, 2, 3, 10])):
        a = rng.choice(PORTS)
        out.append(p.PortRange(a, rng.choice([x for x in PORTS if x >= a])))
    return tuple(out)


def random_rule(rng: random.Random) -> p.Rule:
    kw: dict = {"action": rng.choice(["allow", "allow", "deny", "pass", "log"])}
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
        key = rng.choice([
            "protocol", "not_protocol", "src_nets", "dst_nets", "not_src_nets", "not_dst_nets",
            "src_ip_set_ids", "dst_ip_set_ids", "not_src_ip_set_ids", "not_dst_ip_set_ids",
            "src_ports", "dst_ports", "not_src_ports", "not_dst_ports",
            "src_named_port_ip_set_ids", "dst_named_port_ip_set_ids",
            "not_src_named_port_ip_set_ids", "not_dst_named_port_ip_set_ids",
            "icmp", "not_icmp", "ip_version"])
        if key == "ip_version":
            kw[key] = rng.choice([4, 6])
        elif key in ("protocol", "not_protocol"):
            kw[key] = rng.choice(PROTOS)
        elif key.endswith("_nets"):
            kw[key] = tuple(rng.sample(NETS, rng.choice([1, 1, 2])))
        elif "named_port" in key:
            kw[key] = tuple(rng.sample(["npA", "npB"], rng.choice([1, 1, 2])))
        elif key.endswith("_ip_set_ids"):
            kw[key] = tuple(rng.sample(["sA", "sB", "sC"], rng.choice([1, 1, 2])))
        elif key.endswith("_ports"):
            kw[key] = _ranges(rng)
        elif key == "icmp":
            kw["icmp_type"] = rng.choice(ICMP_VALUES)
            if rng.random() < 0.5:
                kw["icmp_code"] = rng.choice([0, 1, 3])
        else:
            kw["not_icmp_type"] = rng.choice(ICMP_VALUES)
            if rng.random() < 0.5:
                kw["not_icmp_code"] = rng.choice([0, 1, 3])
    return p.Rule(**kw)


def random_scenario(rng: random.Random, max_rules: int = 6
                    ) -> tuple[c.PolicyState, p.WorkloadEndpoint]:
    s = c.PolicyState()
    for name, (typ, members) in SETS.items():
        s.apply(p.IPSetUpdate(name, typ, members))
    tiers = []
    for t in range(rng.randint(0, 3)):
        names = []
        for i in range(rng.randint(0, 2)):
            name = f"t{t}p{i}"
            s.apply(p.ActivePolicyUpdate(p.PolicyID(f"t{t}", name), p.Policy(
                inbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, max_rules))),
                outbound_rules=tuple(random_rule(rng)
                                     for _ in range(rng.randint(0, max_rules))))))
            names.append(name)
        tiers.append(p.TierInfo(f"t{t}", ingress_policies=tuple(names),
                                egress_policies=tuple(rng.sample(names, len(names))),
                                default_action=rng.choice(["deny", "pass"])))
    profiles = []
    for i in range(rng.randint(0, 2)):
        s.apply(p.ActiveProfileUpdate(f"prof{i}", p.Profile(
            inbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 3))),
            outbound_rules=tuple(random_rule(rng) for _ in range(rng.randint(0, 3))))))
        profiles.append(f"prof{i}")
    ep = p.WorkloadEndpoint("active", "cali1", tiers=tuple(tiers), profile_ids=tuple(profiles))
    s.apply(p.WorkloadEndpointUpdate(WID, ep))
    return s, ep


def random_packet(rng: random.Random, family: int | None = None) -> Pkt:
    """A random packet of `family` (either, when None)."""
    addrs = ADDRS6 if (family or rng.choice([4, 6])) == 6 else ADDRS
    proto_num = rng.choice(PROTOS)
    if proto_num in (1, 58):
        return Pkt(rng.choice(addrs), rng.choice(addrs), proto_num,
                   icmp_type=rng.choice(ICMP_VALUES), icmp_code=rng.choice([0, 1, 3]))
    if proto_num in (6, 17, 132):
        return Pkt(rng.choice(addrs), rng.choice(addrs), proto_num, rng.choice(PORTS),
                   rng.choice(PORTS))
    return Pkt(rng.choice(addrs), rng.choice(addrs), proto_num)


def classifier_packet(pkt: Pkt) -> cls.Packet:
    pflags = 0x01 if pkt.has_ports else 0x08 if pkt.is_icmp else 0
    if pkt.family == 6:
        pflags |= 0x80
    sport, dport = (pkt.sport, pkt.dport) if pkt.has_ports else (0, 0)
    return cls.Packet(int(ipaddress.ip_address(pkt.src)), int(ipaddress.ip_address(pkt.dst)),
                      pkt.proto, pflags, sport, dport, pkt.icmp_type, pkt.icmp_code)


def contents(out: c.CompiledDataplane) -> cls.MapContents:
    return cls.MapContents({
        "rules": out.all_rules(), "cls_chains": out.cls_chains,
        "cls_words": out.cls_words(set(out.cls_instances.values())),
        "cls_l4": out.cls_l4, "cls_tries": out.cls_tries})


def check_scenario(rng: random.Random, packets: int, max_rules: int = 6) -> int:
    state, ep = random_scenario(rng, max_rules)
    out = c.PolicyCompiler().compile(state, {"cali1": 1})
    assert out.problems == []
    m = contents(out)
    prog = out.programs[WID]
    n = 0
    for _ in range(packets):
        pkt = random_packet(rng)
        for direction, ref in (("ingress", prog.ingress), ("egress", prog.egress)):
            want = expected_verdict(state, ep, direction, pkt)
            got, _ = cls.decide(m, ref.start, ref.length, classifier_packet(pkt))
            assert got == want, (direction, pkt, [rules_map.describe(r) for r in ref.records])
            n += 1
    return n


def test_classifier_verdicts_equal_the_reference_on_10000_random_cases():
    rng = random.Random(20261202)
    cases = sum(check_scenario(rng, packets=20) for _ in range(300))
    assert cases >= 10_000


def test_classifier_verdicts_on_larger_random_policies():
    rng = random.Random(7)
    cases = sum(check_scenario(rng, packets=40, max_rules=60) for _ in range(15))
    assert cases >= 1_000


# --- pieces ---------------------------------------------------------------------------------


@pytest.mark.parametrize("first,last", [(0, 65535), (80, 80), (1, 65534), (1000, 1999),
                                        (0, 0), (65535, 65535), (8080, 8090)])
def test_port_prefixes_cover_the_range_exactly(first, last):
    covered = set()
    for value, plen in cls.port_prefixes(first, last):
        size = 1 << (16 - plen)
        assert value % size == 0
        block = set(range(value, value + size))
        assert not block & covered
        covered |= block
    assert covered == set(range(first, last + 1))


def test_nested_prefixes_give_the_sets_that_contain_the_address():
    v4, v6 = ipaddress.IPv4Address, ipaddress.IPv6Address
    members = {1: [(int(v4("10.0.0.0")), 8, 0, 0, 4), (int(v6("fd00::")), 8, 0, 0, 6)],
               2: [(int(v4("10.1.0.0")), 16, 0, 0, 4), (int(v6("fd00:1::")), 32, 0, 0, 6)],
               3: [(int(v4("10.1.2.3")), 32, 0, 0, 4), (int(v6("fd00:1::3")), 128, 0, 0, 6)],
               # same bits as 10.0.0.0/8, other family: never an ancestor of an IPv4 prefix
               4: [(int(v6("a00::")), 8, 0, 0, 6)]}
    sigs = cls._signatures(members)
    assert sigs[(4, 0, 0, int(v4("10.1.2.3")), 32)] == {1, 2, 3}
    assert sigs[(4, 0, 0, int(v4("10.1.0.0")), 16)] == {1, 2}
    assert sigs[(4, 0, 0, int(v4("10.0.0.0")), 8)] == {1}
    assert sigs[(6, 0, 0, int(v6("fd00:1::3")), 128)] == {1, 2, 3}
    assert sigs[(6, 0, 0, int(v6("fd00:1::")), 32)] == {1, 2}
    assert sigs[(6, 0, 0, int(v6("a00::")), 8)] == {4}


def test_a_field_no_record_constrains_is_not_looked_up():
    chain = (RuleRecord(Action.ALLOW, protocol=6), RuleRecord(Action.DENY))
    idx = cls.build_index(chain, lambda n: ())
    assert idx.flags == 1 << cls.F_L4
    assert idx.fixed[cls.F_SADDR] == cls.VEC_ALL and idx.fixed[cls.F_DPORT] == cls.VEC_ALL
    idx = cls.build_index((RuleRecord(Action.ALLOW),), lambda n: ())
    assert idx.flags == 0 and set(idx.fixed) == {cls.VEC_ALL}


def test_a_mixed_positive_port_group_is_refused():
    chain = (RuleRecord(Action.ALLOW, dst_ports=PortMatch(((80, 80),), (5,))),)
    with pytest.raises(cls.ClassifierError, match="mixes ranges and named ports"):
        cls.build_index(chain, lambda n: ())


def test_the_compiler_splits_ranges_and_named_ports_into_separate_records():
    s = c.PolicyState()
    s.apply(p.IPSetUpdate("np", "ip_port", frozenset({"10.0.0.1/32,tcp:8080"})))
    s.apply(p.ActivePolicyUpdate(p.PolicyID("t", "pol"), p.Policy(inbound_rules=(
        p.Rule("allow", dst_ports=(p.PortRange(80, 80),), dst_named_port_ip_set_ids=("np",)),))))
    s.apply(p.WorkloadEndpointUpdate(WID, p.WorkloadEndpoint(
        "active", "cali1", tiers=(p.TierInfo("t", ingress_policies=("pol",)),))))
    out = c.PolicyCompiler().compile(s, {"cali1": 1})
    recs = out.programs[WID].ingress.records
    assert [bool(r.dst_ports.ranges) for r in recs[:2]] == [True, False]
    assert [bool(r.dst_ports.named_sets) for r in recs[:2]] == [False, True]


def test_sparse_vectors_store_only_non_zero_words():
    allow = RuleRecord(Action.ALLOW, set_checks=(SetCheck(1, src=True),))
    chain = (*[allow] * 1000, RuleRecord(Action.DENY))
    members = {1: ((int(ipaddress.IPv4Address("10.0.0.1")), 32, 0, 0, 4),)}
    idx = cls.build_index(chain, lambda n: members.get(n, ()))
    assert idx.n_words == 16
    # two vectors: in the set (all 1,001 records: 16 words) and not (the deny only: 1 word)
    assert idx.vectors == 2
    assert idx.size == cls.words_map.HEADER_WORDS + (2 + 16) + (2 + 1)


def _one_policy_state(rules_: tuple[p.Rule, ...]) -> c.PolicyState:
    s = c.PolicyState()
    s.apply(p.ActivePolicyUpdate(p.PolicyID("t", "pol"), p.Policy(inbound_rules=rules_)))
    for i in range(3):
        s.apply(p.WorkloadEndpointUpdate(
            p.WorkloadEndpointID("k8s", f"default/p{i}", "eth0"),
            p.WorkloadEndpoint("active", f"cali{i}", tiers=(p.TierInfo(
                "t", ingress_policies=("pol",)),))))
    return s


def test_a_policy_that_exceeds_the_classifier_maps_keeps_the_previous_one():
    ifaces = {f"cali{i}": i + 1 for i in range(3)}
    comp = c.PolicyCompiler(cls_tries=40)
    small = _one_policy_state((p.Rule("allow", protocol=6, dst_ports=(p.PortRange(80, 80),)),))
    first = comp.compile(small, ifaces)
    assert first.problems == [] and first.full_maps == set()
    comp.commit(first)
    big = _one_policy_state(tuple(p.Rule("allow", protocol=6,
                                         dst_ports=(p.PortRange(1000 + 2 * i, 1000 + 2 * i),))
                                  for i in range(50)))
    second = comp.compile(big, ifaces)
    assert "cls_tries" in second.full_maps
    assert len(second.problems) == 3
    assert all("'cls_tries' is full" in x and "the previous policy stays in force" in x
               for x in second.problems)
    assert second.endpoints == first.endpoints  # every endpoint still on the old chain
    assert second.cls_chains == first.cls_chains
    wid = p.WorkloadEndpointID("k8s", "default/p0", "eth0")
    m = contents(second)
    ref = second.programs[wid].ingress
    allowed = classifier_packet(Pkt("10.1.1.1", "10.2.2.2", 6, 1, 80))
    assert cls.decide(m, ref.start, ref.length, allowed)[0] == "allow"
    assert cls.decide(m, ref.start, ref.length, classifier_packet(
        Pkt("10.1.1.1", "10.2.2.2", 6, 1, 1000)))[0] == "deny"


def test_a_first_policy_that_does_not_fit_denies_with_a_problem():
    comp = c.PolicyCompiler(cls_words=64)
    s = _one_policy_state(tuple(p.Rule("allow", protocol=6, src_nets=(f"10.0.{i}.0/24",))
                                for i in range(200)))
    out = comp.compile(s, {"cali0": 1})
    assert "cls_words" in out.full_maps
    assert any("denying all ingress traffic" in x for x in out.problems)
    ref = out.programs[p.WorkloadEndpointID("k8s", "default/p0", "eth0")].ingress
    assert ref.records == c.DENY_ALL


def test_member_changes_update_the_instance_in_place_when_the_vectors_exist():
    s = c.PolicyState()
    s.apply(p.IPSetUpdate("s", "net", frozenset({"10.0.0.1/32"})))
    s.apply(p.ActivePolicyUpdate(p.PolicyID("t", "pol"), p.Policy(inbound_rules=(
        p.Rule("allow", src_ip_set_ids=("s",)),))))
    s.apply(p.WorkloadEndpointUpdate(WID, p.WorkloadEndpoint(
        "active", "cali1", tiers=(p.TierInfo("t", ingress_policies=("pol",)),))))
    comp = c.PolicyCompiler()
    first = comp.compile(s, {"cali1": 1})
    comp.commit(first)
    s.apply(p.IPSetDeltaUpdate("s", added=frozenset({"10.0.0.2/32"})))
    second = comp.compile(s, {"cali1": 1})
    assert second.cls_chains == first.cls_chains and second.cls_new == set()
    assert set(second.cls_tries) - set(first.cls_tries) != set()
    ref = second.programs[WID].ingress
    pkt = classifier_packet(Pkt("10.0.0.2", "10.9.9.9", 6, 1, 2))
    assert cls.decide(contents(second), ref.start, ref.length, pkt)[0] == "allow"


def test_member_deltas_keep_the_classifier_exact_in_place_or_rebuilt():
    """Random IP-set deltas after a compile: the instance is updated in place (trie entries
    only) when it can be, rebuilt otherwise; either way the encoded maps decide as the
    reference does for every packet."""
    rng = random.Random(11)
    cases = in_place = 0
    for _ in range(80):
        state, ep = random_scenario(rng)
        comp = c.PolicyCompiler()
        out = comp.compile(state, {"cali1": 1})
        comp.commit(out)
        for _ in range(4):
            name = rng.choice(list(SETS))
            typ, _ = SETS[name]
            # both families: full-length members can be updated in place, shorter ones
            # need a rebuild
            pool = ([f"{a}/32" for a in ADDRS] + [f"{a}/128" for a in ADDRS6]
                    + ["10.2.3.0/24", "fd00:2:3::/48"])
            if typ == "ip_port":
                pool = [f"{a}/{32 if '.' in a else 128},{rng.choice(['tcp', 'udp'])}:"
                        f"{rng.choice([53, 80, 81])}" for a in ADDRS + ADDRS6]
            current = state.ipsets[name].members
            added = frozenset(rng.sample(pool, rng.randint(0, 3))) - current
            removed = frozenset(rng.sample(sorted(current), min(len(current),
                                                                 rng.randint(0, 2))))
            state.apply(p.IPSetDeltaUpdate(name, added=added, removed=removed - added))
            before = out
            out = comp.compile(state, {"cali1": 1})
            assert out.problems == []
            if not out.cls_new and out.cls_tries != before.cls_tries:
                in_place += 1
            comp.commit(out)
            m = contents(out)
            prog = out.programs[WID]
            for _ in range(10):
                pkt = random_packet(rng)
                for direction, ref in (("ingress", prog.ingress), ("egress", prog.egress)):
                    want = expected_verdict(state, ep, direction, pkt)
                    got, _ = cls.decide(m, ref.start, ref.length, classifier_packet(pkt))
                    assert got == want, (direction, pkt)
                    cases += 1
    assert cases >= 5_000 and in_place >= 20


def test_an_ipv6_member_added_in_place_is_found_by_ipv6_packets_only():
    s = c.PolicyState()
    s.apply(p.IPSetUpdate("s", "net", frozenset({"10.0.0.1/32", "fd00::1/128"})))
    s.apply(p.ActivePolicyUpdate(p.PolicyID("t", "pol"), p.Policy(inbound_rules=(
        p.Rule("allow", src_ip_set_ids=("s",)),))))
    s.apply(p.WorkloadEndpointUpdate(WID, p.WorkloadEndpoint(
        "active", "cali1", tiers=(p.TierInfo("t", ingress_policies=("pol",)),))))
    comp = c.PolicyCompiler()
    first = comp.compile(s, {"cali1": 1})
    comp.commit(first)
    s.apply(p.IPSetDeltaUpdate("s", added=frozenset({"fd00::2/128"})))
    second = comp.compile(s, {"cali1": 1})
    assert second.cls_chains == first.cls_chains and second.cls_new == set()  # in place
    ref = second.programs[WID].ingress
    m = contents(second)

    def verdict(src: str, dst: str) -> str:
        pkt = classifier_packet(Pkt(src, dst, 6, 1, 2))
        return cls.decide(m, ref.start, ref.length, pkt)[0]

    assert verdict("fd00::2", "fd00::9") == "allow"
    assert verdict("fd00::3", "fd00::9") == "deny"
    # the IPv4 address with the IPv6 member's leading bytes is not a member
    assert verdict("253.0.0.0", "10.9.9.9") == "deny"
    assert verdict("10.0.0.1", "10.9.9.9") == "allow"


def test_instances_written_before_a_commit_count_against_the_maps():
    """Before InSync nothing is committed or deleted: a compile that would need room held
    by earlier, uncommitted instances reports the map full instead of overflowing it."""
    ifaces = {f"cali{i}": i + 1 for i in range(3)}

    def ports(base: int) -> c.PolicyState:
        return _one_policy_state(tuple(
            p.Rule("allow", protocol=6, dst_ports=(p.PortRange(base + 2 * i, base + 2 * i),))
            for i in range(40)))

    comp = c.PolicyCompiler(cls_tries=60)
    first = comp.compile(ports(1000), ifaces)
    assert first.problems == []
    used = len(first.cls_tries)
    assert used <= 60 < used * 2  # one fits, two do not
    second = comp.compile(ports(3000), ifaces)  # no commit in between
    assert "cls_tries" in second.full_maps
    comp.commit(first)
    third = comp.compile(ports(3000), ifaces)
    assert "cls_tries" in third.full_maps  # the first is still in force until replaced

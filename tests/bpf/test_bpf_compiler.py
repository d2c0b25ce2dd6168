"""The policy compiler without a kernel: chain structure, sharing, id stability, adoption,
fail-closed problems, and (property test) that the compiled records decide exactly as
Calico's semantics say, via a Python mirror of the BPF walker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import compiler as c
from pyfelix.agent.bpf.maps import endpoints as endpoints_map
from pyfelix.agent.bpf.maps import ids as ids_map
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps import untracked as untracked_map
from pyfelix.agent.bpf.maps import wep_sources as sources_map
from pyfelix.agent.bpf.maps.base import FakeMap
from pyfelix.agent.bpf.maps.rules import Action
from tests.bpf.bpf_reference import Pkt, Trie, expected_verdict, walk_chain

WID = p.WorkloadEndpointID("k8s", "default/pod1", "eth0")
WID2 = p.WorkloadEndpointID("k8s", "default/pod2", "eth0")


def ep(tiers=(), profiles=("kns.default",), iface="cali1", state="active"):
    return p.WorkloadEndpoint(state=state, name=iface, profile_ids=profiles, tiers=tiers)


def base_state() -> c.PolicyState:
    s = c.PolicyState(hostname="node1")
    s.apply(p.ActiveProfileUpdate("kns.default", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))))
    return s


def policy(name, inbound=(), outbound=(), tier="default"):
    return p.ActivePolicyUpdate(p.PolicyID(tier, name),
                                p.Policy(inbound_rules=inbound, outbound_rules=outbound))


def actions(chain):
    return [r.action.name.lower() for r in chain]


def test_tiers_policies_tier_end_profiles_and_final_deny_in_order():
    s = base_state()
    s.apply(policy("a", inbound=(p.Rule("pass", protocol=17), p.Rule("allow", protocol=6))))
    s.apply(policy("b", inbound=(p.Rule("log"),), tier="t2"))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(
        p.TierInfo("default", ingress_policies=("a",)),
        p.TierInfo("t2", ingress_policies=("b",), default_action="pass"),
        p.TierInfo("t3", egress_policies=("zzz",)),  # no ingress policies: no records
    ))))
    out = c.PolicyCompiler().compile(s, {"cali1": 7})
    chain = out.programs[WID].ingress.records
    assert actions(chain) == ["pass", "allow", "deny", "log", "allow", "deny"]
    assert chain[0].jump == 3  # past tier "default"'s tier-end deny, to tier t2
    assert chain[2].counter_id != chain[5].counter_id  # tier-end vs final deny
    assert out.problems == ["endpoint k8s/default/pod1/eth0: policy t3/zzz (egress): "
                            "unknown policy; denying all egress traffic"]
    assert actions(out.programs[WID].egress.records) == ["deny"]


def test_pass_in_a_profile_goes_to_the_next_profile():
    s = base_state()
    s.apply(p.ActiveProfileUpdate("first", p.Profile(
        inbound_rules=(p.Rule("pass", protocol=6), p.Rule("deny")))))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(profiles=("first", "kns.default"))))
    chain = c.PolicyCompiler().compile(s, {}).programs[WID].ingress.records
    assert actions(chain) == ["pass", "deny", "allow", "deny"]
    assert chain[0].jump == 2


def test_no_policy_and_no_profile_is_a_single_deny():
    s = base_state()
    s.apply(p.WorkloadEndpointUpdate(WID, ep(profiles=())))
    out = c.PolicyCompiler().compile(s, {"cali1": 3})
    assert actions(out.programs[WID].ingress.records) == ["deny"]
    assert out.pending_interfaces == []


def test_identical_endpoints_share_one_chain_and_interfaces_without_ifindex_are_pending():
    s = base_state()
    s.apply(p.WorkloadEndpointUpdate(WID, ep(iface="cali1")))
    s.apply(p.WorkloadEndpointUpdate(WID2, ep(iface="cali2")))
    out = c.PolicyCompiler().compile(s, {"cali1": 3})
    a, b = out.programs[WID], out.programs[WID2]
    assert a.ingress.start == b.ingress.start and a.ingress.records == b.ingress.records
    assert a.endpoint_id != b.endpoint_id
    assert out.pending_interfaces == ["cali2"]
    assert list(out.endpoints) == [endpoints_map.encode_key(3)]
    # two chains (ingress, egress: their rules have different counters) for four references
    assert len(out.rules) == 4 and len(out.chains_in_use) == 2


def test_admin_down_endpoint_has_flag_and_empty_chains():
    s = base_state()
    s.apply(p.WorkloadEndpointUpdate(WID, ep(state="inactive")))
    out = c.PolicyCompiler().compile(s, {"cali1": 3})
    val = endpoints_map.decode_value(out.endpoints[endpoints_map.encode_key(3)])
    assert val["admin_down"] and val["ingress"]["len"] == 0 and val["egress"]["len"] == 0


def test_numbers_are_stable_and_freed_only_on_commit():
    s = base_state()
    s.apply(p.IPSetUpdate("s-a", "net", frozenset({"10.0.0.1/32"})))
    s.apply(p.IPSetUpdate("s-b", "net", frozenset({"10.0.0.2/32"})))
    comp = c.PolicyCompiler()
    first = comp.compile(s, {})
    ids_a = comp.set_ids.get("s-a", ids_map.IdKind.IPSET)
    assert (ids_a, comp.set_ids.get("s-b", ids_map.IdKind.IPSET)) == (1, 2)
    comp.commit(first)
    s.apply(p.IPSetRemove("s-a"))
    s.apply(p.IPSetUpdate("s-c", "net", frozenset({"10.0.0.3/32"})))
    second = comp.compile(s, {})
    # s-a's number is not reused before the kernel stopped using it (commit)
    assert comp.set_ids.get("s-c", ids_map.IdKind.IPSET) == 3
    comp.commit(second)
    s.apply(p.IPSetUpdate("s-d", "net", frozenset()))
    comp.compile(s, {})
    assert comp.set_ids.get("s-d", ids_map.IdKind.IPSET) == 1  # freed number reused
    assert ipsets_map.member_key(2, "10.0.0.2/32") in second.ipsets


def test_rule_nets_become_shared_net_sets_in_the_trie():
    s = base_state()
    nets = ("10.1.0.0/16", "10.2.0.0/16")
    s.apply(policy("a", inbound=(p.Rule("allow", src_nets=nets),
                                 p.Rule("deny", dst_nets=nets[::-1]))))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler().compile(s, {})
    chain = out.programs[WID].ingress.records
    (src_check,), (dst_check,) = chain[0].set_checks, chain[1].set_checks
    assert (src_check.src, dst_check.src) == (True, False)
    assert src_check.set_id == dst_check.set_id  # same nets, one set
    members = sorted(ipsets_map.decode_key(k)["member"] for k in out.ipsets)
    assert members == ["10.1.0.0/16", "10.2.0.0/16"]


def test_changed_chain_goes_to_a_new_region_and_old_region_is_reused_after_commit():
    s = base_state()
    s.apply(policy("a", inbound=(p.Rule("allow", protocol=6),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    comp = c.PolicyCompiler()
    r1 = comp.compile(s, {"cali1": 3})
    start1 = r1.programs[WID].ingress.start
    comp.commit(r1)
    s.apply(policy("a", inbound=(p.Rule("allow", protocol=17),)))
    r2 = comp.compile(s, {"cali1": 3})
    start2 = r2.programs[WID].ingress.start
    old = set(range(start1, start1 + r1.programs[WID].ingress.length))
    assert not old & set(range(start2, start2 + r2.programs[WID].ingress.length))
    assert r2.rules  # the new region must be written before the endpoint moves
    comp.commit(r2)
    s.apply(policy("a", inbound=(p.Rule("allow", protocol=132),)))
    r3 = comp.compile(s, {"cali1": 3})
    assert r3.programs[WID].ingress.start == start1  # freed region reused


def test_second_compile_of_same_state_writes_no_rules():
    s = base_state()
    s.apply(p.WorkloadEndpointUpdate(WID, ep()))
    comp = c.PolicyCompiler()
    r1 = comp.compile(s, {"cali1": 3})
    comp.commit(r1)
    r2 = comp.compile(s, {"cali1": 3})
    assert r2.rules == {} and r2.endpoints == r1.endpoints and r2.ids == r1.ids
    assert r2.all_rules() == r1.all_rules()


def _program_into_fakes(out: c.CompiledDataplane) -> dict[str, FakeMap]:
    fakes = {"ids": FakeMap(ids_map.PARAMS), "endpoints": FakeMap(endpoints_map.PARAMS),
             "rules": FakeMap(rules_map.PARAMS)}
    for name, entries in (("ids", out.ids), ("endpoints", out.endpoints),
                          ("rules", out.all_rules())):
        fakes[name].update_many(entries.items())
    return fakes


def test_restart_adopts_ids_and_chains_from_the_maps():
    s = base_state()
    s.apply(p.IPSetUpdate("s-x", "net", frozenset({"10.9.0.0/16"})))
    s.apply(p.IPSetUpdate("s-y", "net", frozenset({"10.8.0.0/16"})))
    s.apply(policy("a", inbound=(p.Rule("allow", src_ip_set_ids=("s-y",),
                                        dst_ports=(p.PortRange(80, 80),)),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    comp = c.PolicyCompiler()
    # make the allocation differ from what a fresh compiler would choose
    comp.set_ids.allocate("something-else", ids_map.IdKind.IPSET)
    first = comp.compile(s, {"cali1": 4})
    fakes = _program_into_fakes(first)
    adopted = c.AdoptedState.from_maps(fakes["ids"], fakes["endpoints"], fakes["rules"])
    again = c.PolicyCompiler(adopted=adopted).compile(s, {"cali1": 4})
    assert again.rules == {}  # every chain is already in place
    assert again.endpoints == first.endpoints and again.ipsets == first.ipsets
    assert again.ids == first.ids


def test_bad_fields_fail_the_endpoint_closed_naming_the_field():
    s = base_state()
    s.apply(policy("a", inbound=(p.Rule("allow", src_nets=("10.0.0.300/8",)),)))
    s.apply(policy("b", inbound=(p.Rule("allow", dst_ports=(p.PortRange(90, 80),)),)))
    s.apply(policy("c", inbound=(p.Rule("allow", protocol=300),)))
    s.apply(policy("d", inbound=(p.Rule("allow", src_ip_set_ids=("nope",)),)))
    s.apply(policy("e", inbound=(p.Rule("jump"),)))
    comp = c.PolicyCompiler()
    for name, field in (("a", "src_nets"), ("b", "dst_ports"), ("c", "protocol"),
                        ("d", "src_ip_set_ids"), ("e", "action")):
        s.endpoints = {WID: ep(tiers=(p.TierInfo("default", (name,)),))}
        out = comp.compile(s, {"cali1": 1})
        assert out.programs[WID].ingress.records == c.DENY_ALL
        assert len(out.problems) == 1
        assert f"policy default/{name}" in out.problems[0]
        assert f"field {field}" in out.problems[0]
        assert out.programs[WID].egress.records != c.DENY_ALL  # other direction unaffected


def test_rules_carry_the_families_felix_renders_them_for():
    s = base_state()
    s.apply(p.IPSetUpdate("s6", "net", frozenset({"fd00::1/128", "10.0.0.1/32"})))
    s.apply(policy("a", inbound=(
        p.Rule("deny", ip_version=6),
        p.Rule("deny", src_nets=("fd00::/64",)),  # IPv6 implied by its nets
        # IPv4 is filtered out of notNets entirely: Felix drops the rule for IPv4
        p.Rule("allow", src_nets=("fd00::/64", "10.0.0.0/8"), not_dst_nets=("fd00::/8",)),
        p.Rule("allow", ip_version=4, src_nets=("fd00::/64",)),  # matches nothing: omitted
        p.Rule("allow", src_ip_set_ids=("s6",)),  # both families
    )))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler().compile(s, {})
    assert out.problems == []
    chain = out.programs[WID].ingress.records
    assert actions(chain) == ["deny", "deny", "allow", "allow", "deny", "allow", "deny"]
    assert [r.ip_version for r in chain[:4]] == [6, 6, 6, None]
    assert len(chain[2].set_checks) == 2  # src in nets, dst not in notNets
    members = sorted(ipsets_map.decode_key(k)["member"] for k in out.ipsets)
    # net sets of rules 2 and 3 (fd00::/64 in both), rule 3's notNets, the IP set
    assert members == ["10.0.0.0/8", "10.0.0.1/32", "fd00::/64", "fd00::/64", "fd00::/8",
                       "fd00::1/128"]
    for rec in chain:  # the family survives the rules map
        assert rules_map.decode(rules_map.encode(rec)) == rec


def test_ipv6_support_false_programs_no_ipv6_and_keeps_rule_indices():
    s = c.PolicyState(hostname="node1", ipv6=False)
    s.apply(p.ActiveProfileUpdate("kns.default", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))))
    s.apply(p.IPSetUpdate("s6", "net", frozenset({"fd00::1/128", "10.0.0.1/32"})))
    s.apply(p.IPSetDeltaUpdate("s6", added=frozenset({"fd00::2/128", "10.0.0.2/32"})))
    s.apply(policy("a", inbound=(
        p.Rule("deny", ip_version=6),  # IPv6 only: nothing
        p.Rule("deny", src_nets=("fd00::/64",)),  # IPv6 only by its nets: nothing
        p.Rule("allow", src_nets=("fd00::/64", "10.0.0.0/8")),  # the IPv4 net only
        p.Rule("allow", src_ip_set_ids=("s6",)),
    )))
    s.apply(p.WorkloadEndpointUpdate(WID, p.WorkloadEndpoint(
        state="active", name="cali1", ipv4_nets=("10.1.0.1/32",), ipv6_nets=("fd00:1::1/128",),
        allow_spoofed_source_prefixes=("192.0.2.0/24", "2001:db8::/32"),
        tiers=(p.TierInfo("default", ("a",)),), profile_ids=("kns.default",))))
    out = c.PolicyCompiler().compile(s, {"cali1": 7})
    assert out.problems == []
    chain = out.programs[WID].ingress.records
    # rules 2 and 3, the tier's end, the profile's allow, the final deny
    assert actions(chain) == ["allow", "allow", "deny", "allow", "deny"]
    assert [r.ip_version for r in chain] == [4, 4, None, 4, None]  # rules: IPv4 only
    members = sorted(ipsets_map.decode_key(k)["member"] for k in out.ipsets)
    assert members == ["10.0.0.0/8", "10.0.0.1/32", "10.0.0.2/32"]
    sources = sorted(sources_map.decode_key(k)["src"] for k in out.wep_sources)
    assert sources == ["10.1.0.1/32", "192.0.2.0/24"]
    # the counters keep the rule's place in the policy as written
    names = {ids_map.decode_value(v) for v in out.ids.values()}
    assert any("default/a/ingress/2" in n for n in names), names
    assert not any("default/a/ingress/0" in n or "default/a/ingress/1" in n for n in names)


def test_an_invalid_ip_version_is_a_problem_naming_the_field():
    s = base_state()
    s.apply(policy("a", inbound=(p.Rule("allow", ip_version=5),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler().compile(s, {"cali1": 1})
    assert out.programs[WID].ingress.records == c.DENY_ALL
    assert any("field ip_version" in x for x in out.problems)


def test_port_ranges_are_merged_then_split_over_records():
    s = base_state()
    ports = tuple(p.PortRange(i, i) for i in range(100, 110))  # merges to one range
    ports += tuple(p.PortRange(i * 10, i * 10) for i in range(20, 40))  # 20 single ports
    s.apply(policy("a", inbound=(p.Rule("allow", protocol=6, dst_ports=ports),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler().compile(s, {})
    chain = out.programs[WID].ingress.records
    mains = [r for r in chain if r.action == Action.ALLOW and r.protocol == 6]
    assert len(mains) == 3  # 21 ranges / 8 slots
    assert (100, 109) in [rg for r in mains for rg in r.dst_ports.ranges]
    assert len({r.counter_id for r in mains}) == 1
    _assert_walk_matches_semantics(s, out, range(95, 400))


def _assert_walk_matches_semantics(s, out, ports, srcs=("10.0.0.1",)):
    trie = Trie(out.ipsets)
    chain = out.programs[WID].ingress.records
    seen = set()
    for src in srcs:
        for port in ports:
            pkt = Pkt(src, "10.0.5.5", 6, sport=1000, dport=port)
            want = expected_verdict(s, s.endpoints[WID], "ingress", pkt)
            assert walk_chain(trie, chain, pkt)[0] == want, pkt
            seen.add(want)
    assert seen == {"allow", "deny"}  # the sample exercises both outcomes


def test_overflowing_and_constraints_become_guards_skipping_the_rule():
    s = base_state()
    nested = {"s0": "10.0.0.0/16", "s1": "10.0.0.0/17", "s2": "10.0.0.0/18",
              "s3": "10.0.1.0/24", "s4": "10.0.2.0/24", "s5": "10.0.3.0/24",
              "s6": "10.0.0.0/19"}
    for name, net in nested.items():
        s.apply(p.IPSetUpdate(name, "net", frozenset({net})))
    not_ports = tuple(p.PortRange(i * 10, i * 10) for i in range(1, 12))
    s.apply(policy("a", inbound=(p.Rule("allow", src_ip_set_ids=("s0", "s1", "s2", "s6"),
                                        not_src_ip_set_ids=("s3", "s4", "s5"),
                                        not_dst_ports=not_ports),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler().compile(s, {})
    chain = out.programs[WID].ingress.records
    guards = [r for r in chain if r.action == Action.SKIP]
    assert len(guards) == 2  # 7 set checks: 6 slots + 1 guard; 11 not-ports: 8 + 1 guard
    assert all(g.jump == len(guards) + 1 and g.counter_id == 0 for g in guards)
    srcs = [f"10.0.{i}.{j}" for i in range(5) for j in (1, 200)]
    srcs += ["10.0.64.1", "10.0.200.1", "10.1.0.1"]
    _assert_walk_matches_semantics(s, out, range(0, 130, 5), srcs=srcs)


def test_chain_longer_than_the_walker_can_finish_denies_all():
    s = base_state()
    s.apply(policy("big", inbound=tuple(p.Rule("allow", protocol=6, dst_ports=(
        p.PortRange(i, i),)) for i in range(1, 40))))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("big",)),))))
    out = c.PolicyCompiler(max_chain_records=20).compile(s, {})
    assert out.programs[WID].ingress.records == c.DENY_ALL
    assert "more than the 20" in out.problems[0]


def test_rules_array_full_denies_only_the_endpoint_that_does_not_fit():
    s = base_state()
    s.apply(policy("big", inbound=tuple(p.Rule("allow", protocol=i) for i in range(10))))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("big",)),))))
    s.apply(p.WorkloadEndpointUpdate(WID2, ep(iface="cali2")))
    out = c.PolicyCompiler(rules_capacity=8).compile(s, {"cali1": 7, "cali2": 8})
    assert out.full_maps == {"rules"}
    assert actions(out.programs[WID].ingress.records) == ["deny"]
    assert any("'rules' is full" in x and "default/pod1" in x and "ingress" in x
               for x in out.problems)
    # the other endpoint keeps its real chains (profile allow + final deny)
    assert actions(out.programs[WID2].ingress.records) == ["allow", "deny"]
    assert endpoints_map.encode_key(8) in out.endpoints


def test_rules_array_with_no_room_at_all_leaves_the_endpoint_unprogrammed():
    s = base_state()
    s.apply(p.WorkloadEndpointUpdate(WID, ep()))
    out = c.PolicyCompiler(rules_capacity=0).compile(s, {"cali1": 7})
    assert out.full_maps == {"rules"}
    assert endpoints_map.encode_key(7) not in out.endpoints  # no entry: programs drop
    assert any("not programmed" in x for x in out.problems)


def test_unavailable_ipset_fails_closed_only_where_it_is_used():
    s = base_state()
    s.apply(p.IPSetUpdate("s-big", "net", frozenset({"10.1.0.1/32", "10.1.0.2/32"})))
    s.apply(p.IPSetUpdate("s-small", "net", frozenset({"10.2.0.1/32"})))
    s.apply(policy("uses-big", inbound=(p.Rule("allow", src_ip_set_ids=("s-big",)),)))
    s.apply(policy("uses-small", inbound=(p.Rule("allow", src_ip_set_ids=("s-small",)),)))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("uses-big",)),))))
    s.apply(p.WorkloadEndpointUpdate(WID2, ep(iface="cali2", tiers=(
        p.TierInfo("default", ("uses-small",)),))))
    compiler = c.PolicyCompiler()
    before = compiler.compile(s, {"cali1": 7, "cali2": 8})
    assert actions(before.programs[WID].ingress.records) == ["allow", "deny", "allow", "deny"]
    out = compiler.compile(s, {"cali1": 7, "cali2": 8},
                           unavailable_ipsets=frozenset({"s-big"}))
    assert actions(out.programs[WID].ingress.records) == ["deny"]
    assert actions(out.programs[WID].egress.records) != ["deny"]  # egress does not use it
    assert actions(out.programs[WID2].ingress.records) == ["allow", "deny", "allow", "deny"]
    members = {ipsets_map.decode_key(k)["member"] for k in out.ipsets}
    assert members == {"10.2.0.1/32"}
    assert any("s-big" in x and "full" in x for x in out.problems)
    assert set(out.ipset_numbers.values()) == {"s-big", "s-small"}


def test_counter_ids_exhausted_degrade_to_uncounted_with_a_problem():
    s = base_state()
    s.apply(policy("a", inbound=tuple(p.Rule("allow", protocol=i) for i in range(5))))
    s.apply(p.WorkloadEndpointUpdate(WID, ep(tiers=(p.TierInfo("default", ("a",)),))))
    out = c.PolicyCompiler(rule_counters=3).compile(s, {})
    chain = out.programs[WID].ingress.records
    assert [r.counter_id for r in chain[:3]] == [1, 2, 0]
    assert any("not counted" in x for x in out.problems)


def test_config_entry_from_felix_settings():
    s = base_state()
    # a FelixConfiguration spells the key in camelCase
    s.apply(p.ConfigUpdate((("defaultEndpointToHostAction", "Accept"),)))
    out = c.PolicyCompiler().compile(s, {"cali1": 9})
    assert list(out.config.values()) == [bytes([0] * 4 + [1, 0, 0, 0])]
    s.apply(p.ConfigUpdate((("DefaultEndpointToHostAction", "Bogus"),)))
    out = c.PolicyCompiler().compile(s, {})
    assert "DefaultEndpointToHostAction: 'Bogus'" in out.problems[0]


def test_untracked_xdp_entries_stop_at_the_first_rule_xdp_cannot_express():
    s = base_state()
    s.apply(p.IPSetUpdate("bad-guys", "net", frozenset({"203.0.113.0/24", "192.0.2.7"})))
    s.apply(policy("untr", inbound=(
        p.Rule("deny", src_nets=("198.51.100.0/24",)),
        p.Rule("log"),
        p.Rule("deny", src_ip_set_ids=("bad-guys",)),
        p.Rule("allow", src_nets=("10.0.0.0/8",)),
        p.Rule("deny", src_nets=("10.1.0.0/16",)),  # after an allow: not for XDP
    )))
    s.apply(p.HostEndpointUpdate(p.HostEndpointID("eth0-hep"), p.HostEndpoint(
        name="eth0", untracked_tiers=(p.TierInfo("default", ("untr",)),))))
    s.apply(p.HostEndpointUpdate(p.HostEndpointID("all"), p.HostEndpoint(
        name="*", untracked_tiers=(p.TierInfo("default", ("untr",)),))))
    out = c.PolicyCompiler().compile(s, {"eth0": 2})
    rows = sorted((untracked_map.decode_key(k)["ifindex"], untracked_map.decode_key(k)["src"])
                  for k in out.untracked)
    srcs = ["192.0.2.7/32", "198.51.100.0/24", "203.0.113.0/24"]
    assert rows == [(0, x) for x in srcs] + [(2, x) for x in srcs]


def test_delta_for_unknown_ip_set_is_a_clear_error():
    with pytest.raises(c.CompileError, match="'ghost'"):
        c.PolicyState().apply(p.IPSetDeltaUpdate("ghost", added=frozenset({"1.1.1.1/32"})))


def test_long_names_are_stored_as_digests_and_still_match():
    long_name = "x" * 300
    comp = c.PolicyCompiler()
    n = comp.set_ids.allocate(long_name, ids_map.IdKind.IPSET)
    assert comp.set_ids.get(long_name, ids_map.IdKind.IPSET) == n
    value = comp.set_ids.entries([n])[ids_map.encode_key(ids_map.IdKind.IPSET, n)]
    assert ids_map.decode_value(value).startswith("sha256:")


# --- property: compiled records decide as Calico's semantics say ------------------------------

SETS = {
    "sA": ("net", frozenset({"10.0.0.0/30", "10.0.1.1/32"})),
    "sB": ("net", frozenset({"10.0.0.2/31", "10.0.2.0/24"})),
    "sC": ("net", frozenset({"10.0.1.0/24"})),
    "npA": ("ip_port", frozenset({"10.0.0.1/32,tcp:80", "10.0.1.1/32,udp:53",
                                  "10.0.2.2/32,tcp:8080"})),
    "npB": ("ip_port", frozenset({"10.0.0.2/32,tcp:81", "10.0.2.2/32,sctp:80"})),
    "npC": ("ip_port", frozenset({"10.0.1.1/32,tcp:80"})),
}
ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.1", "10.0.2.2", "10.9.9.9"]
PROTOS = [1, 6, 17, 132]
PORTS = [53, 79, 80, 81, 8080]

port_ranges = st.lists(st.sampled_from(PORTS).flatmap(
    lambda a: st.sampled_from([x for x in PORTS if x >= a]).map(lambda b: p.PortRange(a, b))),
    max_size=10).map(tuple)
net_lists = st.lists(st.sampled_from(["10.0.0.0/31", "10.0.1.0/24", "10.0.0.3/32",
                                      "fd00::/8"]), max_size=2).map(tuple)
net_sets = st.lists(st.sampled_from(["sA", "sB", "sC"]), max_size=3).map(tuple)
np_sets = st.lists(st.sampled_from(["npA", "npB", "npC"]), max_size=3).map(tuple)
opt_proto = st.none() | st.sampled_from(PROTOS)
opt_byte = st.none() | st.sampled_from([0, 3, 8])


@st.composite
def rules(draw):
    kw = dict(
        action=draw(st.sampled_from(["allow", "deny", "pass", "log"])),
        protocol=draw(opt_proto), not_protocol=draw(opt_proto),
        src_nets=draw(net_lists), not_src_nets=draw(net_lists),
        dst_nets=draw(net_lists), not_dst_nets=draw(net_lists),
        src_ip_set_ids=draw(net_sets), not_src_ip_set_ids=draw(net_sets),
        dst_ip_set_ids=draw(net_sets), not_dst_ip_set_ids=draw(net_sets),
        src_ports=draw(port_ranges), not_src_ports=draw(port_ranges),
        dst_ports=draw(port_ranges), not_dst_ports=draw(port_ranges),
        src_named_port_ip_set_ids=draw(np_sets), dst_named_port_ip_set_ids=draw(np_sets),
        not_src_named_port_ip_set_ids=draw(np_sets), not_dst_named_port_ip_set_ids=draw(np_sets),
    )
    icmp_type = draw(opt_byte)
    not_icmp_type = draw(opt_byte)
    kw.update(icmp_type=icmp_type, icmp_code=draw(opt_byte) if icmp_type is not None else None,
              not_icmp_type=not_icmp_type,
              not_icmp_code=draw(opt_byte) if not_icmp_type is not None else None)
    # keep most rules simple so that a good share of packets match something
    simple = draw(st.sets(st.sampled_from(list(kw)[1:]), max_size=3))
    for key in list(kw)[1:]:
        if key not in simple and key not in ("icmp_code", "not_icmp_code"):
            kw[key] = None if key in ("protocol", "not_protocol", "icmp_type",
                                      "not_icmp_type") else ()
    if kw["icmp_type"] is None:
        kw["icmp_code"] = None
    if kw["not_icmp_type"] is None:
        kw["not_icmp_code"] = None
    return p.Rule(**kw)


packets = st.builds(
    Pkt, src=st.sampled_from(ADDRS), dst=st.sampled_from(ADDRS), proto=st.sampled_from(PROTOS),
    sport=st.sampled_from(PORTS), dport=st.sampled_from(PORTS),
    icmp_type=st.sampled_from([0, 3, 8]), icmp_code=st.sampled_from([0, 3]),
)


@st.composite
def scenarios(draw):
    s = c.PolicyState()
    for name, (typ, members) in SETS.items():
        s.apply(p.IPSetUpdate(name, typ, members))
    tiers = []
    for t in range(draw(st.integers(0, 3))):
        names = []
        for i in range(draw(st.integers(0, 2))):
            name = f"t{t}p{i}"
            s.apply(policy(name, tier=f"t{t}",
                           inbound=tuple(draw(st.lists(rules(), max_size=4))),
                           outbound=tuple(draw(st.lists(rules(), max_size=2)))))
            names.append(name)
        tiers.append(p.TierInfo(f"t{t}", ingress_policies=tuple(names),
                                egress_policies=tuple(names[:1]),
                                default_action=draw(st.sampled_from(["deny", "pass"]))))
    profiles = []
    for i in range(draw(st.integers(0, 2))):
        s.apply(p.ActiveProfileUpdate(f"prof{i}", p.Profile(
            inbound_rules=tuple(draw(st.lists(rules(), max_size=3))),
            outbound_rules=tuple(draw(st.lists(rules(), max_size=3))))))
        profiles.append(f"prof{i}")
    endpoint = ep(tiers=tuple(tiers), profiles=tuple(profiles))
    s.apply(p.WorkloadEndpointUpdate(WID, endpoint))
    return s, endpoint


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.lists(packets, min_size=1, max_size=8))
def test_compiled_chains_decide_like_calico_semantics(scenario, pkts):
    state, endpoint = scenario
    out = c.PolicyCompiler().compile(state, {"cali1": 1})
    assert out.problems == []
    trie = Trie(out.ipsets)
    prog = out.programs[WID]
    for pkt in pkts:
        for direction, ref in (("ingress", prog.ingress), ("egress", prog.egress)):
            want = expected_verdict(state, endpoint, direction, pkt)
            got, _ = walk_chain(trie, ref.records, pkt)
            assert got == want, (direction, pkt, [rules_map.describe(r) for r in ref.records])


def test_ip_set_changes_reach_the_trie_entries_across_compiles():
    s = base_state()
    s.apply(p.IPSetUpdate("s", "net", frozenset({"10.0.0.1/32"})))
    comp = c.PolicyCompiler()

    def members() -> list[str]:
        out = comp.compile(s, {})
        comp.commit(out)
        return sorted(ipsets_map.decode_key(k)["member"] for k in out.ipsets)

    assert members() == ["10.0.0.1/32"]
    s.apply(p.IPSetDeltaUpdate("s", added=frozenset({"10.0.0.2/32"})))
    assert members() == ["10.0.0.1/32", "10.0.0.2/32"]
    s.apply(p.IPSetDeltaUpdate("s", removed=frozenset({"10.0.0.1/32"})))
    assert members() == ["10.0.0.2/32"]
    s.apply(p.IPSetUpdate("s", "net", frozenset({"10.0.0.3/32", "bogus"})))
    out = comp.compile(s, {})
    assert [ipsets_map.decode_key(k)["member"] for k in out.ipsets] == ["10.0.0.3/32"]
    assert len(out.problems) == 1
    assert out.problems[0].startswith("IP set s: IP set member 'bogus'")
    assert out.problems[0].endswith("; member ignored")


def _keys(out: c.CompiledDataplane, number: int) -> set[bytes]:
    return set(out.ipset_groups[number].keys)


def test_ipset_groups_keep_their_generation_and_deltas_carry_the_difference():
    s = c.PolicyState()
    s.apply(p.IPSetUpdate("s1", "net", frozenset({"10.0.0.1/32", "10.0.0.2/32"})))
    s.apply(p.IPSetUpdate("s2", "net", frozenset({"10.9.0.1/32"})))
    compiler = c.PolicyCompiler()
    first = compiler.compile(s, {})
    n1 = compiler.set_ids.get("s1", c.IdKind.IPSET)
    n2 = compiler.set_ids.get("s2", c.IdKind.IPSET)
    g1 = first.ipset_groups[n1]
    s.apply(p.IPSetDeltaUpdate("s1", added=frozenset({"10.0.0.3/32"}),
                               removed=frozenset({"10.0.0.1/32"})))
    second = compiler.compile(s, {})
    assert second.ipset_groups[n2] is first.ipset_groups[n2]  # untouched set: same object
    g1b = second.ipset_groups[n1]
    assert g1b.base_generation == g1.generation and g1b.generation != g1.generation
    assert g1b.added == (ipsets_map.member_key(n1, "10.0.0.3/32"),)
    assert g1b.removed == (ipsets_map.member_key(n1, "10.0.0.1/32"),)
    assert set(g1.keys) == {ipsets_map.member_key(n1, m) for m in ("10.0.0.1/32",
                                                                   "10.0.0.2/32")}
    # removed and added back within the deltas of one compile: no net change
    s.apply(p.IPSetDeltaUpdate("s1", removed=frozenset({"10.0.0.2/32"})))
    s.apply(p.IPSetDeltaUpdate("s1", added=frozenset({"10.0.0.2/32"})))
    third = compiler.compile(s, {})
    assert third.ipset_groups[n1].added == () and third.ipset_groups[n1].removed == ()
    assert _keys(third, n1) == _keys(second, n1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sets(st.integers(0, 40), max_size=6),
                          st.sets(st.integers(0, 40), max_size=6)), max_size=12),
       st.integers(1, 4))
def test_compiling_after_deltas_equals_compiling_from_scratch(deltas, every):
    def member(i: int) -> str:
        # two spellings of some addresses: the same trie key from different members
        return f"10.1.0.{i % 30}" + ("/32" if i >= 30 else "")

    s = c.PolicyState()
    s.apply(p.IPSetUpdate("s", "net", frozenset(member(i) for i in range(0, 40, 3))))
    compiler = c.PolicyCompiler()
    out = compiler.compile(s, {})
    for step, (added, removed) in enumerate(deltas):
        current = s.ipsets["s"].members
        add = frozenset(member(i) for i in added) - current
        remove = frozenset(member(i) for i in removed) & current - add
        s.apply(p.IPSetDeltaUpdate("s", added=add, removed=remove))
        if step % every == 0:
            previous = {k for g in out.ipset_groups.values() for k in g.keys}
            out = compiler.compile(s, {})
            group = next(iter(out.ipset_groups.values()))
            if group.base_generation is not None:
                assert previous - set(group.removed) | set(group.added) == set(group.keys)
    out = compiler.compile(s, {})
    fresh = c.PolicyCompiler().compile(s, {})
    assert out.ipsets == fresh.ipsets

"""BpfPolicyManager on FakeMaps: writes only differences, adopts pinned state after a
restart, removes stale state only after InSync, and handles full maps by failing closed for
the affected endpoints only (counted, never silent)."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent import proto as p
from pyfelix.agent.bpf.maps import endpoints as endpoints_map
from pyfelix.agent.bpf.maps import ids as ids_map
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps.base import FakeMap
from pyfelix.agent.bpf.maps.ids import IdKind
from pyfelix.agent.dataplane.events import IFACE_ABSENT, IFACE_UP, InterfaceUpdate
from pyfelix.agent.dataplane.managers.bpf_policy import BpfPolicyManager
from tests.bpf.fakes import fake_maps, total_writes

IFACES = {"cali1": 11, "cali2": 12, "cali3": 13, "eth0": 2}


def wid(name: str) -> p.WorkloadEndpointID:
    return p.WorkloadEndpointID("k8s", f"default/{name}", "eth0")


def endpoint(name: str, iface: str, *policies: str, profiles=("kns.default",)):
    tiers = (p.TierInfo("default", ingress_policies=policies),) if policies else ()
    return p.WorkloadEndpointUpdate(wid(name), p.WorkloadEndpoint(
        "active", iface, profile_ids=profiles, tiers=tiers, ipv4_nets=("10.65.0.1/32",)))


def allow_from(name: str, set_id: str) -> p.ActivePolicyUpdate:
    return p.ActivePolicyUpdate(p.PolicyID("default", name), p.Policy(inbound_rules=(
        p.Rule("allow", protocol=6, src_ip_set_ids=(set_id,)),)))


def members(n: int, base: int = 0) -> frozenset[str]:
    return frozenset(f"10.{(base + i) // 65536 % 256}.{(base + i) // 256 % 256}.{(base + i) % 256}"
                     f"/32" for i in range(n))


def scenario() -> list[object]:
    return [
        p.ActiveProfileUpdate("kns.default", p.Profile(
            inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))),
        p.IPSetUpdate("s-clients", "net", members(5)),
        allow_from("allow-clients", "s-clients"),
        endpoint("a", "cali1", "allow-clients"),
        endpoint("b", "cali2"),
    ]


def interfaces() -> list[object]:
    return [InterfaceUpdate(n, i, IFACE_UP) for n, i in IFACES.items()]


def manager(maps: dict[str, FakeMap], **kw) -> BpfPolicyManager:
    return BpfPolicyManager(maps, list_interfaces=lambda: (dict(IFACES), {}), **kw)


def feed(m: BpfPolicyManager, msgs: list[object]) -> None:
    for msg in msgs:
        m.on_update(msg)


def ingress_actions(maps: dict[str, FakeMap], ifindex: int) -> list[str] | None:
    raw = maps["endpoints"].data.get(endpoints_map.encode_key(ifindex))
    if raw is None:
        return None
    e = endpoints_map.decode_value(raw)["ingress"]
    chain = rules_map.read_chain(maps["rules"], e["start"], e["len"])
    return [r.action.name.lower() for r in chain]


def set_members(maps: dict[str, FakeMap]) -> set[str]:
    return {ipsets_map.decode_key(k)["member"] for k in maps["ipsets"].data}


def full_errors(map_name: str) -> float:
    return REGISTRY.get_sample_value("pyfelix_bpf_map_full_errors_total",
                                     {"map": map_name}) or 0.0


def test_programs_every_map_from_messages():
    maps = fake_maps()
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    assert ingress_actions(maps, 11) == ["allow", "deny", "allow", "deny"]
    assert ingress_actions(maps, 12) == ["allow", "deny"]
    assert set_members(maps) == members(5)
    names = {ids_map.decode_value(v) for v in maps["ids"].data.values()}
    assert {"s-clients", "k8s/default/a/eth0", "k8s/default/b/eth0"} <= names
    assert maps["config"].data  # endpoint-to-host action written
    assert not m.problems()


def test_applying_the_same_state_twice_writes_nothing():
    maps = fake_maps()
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    before = total_writes(maps)
    feed(m, scenario())  # the same messages again: dirty, but nothing differs
    m.apply()
    m.request_resync()  # re-reads every map; still nothing to write
    m.apply()
    assert total_writes(maps) == before


def test_only_the_difference_is_written():
    maps = fake_maps()
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    before = total_writes(maps)
    m.on_update(p.IPSetDeltaUpdate("s-clients", added=frozenset({"10.9.9.9/32"})))
    m.apply()
    after = total_writes(maps)
    changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    # the member, and its entry in the classifier of the one chain that checks the set
    # (its signature's vector exists: the instance is updated in place)
    assert changed == {"ipsets": 1, "cls_tries": 1}
    assert "10.9.9.9/32" in set_members(maps)


def test_a_restarted_manager_adopts_the_pinned_state_and_writes_nothing():
    maps = fake_maps()
    first = manager(maps)
    feed(first, [*scenario(), *interfaces(), p.InSync()])
    first.apply()
    snapshot = {n: dict(fm.data) for n, fm in maps.items()}
    before = total_writes(maps)
    restarted = manager(maps)  # same pinned maps, new process
    feed(restarted, [*scenario(), *interfaces(), p.InSync()])
    restarted.apply()
    assert total_writes(maps) == before
    assert {n: dict(fm.data) for n, fm in maps.items()} == snapshot
    assert restarted.compiler is not None
    assert restarted.compiler.set_ids.get("s-clients", IdKind.IPSET) == \
        first.compiler.set_ids.get("s-clients", IdKind.IPSET)


def test_stale_state_is_removed_only_after_in_sync():
    maps = fake_maps()
    first = manager(maps)
    feed(first, [*scenario(), endpoint("c", "cali3"), *interfaces(), p.InSync()])
    first.apply()
    assert ingress_actions(maps, 13) is not None
    # the restarted agent never hears of pod c nor of the IP set (deleted while it was down)
    restarted = manager(maps)
    feed(restarted, [p.ActiveProfileUpdate("kns.default", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))),
        endpoint("a", "cali1"), endpoint("b", "cali2"), *interfaces()])
    restarted.apply()  # before InSync: adds/changes only
    assert ingress_actions(maps, 11) == ["allow", "deny"]  # a's new chain is in place
    assert ingress_actions(maps, 13) is not None  # c's entry untouched
    assert set_members(maps) == members(5)  # the old set's members untouched
    restarted.on_update(p.InSync())
    restarted.apply()
    assert ingress_actions(maps, 13) is None
    assert set_members(maps) == set()
    names = {ids_map.decode_value(v) for v in maps["ids"].data.values()}
    assert "s-clients" not in names and "k8s/default/c/eth0" not in names


def test_endpoint_waits_for_its_interface_and_goes_with_it():
    maps = fake_maps()
    m = BpfPolicyManager(maps, list_interfaces=lambda: ({}, {}))
    feed(m, [*scenario(), p.InSync()])
    m.apply()
    assert not maps["endpoints"].data
    m.on_update(InterfaceUpdate("cali1", 11, IFACE_UP))
    m.apply()
    assert ingress_actions(maps, 11) is not None
    m.on_update(InterfaceUpdate("cali1", 11, IFACE_ABSENT))
    m.apply()
    assert ingress_actions(maps, 11) is None


def test_ipset_that_does_not_fit_fails_closed_only_where_used():
    maps = fake_maps(ipsets=30)
    m = manager(maps)
    before = full_errors("ipsets")
    feed(m, [*scenario(), p.IPSetUpdate("s-big", "net", members(40, base=1000)),
             allow_from("allow-big", "s-big"), endpoint("c", "cali3", "allow-big"),
             *interfaces(), p.InSync()])
    m.apply()
    assert m.unavailable_ipsets == {"s-big"}
    assert full_errors("ipsets") == before + 1
    assert ingress_actions(maps, 13) == ["deny"]  # uses the set: fails closed
    assert ingress_actions(maps, 11) == ["allow", "deny", "allow", "deny"]  # unaffected
    assert ingress_actions(maps, 12) == ["allow", "deny"]
    assert set_members(maps) == members(5)  # no partial members of s-big left
    assert any("s-big" in x and "full" in x for x in m.problems())
    # the set shrinks until it fits: retried, and the endpoint gets its real chain
    m.on_update(p.IPSetUpdate("s-big", "net", members(20, base=1000)))
    m.apply()
    assert m.unavailable_ipsets == frozenset()
    assert ingress_actions(maps, 13) == ["allow", "deny", "allow", "deny"]
    assert members(20, base=1000) <= set_members(maps)


def test_endpoints_map_full_leaves_only_the_extra_endpoint_unprogrammed():
    maps = fake_maps(endpoints=2)
    m = manager(maps)
    before = full_errors("endpoints")
    feed(m, [*scenario(), endpoint("c", "cali3"), *interfaces(), p.InSync()])
    m.apply()  # no exception: a full map is a counted error, not a failed round
    programmed = [i for i in (11, 12, 13) if ingress_actions(maps, i) is not None]
    assert len(programmed) == 2
    assert full_errors("endpoints") == before + 1


def test_rules_map_full_denies_the_endpoint_that_does_not_fit():
    maps = fake_maps(rules=5)  # b's two 2-record chains fit; z's 4-record chain does not
    m = manager(maps)
    before = full_errors("rules")
    profile, ipset, policy = scenario()[:3]
    feed(m, [profile, ipset, policy, endpoint("b", "cali2"),
             endpoint("z", "cali3", "allow-clients"), *interfaces(), p.InSync()])
    m.apply()
    assert ingress_actions(maps, 12) == ["allow", "deny"]
    assert ingress_actions(maps, 13) == ["deny"]
    assert full_errors("rules") == before + 1
    assert any("k8s/default/z/eth0" in x and "'rules' is full" in x for x in m.problems())


def test_a_failed_write_is_retried_by_the_next_apply():
    maps = fake_maps()
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    maps["endpoints"].fail_next = OSError(5, "EIO")
    with pytest.raises(OSError):
        m.apply()
    m.apply()
    assert ingress_actions(maps, 11) is not None and ingress_actions(maps, 12) is not None


def test_kernel_drift_is_repaired_at_resync():
    maps = fake_maps()
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    maps["endpoints"].data.pop(endpoints_map.encode_key(11))  # someone deleted it
    maps["ipsets"].data[ipsets_map.member_key(99, "1.2.3.4/32")] = ipsets_map.VALUE
    m.request_resync()
    m.apply()
    assert ingress_actions(maps, 11) is not None
    assert "1.2.3.4/32" not in set_members(maps)


def test_counter_slots_of_new_ids_are_zeroed():
    maps = fake_maps()
    junk = b"\xff" * maps["rule_counters"].value_blob_size
    for i in range(1, 10):
        maps["rule_counters"].data[i.to_bytes(4, "little")] = junk
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    used = m.last_compiled.numbers_in_use["rules"]
    assert used
    for n in used:
        assert maps["rule_counters"].data[n.to_bytes(4, "little")] == \
            bytes(maps["rule_counters"].value_blob_size)


def test_bad_message_is_logged_not_raised():
    maps = fake_maps()
    m = manager(maps)
    m.on_update(p.IPSetDeltaUpdate("nope", added=frozenset({"1.1.1.1/32"})))
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    assert ingress_actions(maps, 11) is not None




def test_untracked_denies_of_a_host_endpoint_known_by_its_expected_ips():
    from pyfelix.agent.bpf.maps import untracked as untracked_map

    maps = fake_maps()
    m = BpfPolicyManager(maps, list_interfaces=lambda: (dict(IFACES), {
        "eth0": frozenset({"198.18.0.1/15"})}))
    feed(m, [p.ActivePolicyUpdate(p.PolicyID("default", "block"), p.Policy(
        untracked=True, inbound_rules=(p.Rule("deny", src_nets=("192.0.2.0/24",)),))),
        p.HostEndpointUpdate(p.HostEndpointID("node-eth0"), p.HostEndpoint(
            "", expected_ipv4_addrs=("198.18.0.1",),
            untracked_tiers=(p.TierInfo("default", ingress_policies=("block",)),))),
        p.InSync()])
    m.apply()
    keys = [untracked_map.decode_key(k) for k in maps["untracked"].data]
    assert [(k["ifindex"], k["src"]) for k in keys] == [(IFACES["eth0"], "192.0.2.0/24")]


def test_small_ifindexes_are_mirrored_in_the_array_and_cleared_with_their_endpoint():
    from pyfelix.agent.bpf.maps import ep_by_ifindex as ep_array

    maps = fake_maps(ep_by_ifindex=12)  # cali1 (ifindex 11) fits, cali2 (12) does not
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    array = maps["ep_by_ifindex"]
    slot = array.data[ep_array.encode_index(11)]
    entry = maps["endpoints"].data[endpoints_map.encode_key(11)]
    mirrored = endpoints_map.decode_value(slot)
    assert mirrored["flags"] == endpoints_map.decode_value(entry)["flags"] | ep_array.FLAG_PRESENT
    assert {**mirrored, "flags": 0} == {**endpoints_map.decode_value(entry), "flags": 0}
    assert ep_array.encode_index(12) not in array.data  # beyond the array: the hash only
    assert endpoints_map.encode_key(12) in maps["endpoints"].data
    assert [r["ifindex"] for r in ep_array.dump(array)] == [11]
    writes = total_writes(maps)
    m.request_resync()
    m.apply()
    assert total_writes(maps) == writes  # the same state again writes nothing
    m.on_update(p.WorkloadEndpointRemove(wid("a")))
    m.apply()
    assert array.data[ep_array.encode_index(11)] == ep_array.EMPTY  # cleared, not PRESENT
    assert endpoints_map.encode_key(11) not in maps["endpoints"].data
    assert ep_array.dump(array) == []


def test_a_restarted_manager_clears_the_array_slot_of_an_endpoint_gone_while_it_was_down():
    from pyfelix.agent.bpf.maps import ep_by_ifindex as ep_array

    maps = fake_maps()
    first = manager(maps)
    feed(first, [*scenario(), *interfaces(), p.InSync()])
    first.apply()
    assert [r["ifindex"] for r in ep_array.dump(maps["ep_by_ifindex"])] == [11, 12]
    restarted = manager(maps)  # same pinned maps; endpoint b was deleted meanwhile
    feed(restarted, [m for m in scenario() if getattr(m, "id", None) != wid("b")])
    feed(restarted, [*interfaces(), p.InSync()])
    restarted.apply()
    assert [r["ifindex"] for r in ep_array.dump(maps["ep_by_ifindex"])] == [11]
    assert endpoints_map.encode_key(12) not in maps["endpoints"].data


def test_a_policy_too_big_for_the_classifier_maps_keeps_the_previous_one_and_is_counted():
    maps = fake_maps(cls_tries=64)
    m = manager(maps)
    feed(m, [*scenario(), *interfaces(), p.InSync()])
    m.apply()
    assert m.problems() == []
    entries = dict(maps["endpoints"].data)
    chains = dict(maps["cls_chains"].data)
    before = full_errors("cls_tries")
    # 100 distinct ports: ~200 port-trie entries, more than the map holds
    m.on_update(p.ActivePolicyUpdate(p.PolicyID("default", "allow-clients"), p.Policy(
        inbound_rules=tuple(p.Rule("allow", protocol=6, dst_ports=(p.PortRange(
            1000 + 2 * i, 1000 + 2 * i),)) for i in range(100)))))
    m.apply()
    assert full_errors("cls_tries") == before + 1
    assert any("'cls_tries' is full" in x and "previous policy stays in force" in x
               for x in m.problems())
    assert maps["endpoints"].data == entries  # endpoint a still on its old chain
    assert maps["cls_chains"].data == chains
    assert ingress_actions(maps, IFACES["cali1"]) == ["allow", "deny", "allow", "deny"]
    # a policy that fits again is installed
    m.on_update(allow_from("allow-clients", "s-clients"))
    m.apply()
    assert m.problems() == []

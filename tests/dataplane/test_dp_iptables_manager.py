"""iptables + ipsets managers on FakeCommands: diff-only writes, idempotence, failures,
drift repair, stale sweep after InSync, Felix's ipset/iptables ordering, backend choice."""

from __future__ import annotations

import pytest

from pyfelix.agent.dataplane.iptables.names import ipset_name
from pyfelix.agent.dataplane.iptables.restore import (
    BACKENDS,
    IptablesBinaries,
    IptablesError,
    IptablesTable,
    detect_backend,
    parse_save,
)
from pyfelix.agent.dataplane.managers.ipsets import IPSetError
from pyfelix.agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    ActiveProfileUpdate,
    InSync,
    IPSetDeltaUpdate,
    IPSetRemove,
    IPSetUpdate,
    Policy,
    PolicyID,
    Profile,
    Rule,
    TierInfo,
    WorkloadEndpointID,
    WorkloadEndpointRemove,
)
from tests.dataplane.dp_harness import Harness, endpoint
from tests.fakes.commands import FakeCommands

OPEN = ActiveProfileUpdate("open", Profile(inbound_rules=(Rule(action="allow"),),
                                           outbound_rules=(Rule(action="allow"),)))


def _state(n_endpoints: int = 3) -> list[object]:
    msgs: list[object] = [
        IPSetUpdate("s-web", "net", frozenset({"10.65.0.2/32"})),
        IPSetUpdate("n-web", "ip_port", frozenset({"10.65.0.2/32,tcp:8080"})),
        OPEN,
        ActivePolicyUpdate(PolicyID("default", "web"), Policy(inbound_rules=(
            Rule(action="allow", protocol=6, src_ip_set_ids=("s-web",),
                 dst_named_port_ip_set_ids=("n-web",)),))),
    ]
    for i in range(n_endpoints):
        msgs.append(endpoint(f"cali{i}", f"10.65.0.{i + 1}", profiles=["open"],
                             tiers=[TierInfo("default", ingress_policies=("web",))]))
    return msgs


def _writes(h: Harness) -> int:
    return h.cmds.iptables.restore_calls + h.cmds.ipset.restore_calls


def test_same_messages_twice_second_apply_writes_nothing() -> None:
    h = Harness()
    h.sync(_state())
    assert h.cmds.iptables.restore_calls == 1 and h.cmds.ipset.restore_calls == 1
    before = _writes(h)
    h.feed(_state())  # the very same messages again
    h.apply()
    assert _writes(h) == before
    calls = len(h.cmds.calls)
    h.apply()
    assert len(h.cmds.calls) == calls  # not even a process started


def test_resync_without_drift_reads_but_writes_nothing() -> None:
    h = Harness()
    h.sync(_state())
    before = _writes(h)
    h.iptables.request_resync()
    h.ipsets.request_resync()
    h.apply()
    assert _writes(h) == before
    assert h.cmds.iptables.save_calls >= 2 and h.cmds.ipset.save_calls >= 2


def test_only_changed_chains_are_rewritten() -> None:
    h = Harness()
    h.sync(_state())
    h.feed([ActivePolicyUpdate(PolicyID("default", "web"), Policy(inbound_rules=(
        Rule(action="allow", protocol=17),)))])
    h.apply()
    text = h.cmds.iptables.restore_inputs[-1]
    declared = [ln for ln in text.splitlines() if ln.startswith(":")]
    assert len(declared) == 1 and declared[0].startswith(":cali-pi-")
    assert "cali-tw-cali0" not in text


def test_restart_adopts_kernel_state_without_writing() -> None:
    h = Harness()
    h.sync(_state())
    before = _writes(h)
    # a new agent (new managers) over the same kernel
    h2 = Harness()
    h2.cmds = h.cmds
    from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
    from pyfelix.agent.dataplane.managers.iptables import IptablesManager

    h2.ipsets = IPSetsManager(runner=h.cmds)
    h2.iptables = IptablesManager(runner=h.cmds)
    h2.sync(_state())
    assert _writes(h) == before


def test_stale_chains_and_sets_removed_only_after_insync() -> None:
    h = Harness()
    h.sync(_state())
    from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
    from pyfelix.agent.dataplane.managers.iptables import IptablesManager

    ipsets, iptables = IPSetsManager(runner=h.cmds), IptablesManager(runner=h.cmds)
    one_endpoint = [OPEN, endpoint("cali0", "10.65.0.1", profiles=["open"])]
    for m in one_endpoint:
        ipsets.on_update(m)
        iptables.on_update(m)
    ipsets.apply()
    iptables.apply()
    ipsets.finish_apply()
    chains = h.cmds.iptables.user_chains()
    assert "cali-tw-cali2" in chains  # before InSync: nothing of ours removed
    assert h.cmds.ipset.exists(ipset_name("s-web", "net"))
    for mgr in (ipsets, iptables):
        mgr.on_update(InSync())
    ipsets.apply()
    iptables.apply()
    ipsets.finish_apply()
    chains = h.cmds.iptables.user_chains()
    assert "cali-tw-cali2" not in chains and "cali-tw-cali0" in chains
    assert not any(c.startswith("cali-pi-") for c in chains)
    assert h.cmds.ipset.sets == {}


def test_removal_order_sets_outlive_the_rules_that_use_them() -> None:
    h = Harness()
    h.sync(_state())
    # the sequencer's order: endpoints updated, then policy removed, then sets removed
    h.feed([endpoint(f"cali{i}", f"10.65.0.{i + 1}", profiles=["open"]) for i in range(3)])
    h.feed([ActivePolicyRemove(PolicyID("default", "web")), IPSetRemove("s-web"),
            IPSetRemove("n-web")])
    h.apply()  # would raise if a set were destroyed while a rule still referenced it
    assert h.cmds.ipset.sets == {}
    assert not any(c.startswith("cali-pi-") for c in h.cmds.iptables.user_chains())


def test_set_destroy_waits_when_iptables_failed() -> None:
    h = Harness()
    h.sync(_state())
    h.feed([endpoint(f"cali{i}", f"10.65.0.{i + 1}", profiles=["open"]) for i in range(3)])
    h.feed([ActivePolicyRemove(PolicyID("default", "web")), IPSetRemove("s-web")])
    h.ipsets.apply()
    h.cmds.iptables.fail_next()
    with pytest.raises(IptablesError):
        h.iptables.apply()
    # the loop skips finish_apply after a failure; a retry completes everything
    h.apply()
    assert not h.cmds.ipset.exists(ipset_name("s-web", "net"))


def test_iptables_failure_keeps_work_dirty_and_retry_completes() -> None:
    h = Harness()
    h.feed(_state())
    h.feed([InSync()])
    h.ipsets.apply()
    h.cmds.iptables.fail_next()
    with pytest.raises(IptablesError, match="injected"):
        h.iptables.apply()
    assert h.cmds.iptables.user_chains() == set()  # atomic: nothing half-written
    h.iptables.apply()
    assert "cali-tw-cali1" in h.cmds.iptables.user_chains()
    assert h.forward("cali0", "cali1", src="10.65.0.2", dst="10.65.0.2", dport=8080) == "ACCEPT"


def test_ipset_failure_keeps_work_dirty_and_retry_completes() -> None:
    h = Harness()
    h.feed(_state())
    h.feed([InSync()])
    h.cmds.ipset.fail_next()
    with pytest.raises(IPSetError, match="injected"):
        h.ipsets.apply()
    h.apply()
    assert h.cmds.ipset.members(ipset_name("s-web", "net")) == {"10.65.0.2"}


def test_drift_repaired_on_resync() -> None:
    h = Harness()
    h.sync(_state())
    fake = h.cmds.iptables
    tw = "cali-tw-cali1"
    fake.chains[tw] = fake.chains[tw][:2]  # someone truncated a chain
    fake.chains["FORWARD"].remove(fake.chains["FORWARD"][0])  # and removed our jump
    fake.chains["FORWARD"].insert(0, "-j ACCEPT")  # and put theirs first
    h.cmds.ipset.sets[ipset_name("s-web", "net")][1].add("10.99.0.1")
    h.apply()
    assert len(fake.chains[tw]) == 2  # no resync yet: trusted cache
    h.iptables.request_resync()
    h.ipsets.request_resync()
    h.apply()
    assert len(fake.chains[tw]) > 2
    assert fake.chains["FORWARD"][0].endswith("-j cali-FORWARD")
    assert fake.chains["FORWARD"][1] == "-j ACCEPT"  # theirs kept, below ours
    assert h.cmds.ipset.members(ipset_name("s-web", "net")) == {"10.65.0.2"}


def test_foreign_chains_and_rules_untouched() -> None:
    h = Harness()
    fake = h.cmds.iptables
    fake.chains["KUBE-FORWARD"] = ["-j ACCEPT"]
    fake.chains["FORWARD"].append("-j KUBE-FORWARD")
    h.cmds.ipset.sets["kube-set"] = ("hash:ip", {"1.2.3.4"})
    h.sync(_state())
    h.feed([WorkloadEndpointRemove(WorkloadEndpointID("k8s", f"ns/cali{i}", "eth0"))
            for i in range(3)])
    h.apply()
    assert fake.chains["KUBE-FORWARD"] == ["-j ACCEPT"]
    assert fake.chains["FORWARD"][-1] == "-j KUBE-FORWARD"
    assert "kube-set" in h.cmds.ipset.sets


def test_ipset_deltas_and_normalisation() -> None:
    h = Harness()
    h.sync([IPSetUpdate("s", "net", frozenset({"10.0.0.1/32", "0.0.0.0/0", "fd00::1/128"})),
            IPSetUpdate("n", "ip_port", frozenset({"10.0.0.1/32,TCP:80", "bogus"}))])
    name = ipset_name("s", "net")
    assert h.cmds.ipset.members(name) == {"10.0.0.1", "0.0.0.0/1", "128.0.0.0/1"}
    assert h.cmds.ipset.members(ipset_name("n", "ip_port")) == {"10.0.0.1,tcp:80"}
    # the IPv6 member is in the set's IPv6 twin
    assert h.cmds.ipset.members(ipset_name("s", "net", 6)) == {"fd00::1"}
    assert h.ipsets.skipped_other_family == 0
    h.feed([IPSetDeltaUpdate("s", added=frozenset({"10.0.0.2"}),
                             removed=frozenset({"0.0.0.0/0"}))])
    h.apply()
    assert h.cmds.ipset.members(name) == {"10.0.0.1", "10.0.0.2"}
    restore_lines = h.cmds.ipset.restore_calls
    h.apply()
    assert h.cmds.ipset.restore_calls == restore_lines


def test_ipset_names_fit_kernel_limit() -> None:
    for set_id in ("x", "s:" + "a" * 300):
        for t in ("net", "ip_port"):
            assert len(ipset_name(set_id, t)) <= 31


@pytest.mark.parametrize(("nft_rules", "legacy_rules", "expected"), [
    (0, 0, "default"), (3, 0, "nft"), (0, 2, "legacy"), (5, 2, "nft")])
def test_backend_autodetection_prefers_what_the_namespace_uses(
    nft_rules: int, legacy_rules: int, expected: str
) -> None:
    cmds = FakeCommands()
    cmds.backends["nft"].chains["FORWARD"] = ["-j ACCEPT"] * nft_rules
    cmds.backends["legacy"].chains["FORWARD"] = ["-j ACCEPT"] * legacy_rules
    assert detect_backend(cmds, "auto").backend == expected
    assert detect_backend(cmds, "Legacy") == BACKENDS["legacy"]
    with pytest.raises(ValueError, match="IptablesBackend"):
        detect_backend(cmds, "ebpf")


def test_legacy_backend_programs_the_legacy_table_only() -> None:
    cmds = FakeCommands()
    cmds.backends["legacy"].chains["INPUT"] = ["-j ACCEPT"]
    from pyfelix.agent.dataplane.managers.iptables import IptablesManager

    m = IptablesManager(runner=cmds)
    m.on_update(InSync())
    m.apply()
    assert "cali-FORWARD" in cmds.backends["legacy"].user_chains()
    assert cmds.backends["nft"].user_chains() == set()


def test_table_refuses_chains_that_are_not_ours() -> None:
    t = IptablesTable(FakeCommands(), binaries=IptablesBinaries())
    from pyfelix.agent.dataplane.iptables.chains import Chain

    with pytest.raises(ValueError, match="does not start with"):
        t.set_chain(Chain("KUBE-X", ("-j ACCEPT",)))


def test_parse_save_reads_hashes_quoted_or_not() -> None:
    saved = parse_save(
        "*nat\n:cali-nat - [0:0]\n-A cali-nat -j ACCEPT\nCOMMIT\n"
        "*filter\n:FORWARD ACCEPT [0:0]\n:cali-x - [0:0]\n"
        '-A FORWARD -j KUBE\n-A FORWARD -m comment --comment "cali:abc" -j cali-x\n'
        "-A cali-x -m comment --comment cali:def -j DROP\n-A cali-x -j ACCEPT\nCOMMIT\n")
    assert saved.chains == {"cali-x": ("def", None)}
    assert saved.base_ours == {"FORWARD": [(2, "abc")]}


def test_ipset_members_that_normalise_alike_are_reference_counted() -> None:
    h = Harness()
    h.sync([IPSetUpdate("s", "net", frozenset({"10.0.0.1", "10.0.0.1/32", "10.0.0.0/8"}))])
    name = ipset_name("s", "net")
    h.feed([IPSetDeltaUpdate("s", removed=frozenset({"10.0.0.1"}))])
    h.apply()
    assert h.cmds.ipset.members(name) == {"10.0.0.1", "10.0.0.0/8"}
    h.feed([IPSetDeltaUpdate("s", removed=frozenset({"10.0.0.1/32"}))])
    h.apply()
    assert h.cmds.ipset.members(name) == {"10.0.0.0/8"}
    h.feed([IPSetUpdate("s", "net", frozenset({"10.0.0.0/8", "10.9.9.9"}))])
    h.apply()
    assert h.cmds.ipset.members(name) == {"10.0.0.0/8", "10.9.9.9"}


def test_ipset_malformed_members_skipped_rest_programmed() -> None:
    h = Harness()
    h.sync([IPSetUpdate("s", "net", frozenset({"10.0.0.300", "banana", "10.0.0.2"})),
            IPSetUpdate("n", "ip_port", frozenset({"10.0.0.1/32,icmp:0", "10.0.0.1,udp:99999",
                                                   "10.0.0.1,udp:53"})),
            IPSetUpdate("x", "weird", frozenset({"10.0.0.1"}))])
    assert h.cmds.ipset.members(ipset_name("s", "net")) == {"10.0.0.2"}
    assert h.cmds.ipset.members(ipset_name("n", "ip_port")) == {"10.0.0.1,udp:53"}
    assert not any("weird" in n for n in h.cmds.ipset.sets)


def test_table_remove_all_takes_out_every_chain_and_insert_of_ours_only() -> None:
    h = Harness()
    h.cmds.iptables.chains["FORWARD"].append("-j ACCEPT")
    h.sync(_state())
    table = h.iptables.table
    table.remove_all()
    assert table.apply(allow_deletes=True) is True
    assert h.cmds.iptables.user_chains() == set()
    assert h.cmds.iptables.chains["FORWARD"] == ["-j ACCEPT"]
    assert h.cmds.iptables.chains["INPUT"] == []


def test_ipsets_only_mode_programs_the_wanted_sets_and_follows_the_selection() -> None:
    """BPF mode's IP-sets manager: `only` picks the sets in the kernel; the rest are kept
    (deltas included) and appear whole when wanted; unwanted ones go in phase 2."""
    from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager

    cmds = FakeCommands()
    wanted: set[str] = {"a"}
    m = IPSetsManager(runner=cmds, only=lambda: wanted, families=(4,))

    def run(*msgs: object) -> None:
        for msg in msgs:
            m.on_update(msg)
        m.apply()
        m.finish_apply()

    def kernel() -> dict[str, set[str]]:
        return {n: cmds.ipset.members(n) for n in cmds.ipset.sets}

    a, b = ipset_name("a", "net"), ipset_name("b", "net")
    run(IPSetUpdate("a", "net", frozenset({"10.0.0.1"})),
        IPSetUpdate("b", "net", frozenset({"10.0.0.2", "10.0.0.3"})), InSync())
    assert kernel() == {a: {"10.0.0.1"}}
    writes = cmds.ipset.restore_calls
    run(IPSetDeltaUpdate("b", added=frozenset({"10.0.0.4/32"}),
                         removed=frozenset({"10.0.0.2"})))
    assert cmds.ipset.restore_calls == writes  # an unwanted set: nothing written
    wanted.clear()
    wanted.add("b")
    run()
    assert kernel() == {b: {"10.0.0.3", "10.0.0.4"}}
    # a wanted set changing type is recreated under its new name; removal takes it out
    run(IPSetUpdate("b", "ip_port", frozenset({"10.0.0.3,tcp:80"})))
    assert kernel() == {ipset_name("b", "ip_port"): {"10.0.0.3,tcp:80"}}
    run(IPSetRemove("b"), IPSetRemove("a"))
    assert kernel() == {}
    wanted.add("a")
    run()  # removed sets stay removed even when still wanted
    assert kernel() == {}
    writes = cmds.ipset.restore_calls
    run()
    assert cmds.ipset.restore_calls == writes


def test_ipsets_one_restore_for_both_families_and_a_single_family_manager_skips() -> None:
    from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager

    cmds = FakeCommands()
    m = IPSetsManager(runner=cmds)
    for msg in (IPSetUpdate("s", "net", frozenset({"10.0.0.1", "fd00::1/128", "::/0"})),
                IPSetUpdate("p", "ip_port", frozenset({"fd00::2,tcp:80"})), InSync()):
        m.on_update(msg)
    m.apply()
    assert cmds.ipset.restore_calls == 1  # every set of both families in one restore
    assert cmds.ipset.members(ipset_name("s", "net")) == {"10.0.0.1"}
    assert cmds.ipset.members(ipset_name("s", "net", 6)) == {"fd00::1", "::/1", "8000::/1"}
    assert cmds.ipset.members(ipset_name("p", "ip_port", 6)) == {"fd00::2,tcp:80"}
    assert cmds.ipset.members(ipset_name("p", "ip_port")) == set()
    m.on_update(IPSetDeltaUpdate("s", added=frozenset({"fd00::3"}),
                                 removed=frozenset({"::/0"})))
    m.apply()
    assert cmds.ipset.members(ipset_name("s", "net", 6)) == {"fd00::1", "fd00::3"}
    # a restarted manager reads both families back: nothing to write
    again = IPSetsManager(runner=cmds)
    for msg in (IPSetUpdate("s", "net", frozenset({"10.0.0.1", "fd00::1", "fd00::3"})),
                IPSetUpdate("p", "ip_port", frozenset({"fd00::2,tcp:80"}))):
        again.on_update(msg)
    calls = cmds.ipset.restore_calls
    again.apply()
    assert cmds.ipset.restore_calls == calls
    # an IPv4-only manager never touches the IPv6 twins, and counts the members it skips
    only4 = IPSetsManager(runner=cmds, families=(4,))
    for msg in (IPSetUpdate("s", "net", frozenset({"10.0.0.1", "fd00::1"})), InSync()):
        only4.on_update(msg)
    only4.apply()
    only4.finish_apply()
    assert only4.skipped_other_family == 1
    assert cmds.ipset.members(ipset_name("s", "net", 6)) == {"fd00::1", "fd00::3"}

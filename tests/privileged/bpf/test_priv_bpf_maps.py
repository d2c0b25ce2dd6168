"""Real-kernel map tests: ctypes layouts equal what BCC built from the C, pins and adoption
across a reload, the raw-syscall map API (batches, fallbacks, "map full"), and
`pyfelix bpf summary` over the real pins."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import subprocess
import sys
import time

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.compiler import PolicyCompiler, PolicyState
from pyfelix.agent.bpf.loader import BuildConfig, load_dataplane, prepare_pins, remove_pin_dir
from pyfelix.agent.bpf.maps import ALL_MAPS, BY_NAME, endpoints, ipsets
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps.base import BpfMap, MapFullError, MapParams, MapType
from pyfelix.agent.bpf.testrun import TC_ACT_OK, run_tc

pytestmark = pytest.mark.privileged


def layout(t: type) -> object:
    """(size, [(field, offset, layout of the field type)]) recursively; arrays as
    (size, element layout)."""
    if issubclass(t, ctypes.Structure):
        fields = []
        for f in t._fields_:
            name, ftype = f[0], f[1]
            fields.append((name, getattr(t, name).offset, layout(ftype)))
        return (ctypes.sizeof(t), fields)
    if issubclass(t, ctypes.Array):
        return (ctypes.sizeof(t), layout(t._type_))
    return ctypes.sizeof(t)


@pytest.mark.parametrize("params", ALL_MAPS, ids=lambda p: p.name)
def test_ctypes_layout_matches_what_bcc_built_from_the_c(loaded, params):
    table = loaded.bpf[params.name.encode()]
    leaf = table.Leaf
    if params.percpu:  # BCC's per-CPU Leaf is an array of one value per possible CPU
        assert issubclass(leaf, ctypes.Array) and leaf._length_ == syscall.possible_cpus()
        leaf = leaf._type_
    assert layout(params.key_type) == layout(table.Key)
    assert layout(params.value_type) == layout(leaf)


def test_every_map_is_pinned_under_its_versioned_name(loaded, pin_dir):
    pins = set(os.listdir(pin_dir))
    assert {p.pin_name for p in ALL_MAPS} | {f"progs_{loaded.abi}", f"scratch_{loaded.abi}",
                                             f"nat6scratch_{loaded.abi}"} == pins
    for params in ALL_MAPS:
        with BpfMap.open_pinned(params, pin_dir) as m:
            info = syscall.map_info(m.fd)
            assert info.map_type == params.map_type
            assert info.max_entries == loaded.config.max_entries(params)


def test_reload_adopts_the_pinned_maps_and_their_contents(loaded, harness):
    key = endpoints.encode_key(4242)
    value = endpoints.encode_value(7, 0, (1, 2), (3, 4))
    loaded.maps["endpoints"].update(key, value)
    before = syscall.map_info(loaded.maps["endpoints"].fd).map_id
    with load_dataplane(loaded.config) as again:
        assert again.abi == loaded.abi
        assert syscall.map_info(again.maps["endpoints"].fd).map_id == before
        assert again.maps["endpoints"].lookup(key) == value
        assert again.replaced_pins == []


def test_prepare_pins_replaces_a_pin_whose_layout_or_size_differs():
    pin_dir = f"/sys/fs/bpf/pyfelix-test-{secrets.token_hex(4)}"
    os.makedirs(pin_dir)
    try:
        wrong = syscall.map_create(MapType.HASH, 4, 8, 16)  # endpoints has a 24-byte value
        syscall.obj_pin(wrong, endpoints.PARAMS.pin_path(pin_dir))
        os.close(wrong)
        small = syscall.map_create(MapType.LRU_HASH, ct_map.PARAMS.key_size,
                                   ct_map.PARAMS.value_size, 16)
        syscall.obj_pin(small, ct_map.PARAMS.pin_path(pin_dir))
        os.close(small)
        good = syscall.map_create(MapType.HASH, endpoints.PARAMS.key_size, 1, 1)
        os.close(good)
        replaced = prepare_pins(BuildConfig(pin_dir=pin_dir, map_sizes={"conntrack": 16}))
        assert replaced == [endpoints.PARAMS.pin_name]  # conntrack fits the configured size
        replaced = prepare_pins(BuildConfig(pin_dir=pin_dir))
        assert replaced == [ct_map.PARAMS.pin_name]  # default size differs
        assert os.listdir(pin_dir) == []
    finally:
        remove_pin_dir(pin_dir)


def test_open_pinned_refuses_a_map_of_another_layout(tmp_path):
    pin_dir = f"/sys/fs/bpf/pyfelix-test-{secrets.token_hex(4)}"
    os.makedirs(pin_dir)
    try:
        fd = syscall.map_create(MapType.HASH, 4, 8, 16)
        syscall.obj_pin(fd, endpoints.PARAMS.pin_path(pin_dir))
        os.close(fd)
        with pytest.raises(Exception, match="value_size 8 != 24"):
            endpoints.open_pinned(pin_dir)
        with pytest.raises(OSError, match="'ipsets'"):
            ipsets.open_pinned(pin_dir)
    finally:
        remove_pin_dir(pin_dir)


def test_batch_and_single_operations_agree(loaded, harness):
    m = loaded.maps["endpoints"]
    items = [(endpoints.encode_key(i), endpoints.encode_value(i, 0, (i, 1), (i, 2)))
             for i in range(1, 201)]
    m.update_many(items)  # one MAP_UPDATE_BATCH
    assert sorted(m.items()) == sorted(items)  # MAP_LOOKUP_BATCH, 4096 per call
    assert sorted(m.iter_keys()) == sorted(k for k, _ in items)
    assert m.lookup(items[5][0]) == items[5][1]
    assert m.delete_many([k for k, _ in items[:100]] + [endpoints.encode_key(999)]) == 100
    assert len(m.items()) == 100
    # LPM tries have no batch operations: the same calls fall back to one-by-one
    t = loaded.maps["ipsets"]
    keys = [ipsets.member_key(3, f"10.{i // 256}.{i % 256}.0/24") for i in range(300)]
    t.update_many((k, ipsets.VALUE) for k in keys)
    assert sorted(k for k, _ in t.items()) == sorted(keys)
    assert ipsets.dump(t)[0] == {"set_id": 3, "family": 4, "member": "10.0.0.0/24"}


def test_percpu_values_have_one_slot_per_possible_cpu(loaded):
    m = loaded.maps["global_counters"]
    assert m.ncpus == syscall.possible_cpus()
    raw = m.lookup((0).to_bytes(4, "little"))
    assert raw is not None and len(raw) == 8 * m.ncpus


@pytest.mark.parametrize("map_type,key_size,flags", [
    (MapType.HASH, 4, 0), (MapType.LPM_TRIE, 8, syscall.BPF_F_NO_PREALLOC)])
def test_full_map_raises_map_full_error_naming_the_map(map_type, key_size, flags):
    key_type = ctypes.c_uint32 if key_size == 4 else ctypes.c_uint64
    params = MapParams(name="tiny", map_type=map_type, key_type=key_type,
                       value_type=ctypes.c_uint32, max_entries=2, version=1, flags=flags)
    fd = syscall.map_create(map_type, key_size, 4, 2, flags)
    m = BpfMap(params, fd)
    try:
        def key(i: int) -> bytes:
            # LPM: prefixlen 32 + a 4-byte address
            return (32).to_bytes(4, "little") + i.to_bytes(4, "big") if key_size == 8 \
                else i.to_bytes(4, "little")
        m.update(key(1), bytes(4))
        m.update(key(2), bytes(4))
        with pytest.raises(MapFullError, match="'tiny' is full"):
            m.update(key(3), bytes(4))
        if map_type == MapType.HASH:
            with pytest.raises(MapFullError, match="'tiny'"):
                m.update_many([(key(4), bytes(4)), (key(5), bytes(4))])
    finally:
        m.close()


def test_every_map_dumps_json_ready_rows_from_its_pin(loaded, harness, pin_dir):
    import json

    from pyfelix.agent import proto as p
    from pyfelix.agent.bpf import packets as pk
    from pyfelix.agent.bpf.maps import BY_NAME, dump_pinned

    h = harness
    h.apply(p.IPSetUpdate("s:x", "net", frozenset({"10.1.0.0/16", "fd00:1::/64"})),
            p.ActiveProfileUpdate("prof", p.Profile(inbound_rules=(
                p.Rule("allow", src_ip_set_ids=("s:x",), rule_id="r1"),))),
            h.endpoint("a", "d1", profiles=("prof",), ipv6=("fd00:65::1/128",)),
            p.HostMetadataUpdate("node1", "198.18.0.1"))
    assert h.verdict("to", pk.tcp("10.1.2.3", "10.65.0.1", 1, 2), "d1") == "allow"
    assert h.verdict("to", pk.tcp6("fd00:1::3", "fd00:65::1", 1, 2), "d1") == "allow"
    rows = {name: dump_pinned(name, pin_dir) for name in BY_NAME}
    json.dumps(rows)
    # IPv6 entries show in the dumps beside the IPv4 ones
    assert rows["ipsets"] == [{"set_id": 1, "family": 4, "member": "10.1.0.0/16"},
                              {"set_id": 1, "family": 6, "member": "fd00:1::/64"}]
    assert {r["src"] for r in rows["wep_sources"]} == {"10.65.0.1/32", "fd00:65::1/128"}
    assert {(r["family"], r["addr_a"]) for r in rows["conntrack"]} == {
        (4, "10.1.2.3"), (6, "fd00:1::3")}
    assert {"counter": "ipv6_packets", "value": 1} in rows["global_counters"]
    assert {"kind": "ipset", "id": 1, "name": "s:x"} in rows["ids"]
    assert [r["action"] for r in rows["rules"]][:2] == ["allow", "deny"]
    assert rows["endpoints"][0]["ifindex"] == h.ifindexes["d1"]
    assert rows["conntrack"][0]["addr_b"] == "10.65.0.1" and rows["conntrack"][0]["proto"] == 6
    assert rows["rule_counters"] == [{"counter_id": h.compiler.rule_ids.get("r1"),
                                      "packets": 2, "bytes": rows["rule_counters"][0]["bytes"]}]
    assert rows["ep_counters"][0]["ingress_allowed_packets"] == 2
    assert {"counter": "policy_allowed", "value": 2} in rows["global_counters"]
    assert rows["routes"] == [{"dst": "198.18.0.1/32", "flags": ["local_host"], "ifindex": 0,
                               "next_hop": ""}]
    assert rows["config"] == [{"flags": 0, "endpoint_to_host_action": "DROP",
                              "bpf_enforce_rpf": "STRICT", "bpf_redirect_to_peer": "Enabled",
                              "ctlb_udp": False, "ipv6_support": True,
                              "flow_events": False, "drop_vxlan_from_workloads_port": 0,
                              "drop_ipip_from_workloads": False}]
    assert rows["untracked"] == []
    # the classifier: the chain's instance, its header, its source-address entry
    (chain,) = [r for r in rows["cls_chains"] if r["chain_start"] == rows["endpoints"][0][
        "ingress"]["start"]]
    (head,) = [r for r in rows["cls_words"] if r["instance"] == chain["instance"]]
    assert head["n_words"] == 1 and head["looked_up"] == ["saddr"] and head["block_words"] > 5
    assert {"instance": chain["instance"], "side": "saddr", "family": 4,
            "prefix": "10.1.0.0/16", "vec": rows["cls_tries"][0]["vec"]} in rows["cls_tries"]
    assert {"instance": chain["instance"], "side": "saddr", "family": 6,
            "prefix": "fd00:1::/64", "vec": rows["cls_tries"][0]["vec"]} in rows["cls_tries"]
    assert rows["cls_l4"] == []  # no record names a protocol
    with pytest.raises(KeyError, match="unknown BPF map 'nope'"):
        dump_pinned("nope", pin_dir)


def test_conntrack_cleaner_on_the_real_map(loaded, harness):

    from pyfelix.agent import proto as p
    from pyfelix.agent.bpf import packets as pk
    from pyfelix.agent.bpf.conntrack import ConntrackCleaner

    h = harness
    h.apply(p.ActiveProfileUpdate("all", p.Profile(outbound_rules=(p.Rule("allow"),))),
            h.endpoint("a", "d1", profiles=("all",)))
    for port in range(10):
        assert h.verdict("from", pk.udp("10.65.0.1", "10.65.0.2", 1000 + port, 53), "d1") \
            == "allow"
    ct = loaded.maps["conntrack"]
    assert len(ct.items()) == 10
    cleaner = ConntrackCleaner(ct, timeouts=loaded.config.ct_timeouts)
    assert cleaner.run_once().deleted == 0
    later = ConntrackCleaner(ct, timeouts=loaded.config.ct_timeouts,
                             clock_ns=lambda: ct_map.now_ns() + 61 * ct_map.NS_PER_S)
    stats = later.run_once()
    assert (stats.scanned, stats.deleted) == (10, 10) and ct.items() == []


def test_sweep_removes_only_other_builds_pins():
    from pyfelix.agent.bpf.loader import sweep_stale_build_pins

    pin_dir = f"/sys/fs/bpf/pyfelix-test-{secrets.token_hex(4)}"
    os.makedirs(pin_dir)
    try:
        for name in ("progs_old", "scratch_old", "progs_new", "scratch_new", "rules_v1"):
            fd = syscall.map_create(MapType.HASH, 4, 4, 1)
            syscall.obj_pin(fd, os.path.join(pin_dir, name))
            os.close(fd)
        assert sweep_stale_build_pins(pin_dir, "new") == ["progs_old", "scratch_old"]
        assert sorted(os.listdir(pin_dir)) == ["progs_new", "rules_v1", "scratch_new"]
    finally:
        remove_pin_dir(pin_dir)


def test_summary_counts_what_each_pinned_map_holds(harness, pin_dir):
    h = harness
    h.apply(p.IPSetUpdate("clients", "net", frozenset({"10.1.0.0/16", "10.2.0.1/32"})),
            p.ActivePolicyUpdate(p.PolicyID("default", "in"), p.Policy(inbound_rules=(
                p.Rule("allow", protocol=6, src_ip_set_ids=("clients",)),))),
            h.endpoint("a", "d1", tiers=(p.TierInfo("default", ingress_policies=("in",)),)),
            h.endpoint("b", "d2", tiers=(p.TierInfo("default", ingress_policies=("in",)),)))
    assert h.verdict("to", pk.tcp("10.2.0.1", "10.65.0.2", 40000, 80, "S"), "d1") == "allow"
    # policy churn: the chains move (make before break) and the old records stay behind
    h.apply(p.ActivePolicyUpdate(p.PolicyID("default", "in"), p.Policy(inbound_rules=(
        p.Rule("allow", protocol=6, src_ip_set_ids=("clients",)), p.Rule("deny")))))
    done = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "bpf", "summary", "-o", "json",
                           "--pin-dir", pin_dir], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {row["map"]: row for row in json.loads(done.stdout)}
    assert set(rows) == set(BY_NAME)
    maps = h.dp.maps
    assert rows["endpoints"]["entries"] == 2 == len(maps["endpoints"].items())
    assert rows["ipsets"]["entries"] == len(list(maps["ipsets"].iter_keys())) >= 2
    assert rows["conntrack"]["entries"] == 1
    assert h.last is not None
    in_use = sum(len(chain) for chain in h.last.chains_in_use)  # the compiler's own count
    non_zero = sum(1 for _, v in maps["rules"].items() if any(v))
    assert rows["rules"]["entries"] == in_use and 0 < in_use < non_zero
    assert rows["rules"]["max_entries"] == maps["rules"].max_entries
    assert rows["rules"]["fill_pct"] == round(100 * in_use / maps["rules"].max_entries, 1)
    assert rows["rule_counters"]["entries"] is None  # counters: every slot always exists
    assert rows["config"]["entries"] is None
    table = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "bpf", "summary",
                            "--pin-dir", pin_dir], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == ["MAP", "TYPE"]


def test_build_without_the_coarse_clock_tracks_flows_on_the_fine_one(root_untouched):
    # kernels before 5.11 have no bpf_ktime_get_coarse_ns: the loader leaves PF_KTIME_COARSE
    # out and conntrack.h reads bpf_ktime_get_ns; flows must be tracked all the same
    pin_dir = f"/sys/fs/bpf/pyfelix-test-{secrets.token_hex(4)}"
    try:
        with load_dataplane(BuildConfig(pin_dir=pin_dir, ktime_coarse=False,
                                        map_sizes={"conntrack": 64})) as dp:
            assert "-DPF_KTIME_COARSE=1" not in dp.config.cflags()
            compiler = PolicyCompiler(rules_capacity=dp.maps["rules"].max_entries)
            state = PolicyState()
            state.apply(p.ActiveProfileUpdate("allow", p.Profile(
                inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))))
            state.apply(p.WorkloadEndpointUpdate(p.WorkloadEndpointID("k8s", "d/a", "eth0"),
                                                 p.WorkloadEndpoint("active", "lo",
                                                                    profile_ids=("allow",),
                                                                    ipv4_nets=("10.65.0.1/32",))))
            out = compiler.compile(state, {"lo": 1})
            dp.maps["rules"].update_many(out.all_rules().items())
            dp.maps["cls_words"].update_many(out.cls_words().items())
            dp.maps["cls_l4"].update_many(out.cls_l4.items())
            dp.maps["cls_tries"].update_many(out.cls_tries.items())
            dp.maps["cls_chains"].update_many(out.cls_chains.items())
            dp.maps["wep_sources"].update_many(out.wep_sources.items())
            dp.maps["endpoints"].update_many(out.endpoints.items())
            before = time.monotonic_ns()
            syn = pk.tcp("10.65.0.1", "10.66.0.1", 40000, 80, "S")
            assert run_tc(dp.prog_fd("calico_from_wep"), syn, ifindex=1).retval == TC_ACT_OK
            after = time.monotonic_ns()
            key = ct_map.encode_key(ct_map.normalise(1, "10.65.0.1", "10.66.0.1", 40000, 80,
                                                     6)[0])
            flow = ct_map.decode_value(dp.maps["conntrack"].lookup(key))
            assert before <= flow.created_ns <= after  # CLOCK_MONOTONIC, not the coarse one
    finally:
        remove_pin_dir(pin_dir)

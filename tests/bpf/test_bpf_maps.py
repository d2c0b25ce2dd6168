"""Map modules without a kernel: constants agree with the C headers, encodings round-trip,
the fake map enforces its size, the conntrack cleaner deletes exactly the expired flows."""

from __future__ import annotations

import ctypes
import ipaddress
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyfelix.agent.bpf import classifier
from pyfelix.agent.bpf.conntrack import ConntrackCleaner
from pyfelix.agent.bpf.maps import ALL_MAPS
from pyfelix.agent.bpf.maps import cls_l4 as cls_l4_map
from pyfelix.agent.bpf.maps import cls_tries as cls_tries_map
from pyfelix.agent.bpf.maps import config as config_map
from pyfelix.agent.bpf.maps import conntrack as ct_map
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.maps import endpoints as endpoints_map
from pyfelix.agent.bpf.maps import ids as ids_map
from pyfelix.agent.bpf.maps import ipsets as ipsets_map
from pyfelix.agent.bpf.maps import routes as routes_map
from pyfelix.agent.bpf.maps import rules as rules_map
from pyfelix.agent.bpf.maps import untracked as untracked_map
from pyfelix.agent.bpf.maps import wep_sources as wep_sources_map
from pyfelix.agent.bpf.maps.base import FakeMap, MapFullError
from pyfelix.agent.bpf.maps.rules import Action, PortMatch, RuleRecord, SetCheck

INCLUDE = Path(__file__).resolve().parents[2] / "bpf" / "include"


def c_defines() -> dict[str, str]:
    out = {}
    for header in INCLUDE.glob("*.h"):
        for m in re.finditer(r"^#define\s+(\w+)\s+(.+?)\s*(?:/\*.*)?$", header.read_text(),
                             re.M):
            out[m.group(1)] = m.group(2)
    return out


def c_int(defines: dict[str, str], name: str) -> int:
    value = defines[name]
    return c_int(defines, value) if value in defines else int(value, 0)


def test_python_constants_match_the_c_headers():
    d = c_defines()
    pairs = [
        ("RULE_PORT_SLOTS", rules_map.PORT_SLOTS), ("RULE_SET_CHECKS", rules_map.SET_CHECKS),
        ("SET_CHECK_SRC", rules_map.SET_CHECK_SRC),
        ("SET_CHECK_NEGATE", rules_map.SET_CHECK_NEGATE),
        ("RULE_NAMED_PORT_SLOTS", rules_map.NAMED_PORT_SLOTS),
        ("POLICY_MAX_TAIL_CALLS", rules_map.MAX_TAIL_CALLS),
        ("CLS_MAX_WORDS", classifier.MAX_WORDS), ("CLS_STEPS_PER_PROG", classifier.STEPS_PER_PROG),
        ("CLS_SUMMARY_WORDS", classifier.MAX_WORDS // 64), ("CLS_FIELDS", classifier.N_FIELDS),
        ("CLS_F_L4", classifier.F_L4), ("CLS_F_SPORT", classifier.F_SPORT),
        ("CLS_F_DPORT", classifier.F_DPORT), ("CLS_F_SADDR", classifier.F_SADDR),
        ("CLS_F_DADDR", classifier.F_DADDR), ("CLS_F_SNAMED", classifier.F_SNAMED),
        ("CLS_F_DNAMED", classifier.F_DNAMED), ("CLS_VEC_ALL", classifier.VEC_ALL),
        ("CLS_TRIE_FIXED_BITS", cls_tries_map.FIXED_BITS),
        ("CLS_SIDE_SADDR", cls_tries_map.SIDE_SADDR), ("CLS_SIDE_DADDR", cls_tries_map.SIDE_DADDR),
        ("CLS_SIDE_SNAMED", cls_tries_map.SIDE_SNAMED),
        ("CLS_SIDE_DNAMED", cls_tries_map.SIDE_DNAMED),
        ("CLS_SIDE_SPORT", cls_tries_map.SIDE_SPORT), ("CLS_SIDE_DPORT", cls_tries_map.SIDE_DPORT),
        ("CLS_L4_PROTO", cls_l4_map.LEVEL_PROTO), ("CLS_L4_TYPE", cls_l4_map.LEVEL_TYPE),
        ("CLS_L4_TYPE_CODE", cls_l4_map.LEVEL_TYPE_CODE),
        ("CLS_L4_OTHER", cls_l4_map.LEVEL_OTHER),
        ("PKT_F_PORTS", cls_l4_map.PKT_F_PORTS), ("PKT_F_ICMP", cls_l4_map.PKT_F_ICMP),
        ("IPSET_KEY_FIXED_BITS", ipsets_map.KEY_FIXED_BITS),
        ("UNTRACKED_KEY_FIXED_BITS", untracked_map.KEY_FIXED_BITS),
        ("ID_NAME_LEN", ids_map.NAME_LEN), ("EP_F_ADMIN_DOWN", endpoints_map.FLAG_ADMIN_DOWN),
    ]
    pairs += [(f"RULE_ACTION_{a.name}", a.value) for a in Action]
    pairs += [(f"RM_{m.name}", m.value) for m in rules_map.Match]
    pairs += [(f"GCNT_{g.name}", g.value) for g in counters_map.GlobalCounter]
    pairs += [(f"CT_F_{f.name}", f.value) for f in ct_map.CtFlags]
    pairs += [(f"RT_F_{f.name}", f.value) for f in routes_map.RouteFlags]
    pairs += [(f"ID_KIND_{k.name}", k.value) for k in ids_map.IdKind]
    pairs += [(f"EP_TO_HOST_{a.name}", a.value) for a in config_map.EndpointToHostAction]
    pairs += [(f"EP_CNT_{n.upper()}", i) for i, n in enumerate(counters_map.EP_DIRECTIONS)]
    timeouts = ct_map.DEFAULT_TIMEOUTS
    pairs += [(f"CT_TIMEOUT_{k.upper()}", getattr(timeouts, k))
              for k in timeouts.__dataclass_fields__]
    mismatched = [(name, d.get(name), py) for name, py in pairs
                  if name not in d or c_int(d, name) != py]
    assert mismatched == []
    assert c_int(d, "GCNT_COUNT") == len(counters_map.GlobalCounter)
    assert c_int(d, "GCNT_COUNT") <= counters_map.GLOBAL_COUNTERS.max_entries


C_MAP_TYPES = {"hash": 1, "array": 2, "percpu_array": 6, "lru_hash": 9, "lpm_trie": 11}


def test_every_map_is_pinned_by_its_header_under_the_python_pin_name_and_default_size():
    decl = re.compile(r'BPF_TABLE_PINNED7?\(\s*"(\w+)",[^;]*?,\s*(\w+),\s*(\w+),\s*'
                      r'PIN_DIR "/(\w+)"')
    declared = {}
    for header in INCLUDE.glob("*.h"):
        for m in decl.finditer(header.read_text()):
            declared[m.group(2)] = (header.name, m.group(1), m.group(3), m.group(4))
    d = c_defines()
    for params in ALL_MAPS:
        header, ctype, size, pin = declared[params.name]
        assert (header, C_MAP_TYPES[ctype], pin) == (
            params.header, params.map_type, params.pin_name), params.name
        if params.name not in ("config", "global_counters"):  # the loader sizes the others
            assert size == params.size_macro, params.name
        max_entries = c_int(d, size) if size in d else int(size)
        assert max_entries == params.max_entries, params.name


# --- encodings -----------------------------------------------------------------------------


def test_ipset_member_keys():
    key = ipsets_map.member_key(7, "10.1.2.0/24")
    k = ipsets_map.Key.from_buffer_copy(key)
    assert (k.prefixlen, k.set_id, k.proto, k.family, k.port) == (64 + 24, 7, 0, 4, 0)
    assert bytes(k)[12:] == bytes([10, 1, 2, 0]) + bytes(12)  # network order, then zeros
    assert ipsets_map.decode_key(key) == {"set_id": 7, "family": 4, "member": "10.1.2.0/24"}
    # the fast IPv4 path and the general one give the same bytes
    assert key == ipsets_map.key_for(7, ipaddress.ip_network("10.1.2.0/24"))
    named = ipsets_map.member_key(9, "10.0.0.5,tcp:8080")
    assert ipsets_map.decode_key(named) == {"set_id": 9, "family": 4,
                                            "member": "10.0.0.5/32,tcp:8080"}
    k6 = ipsets_map.Key.from_buffer_copy(ipsets_map.member_key(1, "fd00::1:0/112"))
    assert (k6.prefixlen, k6.family) == (64 + 112, 6)
    assert bytes(k6)[12:] == ipaddress.IPv6Address("fd00::1:0").packed
    assert ipsets_map.decode_key(bytes(k6)) == {"set_id": 1, "family": 6,
                                                "member": "fd00::1:0/112"}
    assert ipsets_map.decode_key(ipsets_map.member_key(2, "fd00::5,udp:53")) == {
        "set_id": 2, "family": 6, "member": "fd00::5/128,udp:53"}
    # the same bits in the two families are two keys
    assert ipsets_map.member_key(1, "10.0.0.0/8") != ipsets_map.member_key(1, "a00::/8")
    for bad in ("10.0.0.1/33", "10.0.0.1/32,icmp:1", "10.0.0.1/32,tcp:70000", "nonsense"):
        with pytest.raises(ValueError, match=re.escape(bad)):
            ipsets_map.member_key(1, bad)


port_matches = st.builds(
    PortMatch,
    ranges=st.lists(st.tuples(st.integers(0, 65535), st.integers(0, 65535)).map(sorted).map(
        tuple), max_size=rules_map.PORT_SLOTS).map(tuple),
    named_sets=st.lists(st.integers(1, 2**32 - 1), max_size=rules_map.NAMED_PORT_SLOTS).map(
        tuple),
)
set_checks = st.lists(st.builds(SetCheck, st.integers(1, 2**31 - 1), st.booleans(),
                                st.booleans()), max_size=rules_map.SET_CHECKS).map(tuple)
opt_byte = st.none() | st.integers(0, 255)
records = st.builds(
    RuleRecord, action=st.sampled_from(list(Action)), jump=st.integers(0, 5000),
    counter_id=st.integers(0, 2**32 - 1), protocol=opt_byte, not_protocol=opt_byte,
    set_checks=set_checks, src_ports=port_matches,
    not_src_ports=port_matches, dst_ports=port_matches, not_dst_ports=port_matches,
    icmp_type=opt_byte, icmp_code=opt_byte, not_icmp_type=opt_byte, not_icmp_code=opt_byte,
)


@given(records)
def test_rule_records_round_trip(rec):
    raw = rules_map.encode(rec)
    assert len(raw) == ctypes.sizeof(rules_map.Value)
    assert rules_map.decode(raw) == rec


def test_rule_record_slot_overflow_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="set_checks"):
        rules_map.encode(RuleRecord(Action.ALLOW, set_checks=(SetCheck(1, True),) * 7))
    with pytest.raises(ValueError, match="dst_ports"):
        rules_map.encode(RuleRecord(Action.ALLOW, dst_ports=PortMatch(named_sets=(1, 2, 3))))


def test_conntrack_ipv6_keys_normalise_and_round_trip():
    k1, a_to_b = ct_map.normalise(3, "fd00::2", "fd00::1", 80, 5000, 6)
    k2, b_to_a = ct_map.normalise(3, "fd00::1", "fd00::2", 5000, 80, 6)
    assert k1 == k2 and a_to_b != b_to_a and k1.family == 6
    assert ct_map.decode_key(ct_map.encode_key(k1)) == k1
    raw = ct_map.encode_key(k1)
    assert len(raw) == ctypes.sizeof(ct_map.Key) == 44
    # the address bytes compare as big-endian numbers across all 16 bytes
    k3, src_is_a = ct_map.normalise(1, "fd00::1:0", "fd00::ffff", 1, 1, 17)
    assert not src_is_a and k3.addr_a == "fd00::ffff"
    # an IPv4 flow and an IPv6 flow with the same leading bytes are different keys
    k4, _ = ct_map.normalise(1, "10.0.0.1", "10.0.0.2", 1, 2, 17)
    k5, _ = ct_map.normalise(1, "a00:1::", "a00:2::", 1, 2, 17)
    assert ct_map.encode_key(k4) != ct_map.encode_key(k5)
    with pytest.raises(ValueError, match="two families"):
        ct_map.normalise(1, "10.0.0.1", "fd00::1", 1, 2, 17)
    assert ct_map.DEFAULT_TIMEOUTS.timeout_ns(58, 0) == ct_map.DEFAULT_TIMEOUTS.timeout_ns(1, 0)


def test_conntrack_normalisation_is_symmetric():
    k1, a_to_b = ct_map.normalise(3, "10.0.0.2", "10.0.0.1", 80, 5000, 6)
    k2, b_to_a = ct_map.normalise(3, "10.0.0.1", "10.0.0.2", 5000, 80, 6)
    assert k1 == k2 and not a_to_b and b_to_a
    assert k1.addr_a == "10.0.0.1" and k1.port_a == 5000
    assert ct_map.decode_key(ct_map.encode_key(k1)) == k1
    # same address: the lower port is side A
    k3, src_is_a = ct_map.normalise(3, "10.0.0.1", "10.0.0.1", 9, 8, 17)
    assert (k3.port_a, src_is_a) == (8, False)


def test_endpoint_route_untracked_and_config_values_round_trip():
    raw = endpoints_map.encode_value(5, 1, (10, 3), (20, 4))
    assert endpoints_map.decode_value(raw) == {
        "endpoint_id": 5, "flags": 1, "admin_down": True, "ingress": {"start": 10, "len": 3},
        "egress": {"start": 20, "len": 4}}
    assert routes_map.decode_key(routes_map.encode_key("10.65.0.0/16")) == "10.65.0.0/16"
    assert routes_map.decode_value(routes_map.encode_value(
        routes_map.RouteFlags.LOCAL_HOST, 0, "")) == {"flags": ["local_host"], "ifindex": 0,
                                                      "next_hop": ""}
    assert untracked_map.decode_key(untracked_map.encode_key(4, "192.0.2.0/24")) == {
        "ifindex": 4, "family": 4, "src": "192.0.2.0/24"}
    assert untracked_map.decode_key(untracked_map.encode_key(0, "2001:db8::/32")) == {
        "ifindex": 0, "family": 6, "src": "2001:db8::/32"}
    assert routes_map.decode_key(routes_map.encode_key("fd00:1::/64")) == "fd00:1::/64"
    assert routes_map.decode_value(routes_map.encode_value(
        routes_map.RouteFlags.REMOTE_HOST, 0, "fd00::9")) == {
            "flags": ["remote_host"], "ifindex": 0, "next_hop": "fd00::9"}
    assert wep_sources_map.decode_key(wep_sources_map.encode_key(7, "fd00::5/128")) == {
        "ifindex": 7, "family": 6, "src": "fd00::5/128"}
    assert config_map.decode_value(config_map.encode_value(
        config_map.EndpointToHostAction.DROP, ipv6=False))["ipv6_support"] is False
    assert config_map.action_from_felix("accept") == config_map.EndpointToHostAction.ACCEPT
    with pytest.raises(ValueError, match="DefaultEndpointToHostAction"):
        config_map.action_from_felix("Maybe")


def test_fake_map_enforces_max_entries():
    m = FakeMap(endpoints_map.PARAMS, max_entries=2)
    for i in range(2):
        m.update(endpoints_map.encode_key(i), endpoints_map.encode_value(i, 0, (0, 0), (0, 0)))
    m.update(endpoints_map.encode_key(1), endpoints_map.encode_value(9, 0, (0, 0), (0, 0)))
    with pytest.raises(MapFullError, match="'endpoints' is full"):
        m.update(endpoints_map.encode_key(5), endpoints_map.encode_value(5, 0, (0, 0), (0, 0)))


def test_conntrack_cleaner_deletes_only_expired_flows():
    now = 10_000 * ct_map.NS_PER_S
    ct = FakeMap(ct_map.PARAMS)
    flows = {
        # (proto, flags, idle seconds) -> expected to survive?
        (6, ct_map.CtFlags.SEEN_REPLY, 3000): True,        # established, < 1h
        (6, ct_map.CtFlags.SEEN_REPLY, 4000): False,       # established, > 1h
        (6, 0, 25): False,                                 # SYN only, > 20 s
        (6, ct_map.CtFlags.SEEN_REPLY | ct_map.CtFlags.RST, 11): False,
        (6, ct_map.CtFlags.SEEN_REPLY | ct_map.CtFlags.FIN_ORIG
         | ct_map.CtFlags.FIN_REPLY, 20): True,
        (17, 0, 59): True,
        (17, 0, 61): False,
        (1, 0, 6): False,
        (132, 0, 30): True,
    }
    keys = {}
    for i, (proto, flags, idle) in enumerate(flows):
        key = ct_map.encode_key(ct_map.FlowKey(1, "10.0.0.1", "10.0.0.2", i, 80, proto))
        ct.update(key, ct_map.encode_value(ct_map.FlowValue(
            0, now - idle * ct_map.NS_PER_S, 1, 60, int(flags), 0)))
        keys[key] = flows[(proto, flags, idle)]
    stats = ConntrackCleaner(ct, clock_ns=lambda: now).run_once()
    assert stats.scanned == len(flows)
    assert stats.deleted == sum(not keep for keep in keys.values())
    assert {k for k, keep in keys.items() if keep} == set(ct.data)


def test_loader_assembles_one_text_with_each_header_once_and_checks_its_config(tmp_path):
    from pyfelix.agent.bpf import loader

    text = loader.assemble_source()
    for header in INCLUDE.glob("*.h"):
        assert text.count(f'#line 1 "{header}"') == 1, header.name
    assert "int calico_from_wep(" in text and "int calico_xdp(" in text
    (tmp_path / "tc.c").write_text('#include "missing.h"\n')
    (tmp_path / "xdp.c").write_text("")
    with pytest.raises(loader.LoaderError, match=r"missing\.h"):
        loader.assemble_source(tmp_path)
    cfg = loader.BuildConfig(pin_dir="/sys/fs/bpf/x", map_sizes={"rules": 100})
    cfg.validate()
    flags = cfg.cflags("abc")
    assert "-DRULES_MAX_ENTRIES=100" in flags and '-DPROG_ABI="abc"' in flags
    assert "-DCT_TIMEOUT_TCP_EST=3600" in flags
    assert loader.build_abi(text, flags) == loader.build_abi(
        text, [f for f in flags if not f.startswith("-DPIN_DIR")] + ['-DPIN_DIR="/other"'])
    for bad, match in (({"nope": 1}, "unknown map"), ({"config": 2}, "config"),
                       ({"rules": 0}, "rules")):
        with pytest.raises(ValueError, match=match):
            loader.BuildConfig(pin_dir="/x", map_sizes=bad).validate()
    with pytest.raises(ValueError, match="rules_per_prog"):
        loader.BuildConfig(pin_dir="/x", rules_per_prog=1000).validate()


@pytest.mark.parametrize(("release", "coarse"), [
    ("6.18.44-fc-v595", True), ("5.11.0", True), ("5.15.0-91-generic", True),
    ("5.10.0-23-amd64", False), ("4.19.0", False), ("not-a-version", False)])
def test_coarse_conntrack_clock_only_on_kernels_that_have_it(release: str, coarse: bool):
    from pyfelix.agent.bpf import loader

    assert loader.kernel_has_ktime_coarse(release) is coarse
    flags = loader.BuildConfig(pin_dir="/x", ktime_coarse=coarse).cflags("abc")
    assert ("-DPF_KTIME_COARSE=1" in flags) is coarse


def test_remove_pin_dir_never_follows_symlinks(tmp_path):
    from pyfelix.agent.bpf import loader

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not ours")
    pins = tmp_path / "pins"
    (pins / "sub").mkdir(parents=True)
    (pins / "ipsets_v1").write_text("")
    (pins / "sub" / "progs_abc").write_text("")
    (pins / "link").symlink_to(outside, target_is_directory=True)
    loader.remove_pin_dir(str(pins))
    assert not pins.exists() and (outside / "precious").exists()
    linked = tmp_path / "linked-pins"
    linked.symlink_to(outside, target_is_directory=True)
    loader.remove_pin_dir(str(linked))  # a pin dir that is a link: left alone
    assert (outside / "precious").exists() and linked.is_symlink()

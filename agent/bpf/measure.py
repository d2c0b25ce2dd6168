"""Quick cost figures for the tc programs, measured with BPF_PROG_TEST_RUN.

Role: the measurement core a `bpf-verdict` benchmark can call (`measure_verdicts(loaded)`),
and a standalone run: `python -m pyfelix.agent.bpf.measure` (root; builds its own pin directory
under /sys/fs/bpf and removes it). Nothing here asserts a target: it reports.

What is measured (the kernel's mean ns per run over `repeat` runs, one endpoint on the
loopback ifindex, so no namespace is needed):
- ct_hit_ns: an established TCP packet to the pod (calico_to_wep: conntrack hit, no policy
  walk);
- ct_hit_from_wep_ns: the same flow's packet from the pod (calico_from_wep), which also
  pays the source check (one `wep_sources` trie lookup);
- first_packet_ns[N]: a TCP packet to port 80 evaluated against N rules
  "allow tcp dport 80 from <IP set>" whose sets it is NOT in, so every rule costs a trie
  lookup, then denied at the tier end (a deny creates no conntrack entry, so every
  repetition walks the whole chain). The sets hold `set_members` members each
  (`set_count` distinct sets shared round-robin by the rules).
- the IPv6 twins, measured after the IPv4 figures (so those are taken on exactly the maps
  they always were): ct_hit_v6_ns / ct_hit_from_wep_v6_ns (an established IPv6 TCP flow),
  first_packet_v6_ns[N] (the same rules, once each set also holds `set_members` IPv6
  members; an IPv6 client in none of them);
- harness_ns: the same measurement of the smallest tc program (`return 0`), loaded with
  the raw bpf() syscall: what BPF_PROG_TEST_RUN itself costs per run on this machine, now.
  It is part of every figure above, and it moves with the machine: when the host slows
  this VM down, harness_ns rises with the others, which tells a slow machine from a slower
  program.
- compile_seconds / load_seconds of the build used.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from typing import Any

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets
from pyfelix.agent.bpf.compiler import PolicyCompiler, PolicyState
from pyfelix.agent.bpf.loader import BuildConfig, LoadedDataplane, load_dataplane
from pyfelix.agent.bpf.maps import ep_by_ifindex as ep_array
from pyfelix.agent.bpf.testrun import TC_ACT_OK, TC_ACT_SHOT, run_tc

LOOPBACK_IFINDEX = 1
# room for a 10,000-rule chain beside the previous one, and two classifier instances of
# the source sets (the old one is deleted after the switch): 100,000 members, 200,000 with
# the IPv6 members of the IPv6 phase
MEASURE_MAP_SIZES = {"rules": 32768, "ipsets": 1 << 19, "conntrack": 4096,
                     "cls_tries": 1 << 19, "cls_words": 1 << 18}
POD = "10.65.0.1"
CLIENT = "10.66.0.1"  # in no set
POD6 = "fd00:65::1"
CLIENT6 = "fd00:66::1"  # in no set


def _program(dp: LoadedDataplane, compiler: PolicyCompiler, state: PolicyState,
             written: dict[str, dict[bytes, bytes]]) -> None:
    """Compile and write only what changed since the previous call (`written`)."""
    out = compiler.compile(state, {"lo": LOOPBACK_IFINDEX})
    if out.problems:
        raise RuntimeError(f"measurement policy did not compile: {out.problems}")
    for name in ("ids", "ipsets", "wep_sources", "endpoints"):
        desired: dict[bytes, bytes] = getattr(out, name)
        before = written.get(name, {})
        m = dp.maps[name]
        m.update_many((k, v) for k, v in desired.items() if before.get(k) != v)
        m.delete_many([k for k in before if k not in desired])
        written[name] = desired
    dp.maps["rules"].update_many(out.rules.items())
    # the classifier: new instances whole, then the chain pointers, then stale entries
    dp.maps["cls_words"].update_many(out.cls_words().items())
    for name in ("cls_l4", "cls_tries"):
        desired = getattr(out, name)
        before = written.get(name, {})
        dp.maps[name].update_many((k, v) for k, v in desired.items() if before.get(k) != v)
        written[name] = desired
    dp.maps["cls_chains"].update_many(out.cls_chains.items())
    # the array mirror of endpoints, as the agent's BPF policy manager writes it
    array = dp.maps["ep_by_ifindex"]
    slots = ep_array.slots_for(out.endpoints, array.max_entries)
    array.update_many([*slots.items(), *((k, ep_array.EMPTY)
                                         for k in written.get("ep_by_ifindex", {})
                                         if k not in slots)])
    written["ep_by_ifindex"] = slots
    for name in ("cls_l4", "cls_tries"):
        stale = written.get(f"{name}-kernel", {})
        dp.maps[name].delete_many([k for k in stale if k not in written[name]])
        written[f"{name}-kernel"] = written[name]
    compiler.commit(out)


def _set_members(index: int, count: int) -> frozenset[str]:
    base = int(ipaddress.IPv4Address("11.0.0.0")) + index * (1 << 20)
    return frozenset(str(ipaddress.IPv4Address(base + i)) + "/32" for i in range(count))


def _set_members6(index: int, count: int) -> frozenset[str]:
    base = int(ipaddress.IPv6Address("fd11::")) + (index << 64)
    return frozenset(str(ipaddress.IPv6Address(base + i)) + "/128" for i in range(count))


def measure_verdict_samples(
        dp: LoadedDataplane, *, rule_counts: tuple[int, ...] = (1, 10, 100, 1000, 10000),
        set_members: int = 10_000, set_count: int = 10, repeat: int = 20_000,
        samples: int = 1) -> dict[str, Any]:
    """`samples` kernel means per figure: {"ct_hit_ns": [...], "first_packet_ns":
    {"<rules>": [...]}}. Overwrites the maps' contents."""
    from_wep = dp.prog_fd("calico_from_wep")
    to_wep = dp.prog_fd("calico_to_wep")
    for m in dp.maps.values():
        if m.params.name in ("conntrack", "endpoints", "ep_by_ifindex", "ipsets", "ids",
                             "wep_sources", "cls_l4", "cls_tries"):
            m.clear()
    state = PolicyState()
    compiler = PolicyCompiler(rules_capacity=dp.maps["rules"].max_entries,
                              cls_words=dp.maps["cls_words"].max_entries,
                              cls_tries=dp.maps["cls_tries"].max_entries,
                              cls_l4=dp.maps["cls_l4"].max_entries)
    for i in range(set_count):
        state.apply(p.IPSetUpdate(f"bench-set-{i}", "net", _set_members(i, set_members)))
    wid = p.WorkloadEndpointID("bench", "bench/pod", "eth0")
    written: dict[str, dict[bytes, bytes]] = {}
    out_samples: dict[str, Any] = {"first_packet_ns": {}}

    # conntrack hit: allow everything, open the flow once, then time established packets
    state.apply(p.ActiveProfileUpdate("allow", p.Profile(
        inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))))
    state.apply(p.WorkloadEndpointUpdate(wid, p.WorkloadEndpoint(
        "active", "lo", profile_ids=("allow",), ipv4_nets=(f"{POD}/32",),
        ipv6_nets=(f"{POD6}/128",))))
    _program(dp, compiler, state, written)
    syn = packets.tcp(POD, CLIENT, 40000, 80, "S")
    assert run_tc(from_wep, syn, ifindex=LOOPBACK_IFINDEX).retval == TC_ACT_OK
    ack = packets.tcp(CLIENT, POD, 80, 40000, "A")
    hits = []
    for _ in range(max(1, samples)):
        out = run_tc(to_wep, ack, ifindex=LOOPBACK_IFINDEX, repeat=repeat)
        assert out.retval == TC_ACT_OK
        hits.append(out.duration_ns)
    out_samples["ct_hit_ns"] = hits
    from_pod = packets.tcp(POD, CLIENT, 40000, 80, "A")
    hits = []
    for _ in range(max(1, samples)):
        out = run_tc(from_wep, from_pod, ifindex=LOOPBACK_IFINDEX, repeat=repeat)
        assert out.retval == TC_ACT_OK
        hits.append(out.duration_ns)
    out_samples["ct_hit_from_wep_ns"] = hits
    out_samples["harness_ns"] = harness_samples(ack, samples=max(1, samples), repeat=repeat)
    syn6 = packets.tcp6(POD6, CLIENT6, 40000, 80, "S")
    assert run_tc(from_wep, syn6, ifindex=LOOPBACK_IFINDEX).retval == TC_ACT_OK
    for name, fd, frame in (("ct_hit_v6_ns", to_wep, packets.tcp6(CLIENT6, POD6, 80, 40000, "A")),
                            ("ct_hit_from_wep_v6_ns", from_wep,
                             packets.tcp6(POD6, CLIENT6, 40000, 80, "A"))):
        hits = []
        for _ in range(max(1, samples)):
            out = run_tc(fd, frame, ifindex=LOOPBACK_IFINDEX, repeat=repeat)
            assert out.retval == TC_ACT_OK
            hits.append(out.duration_ns)
        out_samples[name] = hits

    # first packets: N non-matching rules with large sets, then the tier-end deny; IPv4,
    # then IPv6 once the sets also hold IPv6 members
    for key, pkt in (("first_packet_ns", packets.tcp(CLIENT, POD, 40001, 80, "S")),
                     ("first_packet_v6_ns", packets.tcp6(CLIENT6, POD6, 40001, 80, "S"))):
        out_samples[key] = {}
        if key == "first_packet_v6_ns":
            for i in range(set_count):
                state.apply(p.IPSetUpdate(f"bench-set-{i}", "net", _set_members(
                    i, set_members) | _set_members6(i, set_members)))
        for n in rule_counts:
            rules = tuple(p.Rule("allow", protocol=6, dst_ports=(p.PortRange(80, 80),),
                                 src_ip_set_ids=(f"bench-set-{i % set_count}",))
                          for i in range(n))
            state.apply(p.ActivePolicyUpdate(p.PolicyID("default", "bench"),
                                             p.Policy(inbound_rules=rules)))
            state.apply(p.WorkloadEndpointUpdate(wid, p.WorkloadEndpoint(
                "active", "lo", tiers=(p.TierInfo("default", ingress_policies=("bench",)),),
                ipv4_nets=(f"{POD}/32",), ipv6_nets=(f"{POD6}/128",))))
            _program(dp, compiler, state, written)
            reps = repeat  # flat in N: every rule count gets the same repetitions
            firsts = []
            for _ in range(max(1, samples)):
                out = run_tc(to_wep, pkt, ifindex=LOOPBACK_IFINDEX, repeat=reps)
                assert out.retval == TC_ACT_SHOT
                firsts.append(out.duration_ns)
            out_samples[key][str(n)] = firsts
    return out_samples


def harness_samples(packet: bytes, *, samples: int, repeat: int) -> list[int]:
    """Kernel means of the `return 0` tc program on `packet` (see harness_ns above)."""
    import os

    from pyfelix.agent.bpf.syscall import load_return_zero_tc_prog

    fd = load_return_zero_tc_prog()
    try:
        return [run_tc(fd, packet, ifindex=LOOPBACK_IFINDEX, repeat=repeat).duration_ns
                for _ in range(samples)]
    finally:
        os.close(fd)


def measure_verdicts(dp: LoadedDataplane, *, rule_counts: tuple[int, ...] = (1, 10, 100, 1000),
                     set_members: int = 10_000, set_count: int = 10,
                     repeat: int = 20_000) -> dict[str, Any]:
    """Figures as described in the module docstring. Overwrites the maps' contents."""
    raw = measure_verdict_samples(dp, rule_counts=rule_counts, set_members=set_members,
                                  set_count=set_count, repeat=repeat)
    figures: dict[str, Any] = {
        "ct_hit_ns": raw["ct_hit_ns"][0],
        "ct_hit_from_wep_ns": raw["ct_hit_from_wep_ns"][0],
        "ct_hit_v6_ns": raw["ct_hit_v6_ns"][0],
        "ct_hit_from_wep_v6_ns": raw["ct_hit_from_wep_v6_ns"][0],
        "harness_ns": raw["harness_ns"][0],
        "first_packet_ns": {n: v[0] for n, v in raw["first_packet_ns"].items()},
        "first_packet_v6_ns": {n: v[0] for n, v in raw["first_packet_v6_ns"].items()},
    }
    figures["compile_seconds"] = round(dp.compile_seconds, 2)
    figures["load_seconds"] = round(dp.load_seconds, 2)
    figures["trie_members"] = set_members * set_count
    return figures


def main() -> int:
    from pyfelix.agent.bpf.scratch import scratch_pin_dir

    with scratch_pin_dir("measure") as pin_dir, \
            load_dataplane(BuildConfig(pin_dir=pin_dir, map_sizes=MEASURE_MAP_SIZES)) as dp:
        print(json.dumps(measure_verdicts(dp), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark `bpf-verdict`: what the tc programs cost per packet, measured by the kernel
(BPF_PROG_TEST_RUN) on the real programs compiled from bpf/*.c.

Setup: one BCC build with maps pinned under a scratch pin dir (agent.bpf.scratch)
(removed afterwards, also on failure); one endpoint on the loopback ifindex, so no namespace
is created (agent.bpf.measure). Each sample is the kernel's mean over thousands of runs.

Figures (median of `repeats` samples, with _min/_max):
- `ct_hit_ns`: an established TCP packet (conntrack hit, no policy walk). Target <= 150.
- `ct_hit_from_wep_ns`: the same from the pod's side, which also pays the source (RPF) check.
- `harness_ns`: the smallest tc program (`return 0`) measured the same way: the test-run
  harness's own share of every figure, and a gauge of the machine: a host that slows this
  VM down raises it together with the others.
- `first_packet_ns_<N>` for N = 1, 10, 100, 1000, 10000: a TCP SYN evaluated against N
  rules `allow tcp dport 80 from <IP set>` it matches none of, then the tier-end deny. The
  rules use 10 IP sets of 10,000 members each, shared round-robin (100,000 trie entries).
  The classifier (bpf/include/classifier.h) makes this flat in N.
- `first_packet_10000_over_10` (target <= 2) and `first_packet_1000_over_ct_hit` (target
  <= 10), from the medians.
- `ns_per_rule`: (first_packet_ns_1000 - first_packet_ns_100) / 900, the marginal cost of
  one more rule (about 0 with the classifier; ~8 ns with the old linear walk).
- IPv6, measured after the IPv4 figures: `ct_hit_v6_ns`, `ct_hit_from_wep_v6_ns` (an
  established IPv6 flow) and `first_packet_v6_ns_<N>` (the same rules once the sets also
  hold 10,000 IPv6 members each; an IPv6 client in none of them).
- `compile_seconds`, `load_seconds`: the BCC build used; `trie_members` (IPv4; the IPv6
  phase adds as many IPv6 members).
"""

from __future__ import annotations

import os

from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark

RULE_COUNTS = (1, 10, 100, 1000, 10000)


@benchmark("bpf-verdict", description="tc program ns per packet: conntrack hit, first packet")
def bpf_verdict(ctx: BenchContext) -> Figures:
    from pyfelix.agent.bpf.loader import BuildConfig, load_dataplane
    from pyfelix.agent.bpf.measure import MEASURE_MAP_SIZES, measure_verdict_samples
    from pyfelix.agent.bpf.scratch import scratch_pin_dir

    if os.geteuid() != 0:
        raise PermissionError("bpf-verdict needs root (BPF programs)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    with scratch_pin_dir("bench-verdict") as pin_dir, \
            load_dataplane(BuildConfig(pin_dir=pin_dir, map_sizes=MEASURE_MAP_SIZES)) as dp:
        raw = measure_verdict_samples(
            dp, rule_counts=RULE_COUNTS, samples=max(1, ctx.settings.repeats),
            repeat=2_000 if quick else 20_000)
        compile_s, load_s = dp.compile_seconds, dp.load_seconds
    figures: Figures = {}
    figures.update(Stat.of([float(v) for v in raw["ct_hit_ns"]]).figures("ct_hit_ns"))
    figures.update(Stat.of([float(v) for v in raw["ct_hit_from_wep_ns"]])
                   .figures("ct_hit_from_wep_ns"))
    figures.update(Stat.of([float(v) for v in raw["harness_ns"]]).figures("harness_ns"))
    for name in ("ct_hit_v6_ns", "ct_hit_from_wep_v6_ns"):
        figures.update(Stat.of([float(v) for v in raw[name]]).figures(name))
    for n, values in raw["first_packet_v6_ns"].items():
        figures.update(Stat.of([float(v) for v in values]).figures(f"first_packet_v6_ns_{n}"))
    medians = {}
    for n, values in raw["first_packet_ns"].items():
        stat = Stat.of([float(v) for v in values])
        medians[int(n)] = stat.median
        figures.update(stat.figures(f"first_packet_ns_{n}"))
    figures["ns_per_rule"] = (medians[1000] - medians[100]) / 900
    figures["first_packet_10000_over_10"] = medians[10000] / medians[10]
    figures["first_packet_1000_over_ct_hit"] = medians[1000] / figures["ct_hit_ns"]
    figures["compile_seconds"] = compile_s
    figures["load_seconds"] = load_s
    figures["trie_members"] = 100_000
    return figures

"""Benchmark `services`: what the BPF service NAT costs on a connection's first packet, with
10, 1,000 and 10,000 Services programmed, measured in the kernel (BPF_PROG_TEST_RUN on the
real calico_from_wep).

Setup: one BCC build with maps pinned under /sys/fs/bpf/pyfelix-bench-svc-* (removed
afterwards, also on failure); one endpoint on the loopback ifindex allowing everything (as
agent.bpf.measure); N Services of 3 backends each written by the agent's BpfNatManager.

A first packet cannot be repeated inside one test run (its first repetition creates the
flow's NAT and conntrack entries, and the rest would be established packets), so each
sample is ONE run (repeat=1) of a TCP SYN from a new source port to a random one of the N
ClusterIPs: frontend lookup, backend choice, two nat_ct writes, the rewrite, conntrack miss,
the policy walk (one allow rule) and the conntrack write. The kernel times a single run
coarsely and adds its own set-up, so `bpf_first_packet_harness_ns` (the `return 0`
program, same single-run timing) is reported beside it.

Figures (each the median of `samples` single runs, with _min/_max over `repeats` medians):
- `bpf_first_packet_ns_<N>` for N = 10, 1000, 10000;
- `bpf_first_packet_ratio_10000_to_10`: the goal is flat (<= 1.2);
- `bpf_first_packet_harness_ns`.
Not measured here yet: new connections/s with a C client beside kube-proxy's iptables
rules (the issue's `bpf_new_conn_per_s_<N>` / `iptables_new_conn_per_s_<N>`).
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import statistics

from agent.bench.registry import BenchContext, Figures, Stat, benchmark

SERVICE_COUNTS = (10, 1000, 10000)
BACKENDS_PER_SERVICE = 3
VIP_BASE = int(ipaddress.IPv4Address("10.96.0.0"))


def _frontends(n: int) -> list:
    from agent import proto as p

    out = []
    for i in range(n):
        vip = str(ipaddress.IPv4Address(VIP_BASE + 1 + i))
        backends = tuple(p.ServiceBackend(str(ipaddress.IPv4Address(
            int(ipaddress.IPv4Address("10.70.0.0")) + (i * BACKENDS_PER_SERVICE + j) % 60000)),
            8080) for j in range(BACKENDS_PER_SERVICE))
        out.append(p.ServiceFrontendUpdate(id=f"{vip}:80/6", service=f"bench/svc-{i}",
                                           port_name="", vip=vip, port=80, protocol=6,
                                           backends=backends))
    return out


def _single_runs(fd: int, packets: list[bytes], ifindex: int) -> list[int]:
    from agent.bpf.testrun import run_tc

    return [run_tc(fd, pkt, ifindex=ifindex).duration_ns for pkt in packets]


@benchmark("services", description="BPF service NAT: first-packet ns with 10 to 10,000 "
                                   "Services")
def services(ctx: BenchContext) -> Figures:
    from agent import proto as p
    from agent.bpf import packets
    from agent.bpf.compiler import PolicyCompiler, PolicyState
    from agent.bpf.loader import BuildConfig, load_dataplane, remove_pin_dir
    from agent.bpf.measure import LOOPBACK_IFINDEX, POD, _program
    from agent.bpf.syscall import load_return_zero_tc_prog
    from agent.bpf.testrun import TC_ACT_OK, run_tc
    from agent.dataplane.managers.bpf_nat import BpfNatManager

    if os.geteuid() != 0:
        raise PermissionError("the services benchmark needs root (BPF programs)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    samples = 200 if quick else 2000
    repeats = max(1, ctx.settings.repeats)
    pin_dir = f"/sys/fs/bpf/pyfelix-bench-svc-{secrets.token_hex(4)}"
    rng = random.Random(7)
    medians: dict[int, list[float]] = {n: [] for n in SERVICE_COUNTS}
    harness: list[float] = []
    try:
        with load_dataplane(BuildConfig(pin_dir=pin_dir, map_sizes={
                "rules": 1024, "conntrack": 1 << 16, "nat_frontend": 16384,
                "nat_backend": 65536})) as dp:
            state = PolicyState()
            compiler = PolicyCompiler(rules_capacity=dp.maps["rules"].max_entries,
                                      max_chain_records=32 * dp.config.rules_per_prog)
            state.apply(p.ActiveProfileUpdate("allow", p.Profile(
                inbound_rules=(p.Rule("allow"),), outbound_rules=(p.Rule("allow"),))))
            state.apply(p.WorkloadEndpointUpdate(
                p.WorkloadEndpointID("bench", "bench/pod", "eth0"),
                p.WorkloadEndpoint("active", "lo", profile_ids=("allow",),
                                   ipv4_nets=(f"{POD}/32",))))
            _program(dp, compiler, state, {})
            from_wep = dp.prog_fd("calico_from_wep")
            zero = load_return_zero_tc_prog()
            try:
                for n in SERVICE_COUNTS:
                    nat = BpfNatManager(dp.maps["nat_frontend"], dp.maps["nat_backend"],
                                        dp.maps["nat_affinity"], dp.maps["nat_vip_filter"])
                    for msg in (*_frontends(n), p.InSync()):
                        nat.on_update(msg)
                    nat.apply()
                    port = 1024
                    for _ in range(repeats):
                        batch = []
                        for _ in range(samples):
                            port = port + 1 if port < 65000 else 1024
                            vip = str(ipaddress.IPv4Address(VIP_BASE + 1 + rng.randrange(n)))
                            batch.append(packets.tcp(POD, vip, port, 80, "S"))
                        dp.maps["nat_ct"].clear()
                        dp.maps["conntrack"].clear()
                        assert run_tc(from_wep, batch[0], ifindex=LOOPBACK_IFINDEX
                                      ).retval == TC_ACT_OK
                        times = _single_runs(from_wep, batch[1:], LOOPBACK_IFINDEX)
                        medians[n].append(float(statistics.median(times)))
                for _ in range(repeats):
                    times = _single_runs(zero, [packets.tcp(POD, "10.96.0.1", 1, 80, "S")]
                                         * samples, LOOPBACK_IFINDEX)
                    harness.append(float(statistics.median(times)))
            finally:
                os.close(zero)
    finally:
        remove_pin_dir(pin_dir)
    figures: Figures = {}
    for n in SERVICE_COUNTS:
        figures.update(Stat.of(medians[n]).figures(f"bpf_first_packet_ns_{n}"))
    figures.update(Stat.of(harness).figures("bpf_first_packet_harness_ns"))
    small = statistics.median(medians[SERVICE_COUNTS[0]])
    figures["bpf_first_packet_ratio_10000_to_10"] = round(
        statistics.median(medians[SERVICE_COUNTS[-1]]) / small, 3) if small else 0.0
    return figures

"""Benchmark `services`: the BPF service NAT with 10, 1,000 and 10,000 Services programmed:
(1) its cost on a connection's first packet, measured in the kernel (BPF_PROG_TEST_RUN on
the real calico_from_wep), and (2) new connections/s from a lab pod to a ClusterIP, beside
the same scenario on the iptables dataplane with kube-proxy's rules (`conn_rate_figures`).

Setup: one BCC build with maps pinned under a scratch pin dir (agent.bpf.scratch; removed
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
- `bpf_first_packet_harness_ns`;
- `bpf_first_packet_load_avg_1m`: the 1-minute load average when the measurement ended
  (the figures of a loaded, shared machine are not a quiet one's);
- `bpf_first_packet_ns_10000_hot10` (a diagnostic beside the headline figures): 10,000
  Services programmed, but the packets go to the same 10 ClusterIPs as with N = 10, so the
  lookups' working set stays in the CPU caches; with `..._ratio_10000_hot10_to_10` it
  separates what the NUMBER of Services costs (the maps' algorithms) from what spreading
  first packets over 10,000 Services' frontend entries costs (cache and TLB misses: the
  filter word, the frontend's hash bucket and element; the backend is read from the
  frontend entry for Services of up to 7 backends, nat_frontend.h).
The Service counts are interleaved: each repeat programs 10, then 1,000, then 10,000
Services and measures each, so a change in the machine's load during the run does not
favour one count.
Part (2), `bpf_new_conn_per_s_<N>` / `iptables_new_conn_per_s_<N>` and
`bpf_to_iptables_conn_ratio_10000`: see `conn_rate_figures`.
"""

from __future__ import annotations

import ipaddress
import os
import random
import statistics

from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark

SERVICE_COUNTS = (10, 1000, 10000)
BACKENDS_PER_SERVICE = 3
VIP_BASE = int(ipaddress.IPv4Address("10.96.0.0"))


def _frontends(n: int) -> list:
    from pyfelix.agent import proto as p

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
    from pyfelix.agent.bpf.testrun import run_tc

    return [run_tc(fd, pkt, ifindex=ifindex).duration_ns for pkt in packets]


def first_packet_figures(ctx: BenchContext) -> Figures:
    from pyfelix.agent import proto as p
    from pyfelix.agent.bpf import packets
    from pyfelix.agent.bpf.compiler import PolicyCompiler, PolicyState
    from pyfelix.agent.bpf.loader import BuildConfig, load_dataplane
    from pyfelix.agent.bpf.measure import LOOPBACK_IFINDEX, POD, _program
    from pyfelix.agent.bpf.scratch import scratch_pin_dir
    from pyfelix.agent.bpf.syscall import load_return_zero_tc_prog
    from pyfelix.agent.bpf.testrun import TC_ACT_OK, run_tc
    from pyfelix.agent.dataplane.managers.bpf_nat import BpfNatManager

    if os.geteuid() != 0:
        raise PermissionError("the services benchmark needs root (BPF programs)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    samples = 200 if quick else 2000
    repeats = max(1, ctx.settings.repeats)
    rng = random.Random(7)
    medians: dict[int, list[float]] = {n: [] for n in SERVICE_COUNTS}
    hot: list[float] = []  # 10,000 Services, packets to the first 10 VIPs only
    harness: list[float] = []
    sizes = {"rules": 1024, "conntrack": 1 << 16, "nat_frontend": 16384, "nat_backend": 65536}
    with scratch_pin_dir("bench-svc") as pin_dir, \
            load_dataplane(BuildConfig(pin_dir=pin_dir, map_sizes=sizes)) as dp:
            state = PolicyState()
            compiler = PolicyCompiler(rules_capacity=dp.maps["rules"].max_entries,
                                      cls_words=dp.maps["cls_words"].max_entries,
                                      cls_tries=dp.maps["cls_tries"].max_entries,
                                      cls_l4=dp.maps["cls_l4"].max_entries)
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
                # the counts are interleaved (each repeat programs 10, then 1,000, then
                # 10,000 Services and measures each), so a change of the shared machine's
                # load over the run biases no count against another
                port = 1024
                for _ in range(repeats):
                    for n in SERVICE_COUNTS:
                        nat = BpfNatManager(dp.maps["nat_frontend"], dp.maps["nat_backend"],
                                            dp.maps["nat_affinity"], dp.maps["nat_vip_filter"])
                        for msg in (*_frontends(n), p.InSync()):
                            nat.on_update(msg)
                        nat.apply()
                        spreads = [(n, medians[n])]
                        if n == SERVICE_COUNTS[-1]:
                            spreads.append((SERVICE_COUNTS[0], hot))
                        for spread, out in spreads:
                            batch = []
                            for _ in range(samples):
                                port = port + 1 if port < 65000 else 1024
                                vip = str(ipaddress.IPv4Address(
                                    VIP_BASE + 1 + rng.randrange(spread)))
                                batch.append(packets.tcp(POD, vip, port, 80, "S"))
                            dp.maps["nat_ct"].clear()
                            dp.maps["conntrack"].clear()
                            assert run_tc(from_wep, batch[0], ifindex=LOOPBACK_IFINDEX
                                          ).retval == TC_ACT_OK
                            times = _single_runs(from_wep, batch[1:], LOOPBACK_IFINDEX)
                            out.append(float(statistics.median(times)))
                for _ in range(repeats):
                    times = _single_runs(zero, [packets.tcp(POD, "10.96.0.1", 1, 80, "S")]
                                         * samples, LOOPBACK_IFINDEX)
                    harness.append(float(statistics.median(times)))
            finally:
                os.close(zero)
    figures: Figures = {}
    # the machine's load while measuring (shared machines: read the figures beside it)
    figures["bpf_first_packet_load_avg_1m"] = round(os.getloadavg()[0], 2)
    for n in SERVICE_COUNTS:
        figures.update(Stat.of(medians[n]).figures(f"bpf_first_packet_ns_{n}"))
    figures.update(Stat.of(harness).figures("bpf_first_packet_harness_ns"))
    small = statistics.median(medians[SERVICE_COUNTS[0]])
    figures["bpf_first_packet_ratio_10000_to_10"] = round(
        statistics.median(medians[SERVICE_COUNTS[-1]]) / small, 3) if small else 0.0
    figures.update(Stat.of(hot).figures("bpf_first_packet_ns_10000_hot10"))
    figures["bpf_first_packet_ratio_10000_hot10_to_10"] = round(
        statistics.median(hot) / small, 3) if small else 0.0
    return figures


# --- new connections per second through a ClusterIP, BPF NAT vs kube-proxy's iptables -------

CONN_SERVICE_COUNTS = (10, 1000, 10000)
CONN_PORT = 9000  # the C servers' port in the backend pods (not a scenario port)
MEASURED_VIP = "10.96.0.1"  # sorts in the middle of the fillers (10.95.*, 10.97.*)
C_SOURCE = os.path.join(os.path.dirname(__file__), "c", "conn_rate.c")


def conn_scenario() -> dict:
    return {"name": "bench-services",
            "namespaces": [{"name": "x"}],
            "pods": [{"namespace": "x", "name": "client"},
                     *({"namespace": "x", "name": f"srv-{i}"} for i in (1, 2, 3))]}


def service_documents(n: int, backends: list[str]) -> list[dict]:
    """The measured Service (3 backends) and n - 1 fillers (one backend each), with their
    EndpointSlices; fillers' VIPs below and above the measured one."""
    docs = []
    for i in range(n):
        if i == 0:
            name, vip, eps = "measured", MEASURED_VIP, backends
        else:
            half, k = ("95", i) if i % 2 else ("97", i)
            vip = f"10.{half}.{k // 250 % 250}.{k % 250 + 1}"
            name, eps = f"filler-{i}", backends[:1]
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": name, "namespace": "x"},
                     "spec": {"clusterIP": vip,
                              "ports": [{"port": 80, "targetPort": CONN_PORT}]}})
        docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"{name}-eps", "namespace": "x",
                                  "labels": {"kubernetes.io/service-name": name}},
                     "addressType": "IPv4",
                     "endpoints": [{"addresses": [a], "conditions": {"ready": True},
                                    "nodeName": "node1"} for a in eps],
                     "ports": [{"name": "", "protocol": "TCP", "port": CONN_PORT}]})
    return docs


def build_conn_rate(workdir: str) -> str:
    import subprocess

    binary = os.path.join(workdir, "conn_rate")
    subprocess.run(["gcc", "-O2", "-o", binary, C_SOURCE], check=True, timeout=120,
                   capture_output=True)
    return binary


def measure_conn_rates(dataplane: str, n: int, binary: str, *, samples: int,
                       seconds: float) -> list[float]:
    """New connections/s from a pod to the measured ClusterIP with n Services programmed."""
    import subprocess
    import threading

    import yaml

    from pyfelix.lab.agents import AgentProcesses
    from pyfelix.lab.runner import LabRunner
    from pyfelix.lab.scenario import parse_scenario

    scenario = parse_scenario(conn_scenario(), source="<bench services>")
    servers: list[subprocess.Popen[str]] = []
    with LabRunner(scenario, agents=AgentProcesses(dataplane), dataplane=dataplane,
                   program_routes=False, probe_timeout=1.0,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        try:
            lab.build()
            backends = [str(scenario.pod(f"x/srv-{i}").ip) for i in (1, 2, 3)]
            staged = lab.state.staging_dir / "bench-services.yaml"
            staged.write_text(yaml.safe_dump_all(service_documents(n, backends)))
            os.replace(staged, lab.datastore_dir / "bench-services.yaml")
            lab.start_agents()
            lab.wait_in_sync(timeout=600)
            if dataplane == "iptables":
                lab.sync_kube_proxy()
            for i in (1, 2, 3):
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", lab.topology.pods[f"x/srv-{i}"].netns, binary,
                     "serve", str(CONN_PORT)], stdout=subprocess.PIPE, text=True)
                servers.append(proc)
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            client = lab.topology.pods["x/client"].netns

            def rate(secs: float) -> float:
                done = subprocess.run(["ip", "netns", "exec", client, binary, "connect",
                                       MEASURED_VIP, "80", str(secs)],
                                      capture_output=True, text=True, timeout=secs + 60)
                if done.returncode != 0:
                    raise RuntimeError(f"{dataplane}, {n} services: client failed: "
                                       f"{done.stderr.strip()}")
                count, elapsed = done.stdout.split()
                return int(count) / float(elapsed)

            rate(min(0.2, seconds))  # warm up
            return [rate(seconds) for _ in range(samples)]
        finally:
            for proc in servers:
                proc.kill()
                proc.wait(timeout=10)


def conn_rate_figures(ctx: BenchContext) -> Figures:
    """`bpf_new_conn_per_s_<N>` / `iptables_new_conn_per_s_<N>` for N = 10, 1,000, 10,000:
    a C client (pyfelix/bench/c/conn_rate.c) opening and closing connections one at a time
    from a lab pod to a ClusterIP with 3 backends (C servers), the measured Service in the
    middle of kube-proxy's KUBE-SERVICES chain; and `bpf_to_iptables_conn_ratio_10000`
    (the goal: >= 3)."""
    import tempfile

    if os.geteuid() != 0:
        raise PermissionError("the services-conn benchmark needs root (lab namespaces)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    seconds = 0.5 if quick else 2.0
    figures: Figures = {}
    medians = {}
    with tempfile.TemporaryDirectory(prefix="pyfelix-bench-svc-") as workdir:
        binary = build_conn_rate(workdir)
        for dataplane in ("bpf", "iptables"):
            for n in CONN_SERVICE_COUNTS:
                rates = measure_conn_rates(dataplane, n, binary,
                                           samples=max(1, ctx.settings.repeats),
                                           seconds=seconds)
                stat = Stat.of(rates)
                medians[(dataplane, n)] = stat.median
                figures.update(stat.figures(f"{dataplane}_new_conn_per_s_{n}"))
    top = CONN_SERVICE_COUNTS[-1]
    if medians[("iptables", top)]:
        figures[f"bpf_to_iptables_conn_ratio_{top}"] = round(
            medians[("bpf", top)] / medians[("iptables", top)], 2)
    return figures


@benchmark("services", description="Services: BPF NAT first-packet ns and new connections/s "
                                   "vs kube-proxy iptables, 10 to 10,000 Services")
def services(ctx: BenchContext) -> Figures:
    """Both parts of the module docstring, in one run."""
    return {**first_packet_figures(ctx), **conn_rate_figures(ctx)}

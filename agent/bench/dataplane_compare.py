"""Benchmark `dataplane-compare`: the same 1,000-rule policy enforced by the BPF dataplane and
by the iptables dataplane, between two pods in the lab, measured the same way.

For each dataplane a lab is built (`LabRunner` + the real agent per node, as `pyfelix lab
run --dataplane X` does): one node, pods x/client, x/other and x/server (TCP echo on 80).
One GlobalNetworkPolicy selects the server with 1,000 ingress rules that never match the
client (TCP from 10.200.a.b/32 to port 80, one /32 each), then the rule that allows
x/client. Probes check the policy is in force (client allowed, other denied) before
anything is timed, then, from the client's namespace (sockets of the benchmark process;
the echo server is the lab's, a Python thread of the same process):
- new connections: connect, send 1 byte, read the echo, close; as many as fit in a
  sample of `SAMPLE_SECONDS` (at most `MAX_CONNECTIONS_PER_SAMPLE`): every one is a new
  flow, so the server side's first packet walks the whole policy (BPF: 1,001 records; the
  1,000 /32 nets are one-entry trie sets; iptables: 1,001 rules in the policy chain);
- request/response: one connection, `ROUND_TRIPS` 1-byte round trips (conntrack hits).

Figures: `<dp>_new_conn_per_s` (median of samples, with _min/_max), `<dp>_rr_latency_us`
(median round trip, with p99 as `<dp>_rr_latency_p99_us`), and
`bpf_over_iptables_new_conn_rate` (BPF median / iptables median; >= 1 means BPF is at least
as fast). The Python client and server bound the absolute rates (tens of microseconds per
connection), so the ratio understates the policy walk's difference; both dataplanes pay the
same Python costs. Loopback/namespace traffic only; every lab is torn down, also on failure.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from typing import Any

from agent.bench.registry import BenchContext, Figures, Stat, benchmark

RULES = 1000
SAMPLE_SECONDS = 1.0
MAX_CONNECTIONS_PER_SAMPLE = 20_000
ROUND_TRIPS = 2000


def scenario_data() -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        {"action": "Allow", "protocol": "TCP",
         "source": {"nets": [f"10.200.{i // 250}.{i % 250 + 1}/32"]},
         "destination": {"ports": [80]}}
        for i in range(RULES)]
    rules.append({"action": "Allow", "protocol": "TCP",
                  "source": {"selector": "role == 'client'"}, "destination": {"ports": [80]}})
    return {
        "name": "dataplane-compare",
        "namespaces": [{"name": "x"}],
        "pods": [
            {"namespace": "x", "name": "client", "labels": {"role": "client"}},
            {"namespace": "x", "name": "other", "labels": {"role": "other"}},
            {"namespace": "x", "name": "server", "labels": {"role": "server"},
             "ports": [{"port": 80, "protocol": "TCP"}]},
        ],
        "resources": [{"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
                       "metadata": {"name": "thousand-rules"},
                       "spec": {"selector": "role == 'server'", "types": ["Ingress"],
                                "ingress": rules}}],
        "probes": [
            {"from": "x/client", "to": "x/server", "port": 80, "protocol": "TCP",
             "expect": "allow"},
            {"from": "x/other", "to": "x/server", "port": 80, "protocol": "TCP",
             "expect": "deny"},
        ],
    }


def _client_socket(netns: str) -> socket.socket:
    from agent.lab.netns import in_netns

    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(2.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def new_connections_per_second(netns: str, address: tuple[str, int], seconds: float) -> float:
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    while count < MAX_CONNECTIONS_PER_SAMPLE and time.perf_counter() < deadline:
        sock = _client_socket(netns)
        try:
            sock.connect(address)
            sock.sendall(b"x")
            if sock.recv(1) != b"x":
                raise ConnectionError("no echo")
        finally:
            sock.close()
        count += 1
    return count / (time.perf_counter() - started)


def round_trip_us(netns: str, address: tuple[str, int], trips: int) -> list[float]:
    sock = _client_socket(netns)
    out = []
    try:
        sock.connect(address)
        for _ in range(trips):
            started = time.perf_counter()
            sock.sendall(b"y")
            if sock.recv(1) != b"y":
                raise ConnectionError("no echo")
            out.append((time.perf_counter() - started) * 1e6)
    finally:
        sock.close()
    return out


def measure_dataplane(dataplane: str, samples: int, seconds: float, trips: int
                      ) -> dict[str, Any]:
    from agent.lab.agents import AgentProcesses
    from agent.lab.runner import LabRunner
    from agent.lab.scenario import parse_scenario

    scenario = parse_scenario(scenario_data(), source="<dataplane-compare>")
    with LabRunner(scenario, agents=AgentProcesses(dataplane), program_routes=False,
                   probe_timeout=1.0,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        lab.build()
        lab.start_agents()
        step = scenario.steps[0]
        lab.apply_resources(step.apply)
        lab.wait_in_sync()
        results = lab.run_probes(step.probes)
        wrong = [r.to_json() for r in results if r.mismatch]
        if wrong:
            raise RuntimeError(f"{dataplane}: the policy is not enforced as expected: {wrong}")
        netns = lab.topology.pods["x/client"].netns
        address = (str(scenario.pod("x/server").ip), 80)
        new_connections_per_second(netns, address, min(0.2, seconds))  # warm up
        rates = [new_connections_per_second(netns, address, seconds) for _ in range(samples)]
        trips_us = round_trip_us(netns, address, trips)
    return {"rates": rates, "rr_us": trips_us}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@benchmark("dataplane-compare",
           description="1,000-rule policy between two lab pods: BPF vs iptables")
def dataplane_compare(ctx: BenchContext) -> Figures:
    if os.geteuid() != 0:
        raise PermissionError("dataplane-compare needs root (lab namespaces, BPF, iptables)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    samples = max(1, ctx.settings.repeats)
    seconds = 0.3 if quick else SAMPLE_SECONDS
    trips = 200 if quick else ROUND_TRIPS
    figures: Figures = {"rules": RULES}
    medians = {}
    for dataplane in ("bpf", "iptables"):
        raw = measure_dataplane(dataplane, samples, seconds, trips)
        stat = Stat.of(raw["rates"])
        medians[dataplane] = stat.median
        figures.update(stat.figures(f"{dataplane}_new_conn_per_s"))
        figures[f"{dataplane}_rr_latency_us"] = statistics.median(raw["rr_us"])
        figures[f"{dataplane}_rr_latency_p99_us"] = percentile(raw["rr_us"], 0.99)
    figures["bpf_over_iptables_new_conn_rate"] = medians["bpf"] / medians["iptables"]
    return figures

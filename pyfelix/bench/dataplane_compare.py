"""Benchmark `dataplane-compare`: real traffic (C tools) through the BPF and the iptables
dataplanes, with no policy, 1,000 and 10,000 rules, in one run.

For each dataplane a lab is built (`LabRunner` + the real agent, as `pyfelix lab run
--dataplane X` does): one node, pods x/client, x/other and x/server. In the server's
namespace run nginx (port 80, `return 200`), `sockperf server --tcp` and `iperf3 -s`
(`lab.traffic`); the clients (wrk, sockperf, iperf3) run in the client's namespace.
Then, for each rule count N in `RULE_COUNTS` (same lab, the policy replaced in place):
- N = 0: no policy selects the server (the namespace profile allows everything);
- N > 0: GlobalNetworkPolicies selecting the server with N ingress rules in all that never
  match the client (TCP from 10.200.a.b/32, one /32 each; split over ordered policies of
  `RULES_PER_POLICY`, below the agents' per-policy limit) and then the rule allowing
  x/client: the server's ingress walk is N + 1 rules.
Probes (the lab's, to its echo server on `PROBE_PORT`) check the policy is in force
(client allowed; for N > 0, other denied) before anything is timed, retried for up to
`PROBE_SETTLE_S` after the lab reports the agent in sync. If they still fail, the N is
reported as FAILED with the reason (a note `<dp>_<N>` with the probes' verdicts and the
agent's last error lines) and gets no figure: e.g. a 10,000-rule chain does not fit the BPF
rule walk today (the compiler gives the endpoint a DENY chain: fail closed).

Measured per dataplane `dp` and N (keys end in `_<N>`):
- `<dp>_new_conn_per_s_<N>`: wrk with `Connection: close` (every request is a new TCP
  connection, so every server-side SYN is a first packet through the policy); median of
  `repeats` samples with _min/_max; `<dp>_new_conn_errors_<N>`: wrk's socket errors and
  non-2xx responses summed over the samples (0 in a clean run);
- `<dp>_latency_p50_us_<N>`, `<dp>_latency_p99_us_<N>`: sockperf ping-pong over TCP
  (one connection: conntrack hits);
- `<dp>_throughput_gbit_s_<N>`: iperf3, one TCP stream;
- `bpf_over_iptables_new_conn_rate_<N>` (BPF median / iptables median; target 2 at 1,000
  rules and 5 at 10,000) and `bpf_throughput_<N>_over_0` (target >= 0.9 at 10,000);
  `rules_<N>` records each N that was planned.
Everything runs between the lab's own namespaces; the machine's other load (2 cores, shared)
shows in the spread. Labs and servers are torn down, also on failure.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyfelix.bench.registry import BenchContext, Figures, Stat, benchmark

RULE_COUNTS = (0, 1000, 10_000)
QUICK_RULE_COUNTS = (0, 100)
DATAPLANES = ("bpf", "iptables")
PROBE_PORT = 8080
POLICY_NAME = "bench-rules"
RULES_PER_POLICY = 2_500
SAMPLE_SECONDS = 2
TOOL_SECONDS = 3
WRK_CONNECTIONS = 8
SYNC_TIMEOUT_S = 120.0
PROBE_SETTLE_S = 30.0


def policy_documents(rules: int) -> list[dict[str, Any]]:
    """GlobalNetworkPolicies on the server: `rules` never-matching rules, then allow client.

    The rules are split over policies of at most `RULES_PER_POLICY` (one tier, ordered), as
    the agents accept at most `max_rules_per_policy` (5,000) rules in one policy: a packet
    that matches no rule of one policy goes on to the next, so the server's ingress is one
    walk of `rules` + 1 rules, whatever the split."""
    docs: list[dict[str, Any]] = []
    chunks = [range(start, min(start + RULES_PER_POLICY, rules))
              for start in range(0, rules, RULES_PER_POLICY)] or [range(0)]
    for number, chunk in enumerate(chunks):
        ingress: list[dict[str, Any]] = [
            {"action": "Allow", "protocol": "TCP",
             "source": {"nets": [f"10.200.{i // 250}.{i % 250 + 1}/32"]}}
            for i in chunk]
        if number == len(chunks) - 1:
            ingress.append({"action": "Allow", "source": {"selector": "role == 'client'"}})
        docs.append({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
                     "metadata": {"name": f"{POLICY_NAME}-{number}"},
                     "spec": {"order": number + 1, "selector": "role == 'server'",
                              "types": ["Ingress"], "ingress": ingress}})
    return docs


def scenario_data() -> dict[str, Any]:
    return {
        "name": "dataplane-compare",
        "namespaces": [{"name": "x"}],
        "pods": [
            {"namespace": "x", "name": "client", "labels": {"role": "client"}},
            {"namespace": "x", "name": "other", "labels": {"role": "other"}},
            {"namespace": "x", "name": "server", "labels": {"role": "server"},
             "ports": [{"port": PROBE_PORT, "protocol": "TCP"}]},
        ],
        "probes": [
            {"from": "x/client", "to": "x/server", "port": PROBE_PORT, "protocol": "TCP",
             "expect": "allow"},
        ],
    }


def probe_plan(rules: int) -> list[dict[str, Any]]:
    probes = [{"from": "x/client", "to": "x/server", "port": PROBE_PORT, "protocol": "TCP",
               "expect": "allow"}]
    if rules:
        probes.append({"from": "x/other", "to": "x/server", "port": PROBE_PORT,
                       "protocol": "TCP", "expect": "deny"})
    return probes


@dataclass
class PointResult:
    """One (dataplane, rule count): the measurements, or why there are none."""

    rates: list[float] = field(default_factory=list)
    wrk_errors: int = 0
    latency_p50_us: float = 0.0
    latency_p99_us: float = 0.0
    throughput_gbit_s: float = 0.0
    failed: str | None = None


@dataclass(frozen=True)
class ComparePlan:
    rule_counts: Sequence[int] = RULE_COUNTS
    dataplanes: Sequence[str] = DATAPLANES
    samples: int = 5
    sample_seconds: int = SAMPLE_SECONDS
    tool_seconds: int = TOOL_SECONDS

    @classmethod
    def quick(cls) -> ComparePlan:
        return cls(rule_counts=QUICK_RULE_COUNTS, samples=1, sample_seconds=1, tool_seconds=1)


def _agent_errors(lab: Any, limit: int = 3) -> str:
    """The last ERROR/WARNING lines of the lab agents' logs (why a policy did not go in)."""
    run_dir = getattr(lab.agents, "run_dir", None)
    if run_dir is None:
        return ""
    lines: list[str] = []
    for log in sorted(run_dir.glob("*.agent.log")):
        lines += [line.strip() for line in log.read_text(errors="replace").splitlines()
                  if "ERROR" in line or "WARNING" in line]
    return " | ".join(line[-300:] for line in lines[-limit:])


def _measure_point(lab: Any, rules: int, plan: ComparePlan) -> PointResult:
    from pyfelix.lab import traffic
    from pyfelix.lab.scenario import parse_scenario

    if rules:
        lab.apply_resources(policy_documents(rules))
    lab.wait_in_sync(SYNC_TIMEOUT_S)
    checks = parse_scenario({**scenario_data(), "probes": probe_plan(rules)},
                            source="<dataplane-compare>").steps[0].probes
    # The lab's in-sync check can pass while a large policy is still between the datastore
    # and the kernel (an idle agent counts as in sync once NO_UPDATE_GRACE_S passed without
    # a newer update): the probes decide, retried for up to PROBE_SETTLE_S.
    deadline = time.monotonic() + PROBE_SETTLE_S
    while True:
        wrong = [r for r in lab.run_probes(checks) if r.mismatch]
        if not wrong or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if wrong:
        verdicts = "; ".join(f"{r.probe.source} -> {r.probe.target}:{r.probe.port} expected "
                             f"{r.probe.expect}, got {r.result} ({r.detail})" for r in wrong)
        errors = _agent_errors(lab)
        return PointResult(failed=f"policy with {rules} rules not enforced as written "
                                  f"({verdicts})" + (f"; agent: {errors}" if errors else ""))
    client = lab.topology.pods["x/client"].netns
    server_ip = str(lab.scenario.pod("x/server").ip)
    out = PointResult()
    traffic.run_wrk(client, server_ip, 1, WRK_CONNECTIONS)  # warm up
    for _ in range(plan.samples):
        run = traffic.run_wrk(client, server_ip, plan.sample_seconds, WRK_CONNECTIONS)
        out.rates.append(run.requests_per_s)
        out.wrk_errors += run.errors
    latency = traffic.run_sockperf(client, server_ip, plan.tool_seconds)
    out.latency_p50_us, out.latency_p99_us = latency.p50_us, latency.p99_us
    out.throughput_gbit_s = traffic.run_iperf3(client, server_ip, plan.tool_seconds).gbit_per_s
    return out


def measure_dataplane(dataplane: str, plan: ComparePlan) -> dict[int, PointResult]:
    """One lab for `dataplane`; every rule count of the plan measured in it, in order."""
    from pyfelix.lab import traffic
    from pyfelix.lab.agents import AgentProcesses
    from pyfelix.lab.netns import write_sysctl
    from pyfelix.lab.runner import LabRunner
    from pyfelix.lab.scenario import parse_scenario

    traffic.require_tools()
    scenario = parse_scenario(scenario_data(), source="<dataplane-compare>")
    points: dict[int, PointResult] = {}
    with LabRunner(scenario, agents=AgentProcesses(dataplane), program_routes=False,
                   probe_timeout=1.0,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        lab.build()
        client = lab.topology.pods["x/client"].netns
        # many short connections: more ports before a tuple is reused (the lab's probes
        # bind ports below 30000, so they never share a tuple with wrk's)
        write_sysctl(client, "net.ipv4.ip_local_port_range", "30000 65535")
        lab.start_agents()
        server = lab.topology.pods["x/server"].netns
        with traffic.TrafficServers(server, str(scenario.pod("x/server").ip)):
            for rules in plan.rule_counts:
                points[rules] = _measure_point(lab, rules, plan)
    return points


def compare(plan: ComparePlan, ctx: BenchContext | None = None) -> Figures:
    """Run the plan on every dataplane; figures as in the module docstring."""
    figures: Figures = {f"rules_{n}": n for n in plan.rule_counts}
    measured: dict[str, dict[int, PointResult]] = {}
    for dataplane in plan.dataplanes:
        measured[dataplane] = measure_dataplane(dataplane, plan)
        for rules, point in measured[dataplane].items():
            key = f"{dataplane}_{rules}"
            if point.failed is not None:
                if ctx is not None:
                    ctx.note(key, f"FAILED: {point.failed}")
                continue
            figures.update(Stat.of(point.rates).figures(f"{dataplane}_new_conn_per_s_{rules}"))
            figures[f"{dataplane}_new_conn_errors_{rules}"] = point.wrk_errors
            figures[f"{dataplane}_latency_p50_us_{rules}"] = point.latency_p50_us
            figures[f"{dataplane}_latency_p99_us_{rules}"] = point.latency_p99_us
            figures[f"{dataplane}_throughput_gbit_s_{rules}"] = point.throughput_gbit_s
    for rules in plan.rule_counts:
        bpf = figures.get(f"bpf_new_conn_per_s_{rules}")
        iptables = figures.get(f"iptables_new_conn_per_s_{rules}")
        if bpf and iptables:
            figures[f"bpf_over_iptables_new_conn_rate_{rules}"] = bpf / iptables
        base = figures.get("bpf_throughput_gbit_s_0")
        here = figures.get(f"bpf_throughput_gbit_s_{rules}")
        if rules and base and here:
            figures[f"bpf_throughput_{rules}_over_0"] = here / base
    return figures


@benchmark("dataplane-compare",
           description="real traffic (wrk, sockperf, iperf3) at 0/1,000/10,000 rules: "
                       "BPF vs iptables")
def dataplane_compare(ctx: BenchContext) -> Figures:
    if os.geteuid() != 0:
        raise PermissionError("dataplane-compare needs root (lab namespaces, BPF, iptables)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    plan = ComparePlan.quick() if quick else ComparePlan(samples=max(1, ctx.settings.repeats))
    return compare(plan, ctx)

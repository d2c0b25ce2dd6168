"""Benchmark `agent-memory`: the agent process's resident memory per remote endpoint.

Setup: a lab (`LabRunner` + `AgentProcesses`, as `pyfelix lab run --typha` does) with one
node and one local pod, the agent in `DATAPLANE` mode reading the datastore through Typha
(how agents run at scale, and what keeps the datastore backend's own caches out of the
agent's figure). A GlobalNetworkPolicy on the local pod allows ingress from two label
selectors that match part of the remote pods (so IP sets carry members, as in a cluster).
Then remote pods (Kubernetes Pods on `REMOTE_NODES` other nodes, with Node documents, a
few realistic labels and the Calico pod-IP annotation) are added in `STEPS` up to
`remote_endpoints`, written as `kind: List` files of `PODS_PER_FILE` (renamed into
place); after each step the lab waits until the agent is in sync and idle, and `SETTLE_S`
more, then samples the agent's VmRSS from /proc `RSS_SAMPLES` times and keeps the median.

Figures:
- `agent_rss_mb_<N>`: the agent's RSS with N remote endpoints (N = 0 and each step);
- `kib_per_remote_endpoint`: the least-squares slope of RSS against N, in KiB per
  endpoint (target: <= 5 KiB; Cilium publishes 10.5 KiB per pod);
- `agent_rss_mb_per_1000_remote_endpoints`: the same slope per 1,000 endpoints, in MiB;
- `remote_endpoints`: the largest N.
RSS is what the kernel says the process holds; Python returns freed memory to the system
lazily, so the slope includes the allocator's slack after the bursts of parsing.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from pyfelix.bench.registry import BenchContext, Figures, benchmark

DATAPLANE = "bpf"
REMOTE_NODES = 100
RSS_SAMPLES = 5
STEPS = (5_000, 10_000, 20_000, 30_000)
QUICK_STEPS = (200, 500)
SYNC_TIMEOUT_S = 300.0
# a `kind: List` file is one document to the input limits (3 MiB): 1,000 pods is ~0.5 MiB
PODS_PER_FILE = 1000
SETTLE_S = 3.0  # after in-sync, before sampling (the agent's post-sync housekeeping)


def remote_pod(index: int) -> dict[str, Any]:
    """A remote Kubernetes Pod as a cluster holds it (the fields the agent reads)."""
    ip = f"10.70.{index // 250}.{index % 250 + 1}"
    app = f"app-{index % 100}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{app}-{index:06d}", "namespace": f"ns-{index % 20}",
                         "labels": {"app": app, "tier": ("web", "api", "db")[index % 3],
                                    "pod-template-hash": f"{index * 2654435761 % 16**10:010x}"},
                         "annotations": {"cni.projectcalico.org/podIP": f"{ip}/32"}},
            "spec": {"nodeName": f"remote-{index % REMOTE_NODES}",
                     "containers": [{"name": "main", "ports": [{"containerPort": 8080,
                                                                "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def cluster_documents() -> list[dict[str, Any]]:
    """Remote Nodes, the remote pods' namespaces, and the local pod's policy."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "projectcalico.org/v3", "kind": "Node",
         "metadata": {"name": f"remote-{n}"},
         "spec": {"bgp": {"ipv4Address": f"198.18.{2 + n // 250}.{n % 250 + 1}/15"}}}
        for n in range(REMOTE_NODES)]
    docs += [{"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": f"ns-{n}",
                           "labels": {"kubernetes.io/metadata.name": f"ns-{n}"}}}
             for n in range(20)]
    docs.append({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
                 "metadata": {"name": "local-ingress"},
                 "spec": {"selector": "role == 'local'", "types": ["Ingress"],
                          "ingress": [{"action": "Allow", "source":
                                       {"selector": "tier == 'web'"}},
                                      {"action": "Allow", "protocol": "TCP", "source":
                                       {"selector": "app in {'app-1', 'app-2'}"},
                                       "destination": {"ports": [8080]}}]}})
    return docs


def scenario_data() -> dict[str, Any]:
    return {"name": "agent-memory", "namespaces": [{"name": "x"}],
            "pods": [{"namespace": "x", "name": "local", "labels": {"role": "local"}}]}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def sampled_rss_kib(pid: int, samples: int = RSS_SAMPLES) -> float:
    values = []
    for _ in range(samples):
        values.append(rss_kib(pid))
        time.sleep(0.2)
    return float(statistics.median(values))


def slope(points: dict[int, float]) -> float:
    """Least-squares slope of y against x."""
    xs = list(points)
    mean_x = statistics.fmean(xs)
    mean_y = statistics.fmean(points.values())
    var = sum((x - mean_x) ** 2 for x in xs)
    if not var:
        raise ValueError("need at least two different x values")
    return sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / var


def _write_list(directory: Path, staging: Path, name: str, docs: list[dict[str, Any]]) -> None:
    staged = staging / name
    staged.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    os.rename(staged, directory / name)


def measure(steps: tuple[int, ...]) -> dict[int, float]:
    """{N remote endpoints: agent RSS in KiB}, N = 0 and each step."""
    from pyfelix.lab.agents import AgentProcesses
    from pyfelix.lab.runner import LabRunner
    from pyfelix.lab.scenario import parse_scenario

    scenario = parse_scenario(scenario_data(), source="<agent-memory>")
    agents = AgentProcesses(DATAPLANE, typha=True)
    rss: dict[int, float] = {}
    with LabRunner(scenario, agents=agents, program_routes=False,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        lab.build()
        lab.start_agents()
        lab.apply_resources(cluster_documents())
        lab.wait_in_sync(SYNC_TIMEOUT_S)
        node = next(iter(lab.topology.nodes))
        pid = agents.processes[f"agent:{node}"].pid
        staging = lab.state.staging_dir
        time.sleep(SETTLE_S)
        rss[0] = sampled_rss_kib(pid)
        done = 0
        for step in steps:
            for first in range(done, step, PODS_PER_FILE):
                last = min(first + PODS_PER_FILE, step)
                _write_list(lab.datastore_dir, staging, f"bench-remote-{first}.json",
                            [remote_pod(i) for i in range(first, last)])
            done = step
            lab.wait_in_sync(SYNC_TIMEOUT_S)
            time.sleep(SETTLE_S)
            rss[step] = sampled_rss_kib(pid)
    return rss


@benchmark("agent-memory", description="agent RSS per remote endpoint (lab agent via Typha)")
def agent_memory(ctx: BenchContext) -> Figures:
    if os.geteuid() != 0:
        raise PermissionError("agent-memory needs root (lab namespaces, BPF)")
    quick = ctx.settings.repeats <= 3 and ctx.settings.min_sample_seconds < 0.05
    rss = measure(QUICK_STEPS if quick else STEPS)
    per_endpoint_kib = slope(rss)
    figures: Figures = {f"agent_rss_mb_{n}": kib / 1024 for n, kib in rss.items()}
    figures["kib_per_remote_endpoint"] = per_endpoint_kib
    figures["agent_rss_mb_per_1000_remote_endpoints"] = per_endpoint_kib * 1000 / 1024
    figures["remote_endpoints"] = max(rss)
    return figures

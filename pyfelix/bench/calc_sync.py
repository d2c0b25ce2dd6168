"""Benchmark `calc-sync`: the calc pipeline on a generated cluster, from nothing to in-sync,
then under steady endpoint churn.

The cluster (`generate_cluster`, deterministic; `scale` shrinks it for tests): 10,000 pods
on 500 nodes (20 on the local node `node-000`) in 50 namespaces, as Kubernetes Pods and
Namespaces; 1,000 policies (300 Kubernetes NetworkPolicies, half for whole namespaces,
with pod and namespace selectors and named or numeric ports; 400 Calico NetworkPolicies,
half for whole namespaces, with rule selectors, named ports and notSelectors; 300
GlobalNetworkPolicies by tier, a third limited by namespaceSelector, with rule namespace
selectors, network-set selectors and nets); 200 network sets (half global, half
namespaced); 500 Nodes with BGP addresses, one IPPool, 500 BlockAffinities. Policies are
broad enough that about half of them apply on the local node, so hundreds of IP sets are
active and the selector index does real work.

Figures:
- `seconds_to_in_sync`: raw documents -> validator (with Kubernetes conversion) -> calc
  graph -> event sequencer -> a dataplane model, until `InSync` is sent (median of repeats,
  a fresh pipeline each time). Target (issue 3): <= 5 s.
- `endpoint_updates_per_s`: after in-sync, pods change labels or addresses (mostly on
  remote nodes, as in a real cluster), flushed every `CHURN_BATCH` updates. Target: >= 5,000.
  As in the agent, `agent.gc_policy` settles once in sync (the state is frozen out of the
  cyclic collector; unfrozen again after the measurement).
- `rss_mb`: peak resident memory of a CHILD process that generates the cluster and runs it
  to in-sync (so the figure is the pipeline's, not the benchmark runner's); beside it
  `rss_baseline_mb`, the same child's peak after imports and generation only. Target: <= 300.
- `naive_seconds_to_in_sync` (one run): the same in-sync with the IP-set index in naive
  all-pairs mode (every selector against every endpoint); `selector_evaluations` and
  `naive_selector_evaluations` count the evaluations each mode performed.
- counts: `endpoints`, `local_endpoints`, `policies`, `network_sets`; after in-sync
  `active_policies` (on the local node), `ip_sets`, `messages_to_in_sync`.
"""

from __future__ import annotations

import gc
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.calc import CalcPipeline, ExpectedDataplane
from pyfelix.agent.gc_policy import GcPolicy
from pyfelix.agent.syncer.api import RawUpdate, SyncStatus, key_of
from pyfelix.bench.registry import BenchContext, Figures, benchmark

LOCAL_NODE = "node-000"
NODES = 500
PODS_PER_NODE = 20
NAMESPACES = 50
APPS = 200
K8S_POLICIES = 300
CALICO_POLICIES = 400
GLOBAL_POLICIES = 300
NETWORK_SETS = 200
CHURN_BATCH = 50
TIERS = ("web", "api", "db", "cache")

Doc = dict[str, Any]


@dataclass
class Cluster:
    docs: list[Doc]
    pods: list[Doc]
    endpoints: int
    local_endpoints: int
    policies: int
    network_sets: int

    def updates(self) -> list[RawUpdate]:
        return [RawUpdate(key_of(d), d, "bench") for d in self.docs]


def _pod_ip(node_index: int, slot: int) -> str:
    return f"10.{64 + node_index // 256}.{node_index % 256}.{slot + 2}"


def _pod(ns: str, name: str, node: str, ip: str, labels: dict[str, str],
         ports: list[tuple[str, int]]) -> Doc:
    container: Doc = {"name": "main", "image": "app"}
    if ports:
        container["ports"] = [{"name": n, "containerPort": p} for n, p in ports]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def generate_cluster(scale: float = 1.0, seed: int = 7) -> Cluster:
    """The benchmark's cluster; `scale` < 1 shrinks every count (for tests)."""
    rng = random.Random(seed)
    nodes = max(2, int(NODES * scale))
    namespaces = max(2, int(NAMESPACES * scale))
    apps = max(4, int(APPS * scale))
    docs: list[Doc] = [{"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
                        "metadata": {"name": "pool"},
                        "spec": {"cidr": "10.64.0.0/10", "natOutgoing": True}}]
    for n in range(nodes):
        name = f"node-{n:03d}"
        docs.append({"apiVersion": "projectcalico.org/v3", "kind": "Node",
                     "metadata": {"name": name},
                     "spec": {"bgp": {"ipv4Address": f"198.18.{n // 256}.{n % 256}/15"}}})
        docs.append({"apiVersion": "projectcalico.org/v3", "kind": "BlockAffinity",
                     "metadata": {"name": f"{name}-block"},
                     "spec": {"node": name, "state": "confirmed",
                              "cidr": f"10.{64 + n // 256}.{n % 256}.0/26"}})
    for i in range(namespaces):
        docs.append({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": f"ns-{i:02d}", "labels": {
                         "team": f"team-{i % 10}", "env": "prod" if i % 3 else "dev"}}})
    pods = []
    for n in range(nodes):
        for slot in range(PODS_PER_NODE):
            index = n * PODS_PER_NODE + slot
            app = f"app-{rng.randrange(apps)}"
            labels = {"app": app, "tier": TIERS[index % len(TIERS)],
                      "version": f"v{index % 3}", "pod-template-hash": f"{index:08x}"}
            ports = [("http", 8080)] if index % 2 else []
            if index % 5 == 0:
                ports.append(("metrics", 9090))
            pods.append(_pod(f"ns-{index % namespaces:02d}", f"pod-{index:05d}",
                             f"node-{n:03d}", _pod_ip(n, slot), labels, ports))
    docs += pods
    network_sets = max(2, int(NETWORK_SETS * scale))
    for i in range(network_sets):
        nets = [f"172.{16 + i % 16}.{i}.0/24", f"192.0.{i % 256}.{i % 8 * 32}/27"]
        labels = {"kind": f"ext-{i % 20}", "role": "external"}
        if i % 2:
            docs.append({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet",
                         "metadata": {"name": f"gns-{i}", "labels": labels},
                         "spec": {"nets": nets}})
        else:
            docs.append({"apiVersion": "projectcalico.org/v3", "kind": "NetworkSet",
                         "metadata": {"name": f"ns-set-{i}", "labels": labels,
                                      "namespace": f"ns-{i % namespaces:02d}"},
                         "spec": {"nets": nets}})
    policies = _policies(rng, scale, namespaces, apps)
    docs += policies
    return Cluster(docs=docs, pods=pods, endpoints=len(pods),
                   local_endpoints=sum(1 for p in pods if p["spec"]["nodeName"] == LOCAL_NODE),
                   policies=len(policies), network_sets=network_sets)


def _policies(rng: random.Random, scale: float, namespaces: int, apps: int) -> list[Doc]:
    out: list[Doc] = []

    def app() -> str:
        return f"app-{rng.randrange(apps)}"

    def ns() -> str:
        return f"ns-{rng.randrange(namespaces):02d}"

    for i in range(max(1, int(K8S_POLICIES * scale))):
        peer: Doc = {"podSelector": {"matchLabels": {"app": app()}}}
        if i % 3 == 0:
            peer["namespaceSelector"] = {"matchLabels": {"team": f"team-{i % 10}"}}
        port: Doc = {"port": "http"} if i % 2 else {"port": 5432, "protocol": "TCP"}
        pod_selector = {"matchLabels": {"app": app()}} if i % 2 else {}  # {}: whole namespace
        out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": f"knp-{i}", "namespace": ns()},
                    "spec": {"podSelector": pod_selector,
                             "ingress": [{"from": [peer], "ports": [port]}]}})
    for i in range(max(1, int(CALICO_POLICIES * scale))):
        ingress: Doc = {"action": "Allow", "protocol": "TCP",
                        "source": {"selector": f"tier == 'web' && app == '{app()}'"},
                        "destination": {"ports": [8080, "http"]}}
        egress: Doc = {"action": "Allow", "protocol": "TCP",
                       "destination": {"selector": f"app == '{app()}'", "ports": ["metrics"]}}
        if i % 4 == 0:
            ingress["source"]["notSelector"] = "version == 'v0'"
        out.append({"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
                    "metadata": {"name": f"cnp-{i}", "namespace": ns()},
                    "spec": {"selector": "all()" if i % 2 else f"app == '{app()}'",
                             "order": rng.randrange(1000),
                             "ingress": [ingress], "egress": [egress]}})
    for i in range(max(1, int(GLOBAL_POLICIES * scale))):
        spec: Doc = {"order": rng.randrange(100), "selector": f"tier == '{TIERS[i % len(TIERS)]}'"}
        if i % 3 == 0:
            spec["namespaceSelector"] = "env == 'prod'"
        spec["egress"] = [
            {"action": "Allow", "destination": {"selector": f"kind == 'ext-{i % 20}'"}},
            {"action": "Deny", "destination": {"nets": ["203.0.113.0/24"]}}]
        spec["ingress"] = [
            {"action": "Allow", "source": {"namespaceSelector": f"team == 'team-{i % 10}'",
                                           "selector": f"app == '{app()}'"}}]
        out.append({"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
                    "metadata": {"name": f"gnp-{i}"}, "spec": spec})
    return out


# --- running ---------------------------------------------------------------------------


def run_to_in_sync(cluster: Cluster, *, naive: bool = False
                   ) -> tuple[CalcPipeline, ExpectedDataplane]:
    state = ExpectedDataplane(strict=False)
    state.record = False
    pipeline = CalcPipeline(LOCAL_NODE, state, naive_ipsets=naive)
    pipeline.feed(cluster.updates(), SyncStatus.IN_SYNC)
    if not state.in_sync or state.violations:
        raise RuntimeError(f"pipeline did not reach in-sync cleanly: {state.violations[:3]}")
    return pipeline, state


def churn_batches(cluster: Cluster, seed: int = 11) -> Iterator[list[RawUpdate]]:
    """Endless batches of pod changes: each pod toggles between its original document and a
    variant with another app label (every other change) or another address."""
    rng = random.Random(seed)
    order = list(range(len(cluster.pods)))
    rng.shuffle(order)
    variants: dict[int, Doc] = {}
    flipped: set[int] = set()
    position = 0
    while True:
        batch = []
        for _ in range(CHURN_BATCH):
            index = order[position % len(order)]
            position += 1
            original = cluster.pods[index]
            if index not in variants:
                variant = json.loads(json.dumps(original))
                if index % 2:
                    variant["metadata"]["labels"]["app"] = f"app-moved-{index % 7}"
                else:
                    prefix, last = variant["status"]["podIP"].rsplit(".", 1)
                    ip = f"{prefix}.{int(last) + 100}"  # still unique, still in the block
                    variant["status"]["podIP"] = ip
                    variant["status"]["podIPs"] = [{"ip": ip}]
                variants[index] = variant
            doc = original if index in flipped else variants[index]
            flipped ^= {index}
            batch.append(RawUpdate(key_of(doc), doc, "churn"))
        yield batch


def _peak_rss_mb() -> float:
    """This process's peak resident set size. From /proc (VmHWM) where possible:
    `getrusage().ru_maxrss` of a child started by (v)fork+exec also counts the PARENT's
    peak from before the exec, which would make the child's figure meaningless."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_rss(scale: float = 1.0) -> dict[str, float]:
    """Run generation + in-sync in a child process; its peak RSS before and after the run."""
    code = ("import json,sys; from pyfelix.bench.calc_sync import _child_rss; "
            "print(json.dumps(_child_rss(float(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, str(scale)], capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child_rss(scale: float) -> dict[str, float]:
    cluster = generate_cluster(scale)
    baseline = _peak_rss_mb()
    run_to_in_sync(cluster)
    return {"rss_mb": _peak_rss_mb(), "rss_baseline_mb": baseline}


def calc_sync_figures(ctx: BenchContext, scale: float = 1.0) -> Figures:
    cluster = generate_cluster(scale)
    last: list[tuple[CalcPipeline, ExpectedDataplane]] = []

    def sync_once() -> None:
        last[:] = [run_to_in_sync(cluster)]

    figures: Figures = ctx.seconds("seconds_to_in_sync", sync_once)
    pipeline, state = last[0]
    figures.update({
        "selector_evaluations": float(pipeline.graph.ipset_index.evaluations),
        "ip_sets": float(len(state.ip_sets)),
        "active_policies": float(len(state.policies)),
        "messages_to_in_sync": float(pipeline.sequencer.messages_sent),
    })
    batches = churn_batches(cluster)

    def churn() -> None:
        churned = last[0][0]
        churned.on_updates(next(batches))
        churned.process_pending()

    GcPolicy().tick(time.monotonic(), in_sync=True)  # what the agent does once in sync
    try:
        figures.update(ctx.rate("endpoint_updates_per_s", churn, ops_per_call=CHURN_BATCH))
    finally:
        gc.unfreeze()
    last.clear()  # free the churned pipeline before the naive run
    del pipeline, state
    started = time.perf_counter()
    naive_pipeline, _ = run_to_in_sync(cluster, naive=True)
    figures["naive_seconds_to_in_sync"] = time.perf_counter() - started
    figures["naive_selector_evaluations"] = float(naive_pipeline.graph.ipset_index.evaluations)
    del naive_pipeline
    figures.update(measure_rss(scale))
    figures.update({
        "endpoints": float(cluster.endpoints),
        "local_endpoints": float(cluster.local_endpoints),
        "policies": float(cluster.policies),
        "network_sets": float(cluster.network_sets),
    })
    return figures


@benchmark("calc-sync", description="Calc pipeline: 10k endpoints to in-sync, then churn")
def calc_sync(ctx: BenchContext) -> Figures:
    return calc_sync_figures(ctx)

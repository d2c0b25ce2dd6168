"""Benchmark `policy-latency`: from a datastore write to the BPF map change, with 1,000
local endpoints.

The pipeline is the agent's, in-process: file datastore (inotify; an atomic rename settles
after 10 ms of quiet) ->
FileSyncer -> CalcPipeline (validator, calc graph, event sequencer) -> DataplaneLoop ->
BpfPolicyManager -> real kernel maps (created with the raw bpf() syscall, unpinned: no BCC
build, nothing attached, no namespace; the maps die with their fds). The node has 1,000
pods (one file each) in one namespace; a GlobalNetworkPolicy applies to all of them.

Two kinds of write, each timed from just before the atomic rename of the file into the
datastore directory to the moment the benchmark sees the kernel map change (polling it
every 0.2 ms through its own fd):
- policy: the GlobalNetworkPolicy's port changes -> every endpoint's ingress chain is
  rebuilt: a new chain is placed (make before break) and the 1,000 endpoint entries are
  repointed; we watch one endpoint's entry.
- label: one pod's label flips in or out of the policy's source selector -> one member of
  the IP set changes; we watch that trie key.

Figures: `p50_ms`, `p99_ms`, `max_ms` (policy writes; target p99 <= 100 ms), `label_p50_ms`,
`label_p99_ms`, `endpoints`, `samples`. With few samples p99 is close to the maximum.
`apply_p50_ms` / `apply_p99_ms`: the BPF manager's apply() alone (compile + diff + map
writes) during those writes: the dataplane's share. The rest is the file datastore's
settle (10 ms of quiet after a complete write, FileSyncer's default) and the calc graph
(~2 ms).
Like the agent, the benchmark applies `agent.gc_policy` once in sync (the long-lived state
is frozen out of the cyclic collector's passes).
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pyfelix.agent import proto as p
from pyfelix.agent.gc_policy import GcPolicy
from pyfelix.bench.map_sync import close_maps, kernel_maps
from pyfelix.bench.registry import BenchContext, Figures, benchmark

NODE = "node-0"
NAMESPACE = "bench"
ENDPOINTS = 1000
POLL_S = 0.0002
CHANGE_TIMEOUT_S = 5.0
MAP_SIZES = {"endpoints": 4096, "ep_counters": 4096, "rules": 8192, "ipsets": 1 << 16}


def pod_name(i: int) -> str:
    return f"pod-{i:04d}"


def pod_doc(i: int, role: str) -> dict[str, Any]:
    ip = f"10.65.{i // 250}.{i % 250 + 2}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(i), "namespace": NAMESPACE,
                         "labels": {"app": f"app-{i % 10}", "role": role}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def policy_doc(port: int) -> dict[str, Any]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "latency"},
            "spec": {"selector": "all()", "types": ["Ingress"], "ingress": [
                {"action": "Allow", "protocol": "TCP", "source": {"selector": "role == 'client'"},
                 "destination": {"ports": [port]}}]}}


class Datastore:
    """A file datastore directory written the way the lab writes it (atomic renames)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "datastore"
        self.staging = root / "staging"
        self.dir.mkdir()
        self.staging.mkdir()

    def write(self, name: str, doc: dict[str, Any]) -> float:
        """Write one document; returns perf_counter() just before it becomes visible."""
        staged = self.staging / name
        staged.write_text(yaml.safe_dump(doc, sort_keys=False))
        started = time.perf_counter()
        os.replace(staged, self.dir / name)
        return started


def wait_change(read: Callable[[], Any], old: Any, started: float) -> float:
    """Seconds from `started` until read() != old (raises after CHANGE_TIMEOUT_S)."""
    while True:
        now = time.perf_counter()
        if read() != old:
            return now - started
        if now - started > CHANGE_TIMEOUT_S:
            raise TimeoutError("the map did not change after the datastore write")
        time.sleep(POLL_S)


class Pipeline:
    """The agent's pipeline over kernel maps (see module docstring)."""

    def __init__(self, datastore: Path, maps: dict[str, Any]) -> None:
        from pyfelix.agent.calc.pipeline import CalcPipeline
        from pyfelix.agent.conversion.k8s import workload_interface_name
        from pyfelix.agent.dataplane.loop import DataplaneLoop
        from pyfelix.agent.dataplane.managers.bpf_policy import BpfPolicyManager
        from pyfelix.agent.datastore import DatastoreLocation, make_syncer

        self.ifindex = {workload_interface_name(NAMESPACE, pod_name(i)): 100 + i
                        for i in range(ENDPOINTS)}
        self.manager = BpfPolicyManager(maps, list_interfaces=lambda: (dict(self.ifindex), {}))
        self.apply_seconds: list[float] = []
        real_apply = self.manager.apply

        def timed_apply() -> None:  # the dataplane's share of each latency
            started = time.perf_counter()
            try:
                real_apply()
            finally:
                self.apply_seconds.append(time.perf_counter() - started)

        self.manager.apply = timed_apply  # type: ignore[method-assign]
        self.loop = DataplaneLoop([self.manager], resync_interval=3600)
        self.pipeline = CalcPipeline(NODE, self.loop.enqueue)
        self.syncer = make_syncer(DatastoreLocation.file(datastore))

    def start(self, timeout: float = 60.0) -> None:
        self.loop.start()
        self.pipeline.start()
        self.syncer.start(self.pipeline)
        if not self.loop.in_sync.wait(timeout):
            raise TimeoutError("the pipeline did not reach in-sync")
        # what the agent's supervision loop does at its first in-sync tick
        GcPolicy().tick(time.monotonic(), in_sync=True)

    def stop(self) -> None:
        self.syncer.stop()
        self.pipeline.stop()
        self.loop.stop()


def run_latency(iterations: int) -> dict[str, Any]:
    maps = kernel_maps(MAP_SIZES)
    with tempfile.TemporaryDirectory(prefix="pyfelix-latency-") as tmp:
        store = Datastore(Path(tmp))
        store.write("namespace.yaml", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": NAMESPACE}})
        for i in range(ENDPOINTS):
            store.write(f"pod-{i:04d}.yaml", pod_doc(i, "client" if i % 2 else "server"))
        store.write("policy.yaml", policy_doc(1000))
        pipeline = Pipeline(store.dir, maps)
        try:
            pipeline.start()
            return _measure(pipeline, store, maps, iterations)
        finally:
            pipeline.stop()
            close_maps(maps)
            gc.unfreeze()  # Pipeline.start() froze the state as the agent would


def _measure(pipeline: Pipeline, store: Datastore, maps: dict[str, Any],
             iterations: int) -> dict[str, Any]:
    from pyfelix.agent.bpf.maps import endpoints as endpoints_map
    from pyfelix.agent.bpf.maps import ipsets as ipsets_map
    from pyfelix.agent.bpf.maps.base import BpfMap
    from pyfelix.agent.bpf.maps.ids import IdKind
    from pyfelix.agent.conversion.k8s import workload_interface_name

    watch_key = endpoints_map.encode_key(pipeline.ifindex[workload_interface_name(
        NAMESPACE, pod_name(0))])
    endpoints = BpfMap(maps["endpoints"].params, os.dup(maps["endpoints"].fd))
    ipsets = BpfMap(maps["ipsets"].params, os.dup(maps["ipsets"].fd))
    try:
        if endpoints.lookup(watch_key) is None:
            raise RuntimeError(f"policy-latency: endpoint not programmed: "
                               f"{pipeline.manager.problems()[:3]}")
        policy_ms = []
        pipeline.apply_seconds.clear()
        for i in range(iterations):
            old = endpoints.lookup(watch_key)
            started = store.write("policy.yaml", policy_doc(1001 + i))
            policy_ms.append(1000 * wait_change(lambda: endpoints.lookup(watch_key), old,
                                                started))
            time.sleep(0.02)
        policy = pipeline.manager.state.policies[p.PolicyID("default", "latency")]
        set_name = policy.inbound_rules[0].src_ip_set_ids[0]
        assert pipeline.manager.compiler is not None
        number = pipeline.manager.compiler.set_ids.get(set_name, IdKind.IPSET)
        assert number is not None
        member_key = ipsets_map.member_key(number, "10.65.0.2/32")  # pod 0 (role server)
        assert member_key is not None
        label_ms = []
        for i in range(iterations):
            old = ipsets.lookup(member_key)
            started = store.write("pod-0000.yaml", pod_doc(0, "client" if i % 2 == 0
                                                           else "server"))
            label_ms.append(1000 * wait_change(lambda: ipsets.lookup(member_key), old,
                                               started))
            time.sleep(0.02)
    finally:
        endpoints.close()
        ipsets.close()
    return {"policy_ms": policy_ms, "label_ms": label_ms,
            "apply_ms": [1000 * s for s in pipeline.apply_seconds]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@benchmark("policy-latency", description="datastore write -> BPF map change, 1,000 endpoints")
def policy_latency(ctx: BenchContext) -> Figures:
    if os.geteuid() != 0:
        raise PermissionError("policy-latency needs root (BPF maps)")
    iterations = 10 if ctx.settings.repeats <= 3 else 60
    result = run_latency(iterations)
    policy, label = result["policy_ms"], result["label_ms"]
    return {
        "p50_ms": statistics.median(policy),
        "p99_ms": percentile(policy, 0.99),
        "max_ms": max(policy),
        "label_p50_ms": statistics.median(label),
        "label_p99_ms": percentile(label, 0.99),
        "apply_p50_ms": statistics.median(result["apply_ms"]),
        "apply_p99_ms": percentile(result["apply_ms"], 0.99),
        "endpoints": ENDPOINTS,
        "samples": len(policy),
    }

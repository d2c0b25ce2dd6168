"""LabRunner: build a scenario in namespaces, run its steps, always tear it down.

Role: the lab's orchestration and its hook for the agents. The life of a run:

    sweep stale runs -> lock run dir -> build topology -> start servers -> write topology to
    the datastore -> start agents -> for each step: apply/delete resources, wait in sync,
    probe -> [what the agents' flow logs said of each probe: `collect_flows`] -> [hold] ->
    teardown (servers, agents, leftover processes, namespaces, bpffs dir,
    run dir)

Inputs: a `Scenario`, a `NodeAgents` implementation (default `NoAgents`), switches for who
programs node routes (`program_routes`) and whether cross-node routes are static
(`static_cross_node_routes`, until BIRD provides them), the probe timeout, how long to
wait for the agents' sync (`sync_timeout`, 60 s; longer on an emulated CPU).
Outputs: `ProbeResult`s and a `LabReport` with timings; `topology` (namespace names, node
underlay IPs, interface names) and `datastore_dir` for agents, BIRD and tests.

Invariants:
- Use it as a context manager: `__exit__` tears down on success, exception, and on
  SIGINT/SIGTERM. While the runner is active in the main thread, a first signal is recorded
  and turned into `LabInterrupted` at the next phase boundary (every phase is bounded: build,
  each step, each probe batch, each poll of the in-sync wait and of `hold`); a second signal
  raises at once. Signals arriving during teardown are ignored so teardown completes.
- Only the process that created the runner tears down or raises `LabInterrupted`: pyroute2
  forks short-lived children (to open sockets in namespaces) that inherit the Python signal
  handler and the whole stack; a signal there must end the child, not run a teardown in it.
- Teardown is idempotent and keeps going past errors; it collects them and raises
  `LabTeardownError` only after everything it could remove is removed.
- With `NoAgents` nothing enforces policy: every probe to a listening port is `allow`.

The agent hook: `NodeAgents.start(topology, datastore_dir, bpffs_dir)` is called once the
topology and the topology documents exist; `is_in_sync()` is polled (bounded) after each
step's datastore writes; `stop()` first thing in teardown. A real implementation starts
`ip netns exec <node netns> pyfelix agent --datastore <datastore_dir> --hostname <node>`
(and confd + BIRD when there are several nodes), pinning under `bpffs_dir`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol

from pyfelix.lab import naming
from pyfelix.lab.datastore import LabDatastore, topology_documents
from pyfelix.lab.flows import ProbeWindow, decided, flows_for, read_records
from pyfelix.lab.probe import DEFAULT_TIMEOUT_SECONDS, Prober, ProbeResult
from pyfelix.lab.runstate import RunState, remove_run_kernel_objects, sweep_stale_runs
from pyfelix.lab.scenario import (
    EXTERNAL_SOURCE,
    NODE_PREFIX,
    ProbeSpec,
    ResourceRef,
    Scenario,
    Step,
)
from pyfelix.lab.servers import PodServers
from pyfelix.lab.services import (
    MANAGED_BY_LAB,
    MANAGED_BY_LABEL,
    KubeProxyRules,
    frontends_for,
    generated_slices,
)
from pyfelix.lab.topology import LabTopology, TopologyBuilder, plan_topology

DEFAULT_SYNC_TIMEOUT_SECONDS = 60.0
HOLD_POLL_SECONDS = 0.2
SYNC_POLL_SECONDS = 0.1
# the lab agents flush flow logs every second; the wait ends as soon as every probe has its
# deciding record. A probe whose record never matches (a Service VIP: records name the
# backend) waits the whole bound, so it stays short here; the demo, whose probes are all
# pod to pod, passes a longer one (lab.demo)
FLOW_WAIT_SECONDS = 5.0


class LabInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a lab was running."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class LabSyncTimeout(TimeoutError):
    """The agents did not report in-sync in time."""


class LabTeardownError(RuntimeError):
    def __init__(self, run_id: str, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(f"lab {run_id}: teardown incomplete:\n  " + "\n  ".join(errors))


class NodeAgents(Protocol):
    """How the lab runs the agent (and later confd + BIRD) in each node namespace."""

    @property
    def enforces_policy(self) -> bool: ...

    def start(self, topology: LabTopology, datastore_dir: Path, bpffs_dir: Path) -> None: ...

    def is_in_sync(self) -> bool: ...

    def stop(self) -> None: ...

    def describe(self) -> dict[str, Any] | None:
        """How the agents run (dataplane, datastore URL, ...), for the JSON report."""
        ...


class NoAgents:
    """No agent runs: nothing reads the datastore and nothing enforces policy."""

    enforces_policy = False

    def start(self, topology: LabTopology, datastore_dir: Path, bpffs_dir: Path) -> None:
        return None

    def is_in_sync(self) -> bool:
        return True

    def stop(self) -> None:
        return None

    def describe(self) -> dict[str, Any] | None:
        return None


@dataclass
class LabReport:
    scenario: str
    run_id: str
    enforces_policy: bool
    results: list[ProbeResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    agents: dict[str, Any] | None = None  # how the agents ran (AgentProcesses.describe())

    @property
    def mismatches(self) -> list[ProbeResult]:
        return [r for r in self.results if r.mismatch]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "probes": [r.to_json() for r in self.results],
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }
        if self.agents is not None:
            out["agents"] = self.agents
        return out


class LabRunner:
    """One lab run. Not reusable: build once, tear down once."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        agents: NodeAgents | None = None,
        dataplane: str | None = None,
        program_routes: bool = True,
        static_cross_node_routes: bool = False,
        probe_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        sync_timeout: float = DEFAULT_SYNC_TIMEOUT_SECONDS,
        interface_prefix: str = naming.DEFAULT_INTERFACE_PREFIX,
        state_root: Path = naming.RUN_STATE_ROOT,
        bpffs_root: Path = naming.BPFFS_ROOT,
        sweep_first: bool = True,
        handle_signals: bool = True,
        run_id: str | None = None,
    ) -> None:
        self.scenario = scenario
        self.agents: NodeAgents = agents if agents is not None else NoAgents()
        self.dataplane = dataplane
        self.program_routes = program_routes
        self.static_cross_node_routes = static_cross_node_routes
        self.sync_timeout = sync_timeout
        self.run_id = run_id or naming.new_run_id()
        self.bpffs_root = bpffs_root
        self.sweep_first = sweep_first
        self.handle_signals = handle_signals
        self.state = RunState(self.run_id, state_root)
        self.topology = plan_topology(self.run_id, scenario, interface_prefix)
        self.datastore = LabDatastore(self.state.datastore_dir, self.state.staging_dir)
        self.servers = PodServers()
        # probe sources: pods, `node/NAME` (host-networked) and `external` (the underlay)
        sources = {key: pod.netns for key, pod in self.topology.pods.items()}
        sources.update({f"{NODE_PREFIX}{name}": node.netns
                        for name, node in self.topology.nodes.items()})
        sources[EXTERNAL_SOURCE] = self.topology.underlay_netns
        self.prober = Prober(sources, timeout=probe_timeout)
        self.report = LabReport(scenario.name, self.run_id, self.agents.enforces_policy)
        self._owner_pid = os.getpid()
        self._previous_handlers: dict[int, Any] = {}
        self._tearing_down = False
        self._torn_down = False
        self._interrupted_by: int | None = None
        self._kube_proxy_rendered = False
        # wall-clock window of each probe batch: (first result index, end index, window)
        self._probe_windows: list[tuple[int, int, ProbeWindow]] = []

    # --- context manager and signals -------------------------------------------------------

    @property
    def datastore_dir(self) -> Path:
        return self.state.datastore_dir

    @property
    def bpffs_dir(self) -> Path:
        return naming.run_bpffs_dir(self.run_id, self.bpffs_root)

    @property
    def timings(self) -> dict[str, float]:
        return self.report.timings

    def __enter__(self) -> LabRunner:
        self._install_signal_handlers()
        try:
            if self.sweep_first:
                with self._timed("sweep_s"):
                    sweep_stale_runs(self.state.root, self.bpffs_root)
            self.state.acquire()
        except BaseException:
            self._restore_signal_handlers()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.teardown()
        finally:
            self._restore_signal_handlers()

    def _install_signal_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked child (pyroute2 forks to enter namespaces) inherits this handler; it
            # must die quietly, not unwind the parent's copied stack into a teardown.
            os._exit(128 + signum)
        if self._tearing_down or self._torn_down:
            return  # let teardown finish; it is bounded
        if self._interrupted_by is None:
            # Only remember it: the phase in progress is bounded and the next phase boundary
            # raises. Raising here could land in code that swallows exceptions (at-fork
            # hooks, __del__) and the interrupt would be lost.
            self._interrupted_by = signum
            return
        raise LabInterrupted(signum)  # a second signal: stop waiting for a boundary

    def check_interrupted(self) -> None:
        """Raise `LabInterrupted` if SIGINT/SIGTERM arrived (called at every phase boundary)."""
        if self._interrupted_by is not None and not self._tearing_down:
            raise LabInterrupted(self._interrupted_by)

    # --- phases --------------------------------------------------------------------------

    def build(self) -> LabTopology:
        """Namespaces, underlay, pods, routes, servers; then the topology documents."""
        if not self.state.held:
            raise RuntimeError("use LabRunner as a context manager (with LabRunner(...) as lab)")
        with self._timed("build_s"):
            TopologyBuilder(
                self.topology,
                program_routes=self.program_routes,
                static_cross_node_routes=self.static_cross_node_routes,
            ).build()
            for pod in self.topology.pods.values():
                for port in pod.spec.ports:
                    for address in pod.spec.addresses:
                        self.servers.add(pod.netns, port.port, port.protocol, address.version)
            self.servers.start()
            self.datastore.apply(topology_documents(self.scenario, self.topology))
        self.check_interrupted()
        return self.topology

    def start_agents(self) -> None:
        self.check_interrupted()
        with self._timed("agents_s"):
            self.agents.start(self.topology, self.datastore_dir, self.bpffs_dir)
        self.report.agents = self.agents.describe()
        self.check_interrupted()

    def apply_resources(self, documents: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> None:
        with self._timed("apply_s"):
            self.datastore.apply(documents)

    def delete_resources(self, refs: tuple[ResourceRef, ...] | list[ResourceRef]) -> None:
        with self._timed("apply_s"):
            self.datastore.delete(refs)

    def enter_step(self, step: Step) -> None:
        """Apply `step`'s documents, delete its resources, then wait until in sync.

        Services: the EndpointSlices Kubernetes' controller would make are written with the
        step's documents (`lab.services`); in iptables mode, kube-proxy's rules are
        rendered in every node namespace once the agents are in sync."""
        if step.apply:
            self.apply_resources(step.apply)
        if step.delete:
            self.delete_resources(step.delete)
        self.sync_endpoint_slices()
        self.wait_in_sync()
        if self.dataplane == "iptables":
            self.sync_kube_proxy()

    def sync_endpoint_slices(self) -> None:
        """Write the generated EndpointSlices that changed; remove those no longer made."""
        with self._timed("apply_s"):
            docs = self.datastore.documents()
            current = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d
                       for d in docs if d.get("kind") == "EndpointSlice"
                       and (d["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL)
                       == MANAGED_BY_LAB}
            wanted = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                      for d in generated_slices(docs)}
            changed = [d for k, d in wanted.items() if current.get(k) != d]
            if changed:
                self.datastore.apply(changed)
            gone = [ResourceRef("EndpointSlice", name, namespace)
                    for namespace, name in current.keys() - wanted.keys()]
            if gone:
                self.datastore.delete(gone)

    def sync_kube_proxy(self) -> None:
        """kube-proxy's iptables service rules in every node namespace (iptables mode)."""
        docs = self.datastore.documents()
        if not self._kube_proxy_rendered and not any(d.get("kind") == "Service" for d in docs):
            return  # no Service ever: leave the nodes' tables as the agent made them
        self._kube_proxy_rendered = True
        tables = [KubeProxyRules()]
        if self.scenario.ip_family in ("ipv6", "dual"):
            tables.append(KubeProxyRules("ip6tables"))
        with self._timed("kube_proxy_s"):
            for node in self.topology.nodes.values():
                frontends = frontends_for(docs, node.name)
                for rules in tables:
                    rules.sync(node.netns, frontends)

    def wait_in_sync(self, timeout: float | None = None) -> None:
        """Poll the agents until they report in-sync; `LabSyncTimeout` after `timeout`
        (default: the runner's `sync_timeout`)."""
        timeout = self.sync_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._timed("sync_s"):
            while not self.agents.is_in_sync():
                self.check_interrupted()
                if time.monotonic() >= deadline:
                    raise LabSyncTimeout(f"lab {self.run_id}: agents not in sync after "
                                         f"{timeout:g}s")
                time.sleep(SYNC_POLL_SECONDS)

    def run_probes(
        self, probes: tuple[ProbeSpec, ...] | list[ProbeSpec], step: int = 0
    ) -> list[ProbeResult]:
        self.check_interrupted()
        started = time.time()
        with self._timed("probes_s"):
            results = self.prober.run(list(probes), step)
        self.check_interrupted()
        first = len(self.report.results)
        self._probe_windows.append((first, first + len(results),
                                    ProbeWindow(started, time.time())))
        self.report.results.extend(results)
        return results

    def collect_flows(self, timeout: float = FLOW_WAIT_SECONDS) -> list[ProbeResult]:
        """Attach to every probe result what the nodes' flow logs recorded about it
        (`lab.flows`), waiting up to `timeout` s for the agents' next flushes; a no-op when
        the agents write no flow logs. Returns (and keeps in the report) the results."""
        dirs = list(getattr(self.agents, "flow_log_dirs", {}).values())
        if not dirs:
            return self.report.results
        pod_ips = {key: str(pod.spec.ip) for key, pod in self.topology.pods.items()
                   if pod.spec.has_ipv4}
        pod_ips6 = {key: str(pod.spec.ipv6) for key, pod in self.topology.pods.items()
                    if pod.spec.ipv6 is not None}
        pairs = [(self.report.results[i].probe, window, self.report.results[i].sport)
                 for first, end, window in self._probe_windows for i in range(first, end)]
        deadline = time.monotonic() + timeout
        with self._timed("flows_s"):
            while True:
                flows = flows_for(pairs, pod_ips, read_records(dirs), pod_ips6)
                if all(decided(probe, flow) for (probe, _, _), flow in zip(pairs, flows,
                                                                         strict=True)) \
                        or time.monotonic() >= deadline:
                    break
                self.check_interrupted()
                time.sleep(SYNC_POLL_SECONDS)
        self.report.results = [dataclasses.replace(r, flow=f, flows_collected=True)
                               for r, f in zip(self.report.results, flows, strict=True)]
        return self.report.results

    def run_steps(self) -> list[ProbeResult]:
        """Every step of the scenario in order: apply, delete, wait in sync, probe."""
        results: list[ProbeResult] = []
        for index, step in enumerate(self.scenario.steps):
            self.check_interrupted()
            self.enter_step(step)
            results.extend(self.run_probes(step.probes, index))
        return results

    def hold(self, seconds: float) -> None:
        """Keep the lab up (for inspection) for up to `seconds`; Ctrl-C ends it early."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.check_interrupted()
            time.sleep(min(HOLD_POLL_SECONDS, left))
        self.check_interrupted()

    def teardown(self) -> None:
        """Remove everything of this run (idempotent; continues past errors)."""
        if self._torn_down or os.getpid() != self._owner_pid:
            return  # only the process that built the lab tears it down
        self._tearing_down = True
        errors: list[str] = []
        started = time.monotonic()
        try:
            for what, action in (("stopping agents", self.agents.stop),
                                 ("stopping servers", self.servers.stop)):
                try:
                    action()
                except Exception as exc:
                    errors.append(f"{what}: {exc}")
            if self.state.held:
                _, _, kernel_errors = remove_run_kernel_objects(self.run_id, self.bpffs_root)
                errors.extend(kernel_errors)
                if not kernel_errors:
                    self.state.release()  # kept on errors, so a later sweep retries
        finally:
            self.report.timings["teardown_s"] = time.monotonic() - started
            self._torn_down = True
            self._tearing_down = False
        if errors:
            raise LabTeardownError(self.run_id, errors)

    # --- helpers ------------------------------------------------------------------------

    def _timed(self, key: str) -> _Timer:
        return _Timer(self.report.timings, key)


class _Timer:
    """Adds the elapsed time of a `with` block to timings[key] (accumulates across steps)."""

    def __init__(self, timings: dict[str, float], key: str) -> None:
        self.timings = timings
        self.key = key
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.key] = self.timings.get(self.key, 0.0) + time.monotonic() - self.started


def run_scenario(
    scenario: Scenario,
    *,
    hold_seconds: float = 0.0,
    progress: Callable[[str], None] | None = None,
    **runner_options: Any,
) -> LabReport:
    """Build, start agents, run every step, optionally hold, tear down; return the report.

    `progress(message)` receives one line per phase (the CLI prints them on stderr).
    """
    say = progress or (lambda message: None)
    started = time.monotonic()
    runner = LabRunner(scenario, **runner_options)
    with runner:
        say(f"lab {runner.run_id}: building {len(runner.topology.netns_names)} namespaces "
            f"({len(scenario.nodes)} nodes, {len(scenario.pods)} pods)")
        runner.build()
        runner.start_agents()
        say(f"lab {runner.run_id}: running {len(scenario.steps)} step(s), "
            f"{len(scenario.probes)} probe(s)")
        runner.run_steps()
        runner.collect_flows()
        if hold_seconds > 0:
            say(f"lab {runner.run_id}: holding for {hold_seconds:g}s; namespaces "
                f"{runner.run_id}-*, Ctrl-C to tear down now")
            runner.hold(hold_seconds)
        say(f"lab {runner.run_id}: tearing down")
    runner.report.timings["total_s"] = time.monotonic() - started
    runner.check_interrupted()  # a signal after the last phase boundary still counts
    return runner.report

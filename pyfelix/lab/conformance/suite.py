"""Run the conformance suite on one dataplane: one lab, one agent start, one step per case.

Role: drive `LabRunner` through the planned scenario with real agents:

    build namespaces + pods + servers -> check the lab wrote the world the plan assumed ->
    start one `pyfelix agent` per node (dataplane X; confd + BIRD with several nodes: the
    lab's in-sync then also waits for BGP-learned routes) -> for each case: apply/delete
    its step's documents, wait until the agents are in sync, probe the case's whole matrix,
    re-probe any mismatch once (for the report) -> tear down (always)

Inputs: cases, a dataplane name, probe timeout, worker count, a progress callback.
Outputs: `DataplaneOutcome` (per-case results and timings; `error` when the lab itself failed,
e.g. the agent died: the cases not reached count as not passed).

Invariants: a case passes only when every cell's FIRST verdict equals its expectation; the
re-probe is diagnosis (was it a lasting disagreement or a race?) and never turns a mismatch
into a pass. Ctrl-C (`LabInterrupted`) is re-raised after teardown, not recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyfelix.lab import naming
from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.matrix import DEFAULT_MAX_WORKERS, CellResult, MatrixProber
from pyfelix.lab.conformance.plan import SuitePlan, build_plan, world_documents

if TYPE_CHECKING:
    from pyfelix.lab.conformance.plan import PlannedStep
    from pyfelix.lab.runner import LabRunner, NodeAgents

    AfterStep = Callable[[LabRunner, PlannedStep, list[CellResult]], None]

DEFAULT_PROBE_TIMEOUT = 0.5
REPROBE_PAUSE_S = 1.0
LOG_TAIL_LINES = 15
DATAPLANE_NAMES = ("iptables", "bpf")


@dataclass
class CaseOutcome:
    case: Case
    results: list[CellResult]
    sync_seconds: float
    probe_seconds: float

    @property
    def mismatches(self) -> list[CellResult]:
        return [r for r in self.results if r.mismatch]

    @property
    def passed(self) -> bool:
        return not self.mismatches


@dataclass
class DataplaneOutcome:
    dataplane: str
    planned_cases: int
    planned_probes: int
    nodes: int = 1
    cases: list[CaseOutcome] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    @property
    def cases_passed(self) -> int:
        return sum(1 for c in self.cases if c.passed)

    @property
    def probes(self) -> int:
        return sum(len(c.results) for c in self.cases)

    @property
    def mismatches(self) -> list[tuple[Case, CellResult]]:
        return [(c.case, r) for c in self.cases for r in c.mismatches]

    @property
    def ok(self) -> bool:
        return (self.error is None and self.cases_passed == self.planned_cases
                and not self.mismatches)


def run_dataplane(
    cases: Sequence[Case],
    dataplane: str,
    *,
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    max_workers: int = DEFAULT_MAX_WORKERS,
    interface_prefix: str = naming.DEFAULT_INTERFACE_PREFIX,
    progress: Callable[[str], None] | None = None,
    plan: SuitePlan | None = None,
    agents: NodeAgents | None = None,
    after_step: AfterStep | None = None,
) -> DataplaneOutcome:
    """Run `cases` (or a ready `plan`) on `dataplane`. `agents` replaces the real agents
    (tests use it to show that a lab enforcing nothing fails the suite). `after_step(runner,
    planned, results)` runs after each case is probed, while its policy is in force (the
    explain test asks the nodes about every probe there)."""
    from pyfelix.lab.agents import AgentProcesses

    if agents is None and dataplane not in DATAPLANE_NAMES:
        raise ValueError(f"dataplane must be one of {list(DATAPLANE_NAMES)}, not {dataplane!r}")
    plan = plan or build_plan(cases)
    if agents is None:
        agents = AgentProcesses(dataplane, interface_prefix=interface_prefix)
    run = _DataplaneRun(plan, dataplane, agents, probe_timeout=probe_timeout,
                        max_workers=max_workers, interface_prefix=interface_prefix,
                        say=progress or (lambda message: None), after_step=after_step)
    return run.run()


class _DataplaneRun:
    """One lab, one agent start, one step per planned case."""

    def __init__(self, plan: SuitePlan, dataplane: str, agents: NodeAgents, *,
                 probe_timeout: float, max_workers: int, interface_prefix: str,
                 say: Callable[[str], None], after_step: AfterStep | None = None) -> None:
        from pyfelix.lab.runner import LabRunner

        self.after_step = after_step
        self.plan = plan
        self.dataplane = dataplane
        self.say = say
        self.probe_timeout = probe_timeout
        self.max_workers = max_workers
        self.outcome = DataplaneOutcome(dataplane, len(plan.steps), plan.probe_count,
                                        nodes=len(plan.scenario.nodes))
        self.runner = LabRunner(plan.scenario, agents=agents, dataplane=dataplane,
                                program_routes=not agents.enforces_policy,
                                static_cross_node_routes=not agents.enforces_policy,
                                probe_timeout=probe_timeout, interface_prefix=interface_prefix)

    def run(self) -> DataplaneOutcome:
        from pyfelix.lab.agents import AgentStartError
        from pyfelix.lab.runner import LabSyncTimeout

        started = time.monotonic()
        try:
            with self.runner:
                try:
                    self._build_and_run_steps()
                except (LabSyncTimeout, AgentStartError) as exc:
                    # Before teardown removes the run directory: keep the agents' last words.
                    self.outcome.error = f"{type(exc).__name__}: {exc}{self._agent_log_tails()}"
        except OSError as exc:
            self.outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.outcome.timings = dict(self.runner.timings)
            self.outcome.seconds = time.monotonic() - started
        if self.outcome.error:
            self.say(f"conformance[{self.dataplane}]: lab failed: {self.outcome.error}")
        return self.outcome

    def _build_and_run_steps(self) -> None:
        runner = self.runner
        self.say(f"conformance[{self.dataplane}]: lab {runner.run_id}: building "
                 f"{len(self.plan.scenario.pods)} pods on {len(self.plan.scenario.nodes)} node(s), "
                 "starting the agents")
        runner.build()
        if world_documents(self.plan.scenario, runner.topology) != dict(
                self.plan.base_documents):
            raise RuntimeError("the lab wrote other Namespace/Pod documents than the plan "
                               "assumed (lab.datastore changed?)")
        runner.start_agents()
        prober = MatrixProber({k: p.netns for k, p in runner.topology.pods.items()},
                              timeout=self.probe_timeout, max_workers=self.max_workers)
        for planned, step in zip(self.plan.steps, self.plan.scenario.steps, strict=True):
            runner.check_interrupted()
            step_started = time.monotonic()
            runner.enter_step(step)
            synced = time.monotonic()
            results = prober.run(planned.cells)
            runner.check_interrupted()
            if any(r.mismatch for r in results):
                time.sleep(REPROBE_PAUSE_S)
                results = prober.reprobe(results)
            case_outcome = CaseOutcome(planned.case, results, synced - step_started,
                                       time.monotonic() - synced)
            if self.after_step is not None:
                self.after_step(runner, planned, results)
            self.outcome.cases.append(case_outcome)
            self.say(f"conformance[{self.dataplane}]: {planned.case.name}: "
                     + ("ok" if case_outcome.passed
                        else f"{len(case_outcome.mismatches)} MISMATCH(ES)")
                     + f" ({len(results)} probes, {case_outcome.probe_seconds:.1f}s)")

    def _agent_log_tails(self) -> str:
        agents_dir = self.runner.datastore_dir.parent / "agents"
        logs = sorted([*agents_dir.glob("*.log"), *agents_dir.glob("*.status.json")])
        parts = []
        for log in logs:
            try:
                lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            except OSError:
                continue
            parts.append(f"\n--- {log.name} (last {len(lines)} lines) ---\n" + "\n".join(lines))
        return "".join(parts)


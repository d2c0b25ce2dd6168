"""The built-in demo: probe every pod port from every other pod and tabulate the verdicts.

Role: what `pyfelix lab demo` (and `make demo`) shows. Library side only: the demo scenario
path, the all-pairs probe list, the matrix of results, and `run_demo()`, which runs the lab
with real agents and reports the matrix BEFORE the scenario's policies (only the cluster
documents exist) and AFTER them, plus a dump of every node's BPF maps taken while the lab
is still up; the CLI formats it.

Inputs: a `Scenario` (default: `DEMO_SCENARIO`), then the `ProbeResult`s of running it.
Outputs: a matrix {source pod: {"ns/pod:port/proto": "allow"|"deny"}} per phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyfelix.lab.probe import ProbeResult
from pyfelix.lab.scenario import ProbeSpec, Scenario, Step

DEMO_SCENARIO = Path(__file__).parent / "scenarios" / "demo.yaml"


def matrix_probes(scenario: Scenario) -> tuple[ProbeSpec, ...]:
    """One probe from each pod to each port of every other pod."""
    return tuple(
        ProbeSpec(
            source=source.key,
            target=target.key,
            target_ip=target.ip,
            port=port.port,
            protocol=port.protocol,
        )
        for source in scenario.pods
        for target in scenario.pods
        if target.key != source.key
        for port in target.ports
    )


def with_matrix_probes(scenario: Scenario) -> Scenario:
    """The scenario reduced to one step: its top-level resources, then all-pairs probes."""
    step = Step(apply=scenario.resources, probes=matrix_probes(scenario))
    return dataclasses.replace(scenario, steps=(step,))


def matrix_column(probe: ProbeSpec) -> str:
    return f"{probe.target}:{probe.port}/{probe.protocol}"


def connectivity_matrix(results: Iterable[ProbeResult]) -> dict[str, dict[str, str]]:
    matrix: dict[str, dict[str, str]] = {}
    for result in results:
        matrix.setdefault(result.probe.source, {})[matrix_column(result.probe)] = result.result
    return matrix


DUMPED_MAPS = ("endpoints", "ipsets", "rules")


@dataclass
class DemoReport:
    scenario: Scenario
    dataplane: str
    before: dict[str, dict[str, str]]
    after: dict[str, dict[str, str]]
    map_dumps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def run_demo(scenario: Scenario, *, dataplane: str, probe_timeout: float,
             interface_prefix: str, progress: Callable[[str], None] | None = None) -> DemoReport:
    """Build the lab with one agent per node, probe all pairs, apply the scenario's
    resources, probe again, dump the first node's BPF maps (BPF dataplane), tear down."""
    from pyfelix.lab.agents import AgentProcesses
    from pyfelix.lab.runner import LabRunner

    say = progress or (lambda message: None)
    probes = matrix_probes(scenario)
    agents = AgentProcesses(dataplane, interface_prefix=interface_prefix)
    runner = LabRunner(scenario, agents=agents, dataplane=dataplane, program_routes=False,
                       probe_timeout=probe_timeout, interface_prefix=interface_prefix)
    with runner:
        say(f"demo {runner.run_id}: building {len(scenario.nodes)} nodes, "
            f"{len(scenario.pods)} pods, starting one {dataplane} agent per node")
        runner.build()
        runner.start_agents()
        runner.wait_in_sync()
        say(f"demo {runner.run_id}: probing {len(probes)} pod/port pairs before policy")
        before = connectivity_matrix(runner.run_probes(probes, 0))
        say(f"demo {runner.run_id}: applying {len(scenario.resources)} resource(s)")
        runner.apply_resources(scenario.resources)
        runner.wait_in_sync()
        say(f"demo {runner.run_id}: probing again")
        after = connectivity_matrix(runner.run_probes(probes, 1))
        dumps: dict[str, list[dict[str, Any]]] = {}
        if dataplane == "bpf":
            from pyfelix.agent.bpf.maps import dump_pinned

            for node in scenario.nodes:
                for name in DUMPED_MAPS:
                    dumps[f"{name} on {node}"] = dump_pinned(name,
                                                             str(runner.bpffs_dir / node))
        say(f"demo {runner.run_id}: tearing down")
    return DemoReport(scenario, dataplane, before, after, dumps, dict(runner.report.timings))

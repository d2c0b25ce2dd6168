"""The built-in demo: probe every pod port from every other pod and tabulate the verdicts.

Role: what `pyfelix lab demo` (and `make demo`) shows. Library side only: the demo scenario
path, the all-pairs probe list, and the matrix of results; the CLI formats it.

Inputs: a `Scenario` (default: `DEMO_SCENARIO`), then the `ProbeResult`s of running it.
Outputs: a scenario whose single step applies the scenario's resources and probes all pairs;
a matrix {source pod: {"ns/pod:port/proto": "allow"|"deny"}}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from agent.lab.probe import ProbeResult
from agent.lab.scenario import ProbeSpec, Scenario, Step

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

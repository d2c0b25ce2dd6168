"""The suite as ONE lab scenario in the `steps` form: one step per case.

Role: turn a list of cases into lab steps. Each case's desired datastore content is its
world's Namespace/Pod documents plus its resources; the step into a case is the difference
from the previous case's desired content:

    apply  = documents that are new or changed (a changed policy is an in-place update)
    delete = documents of the previous case that this case does not have

so a `follows` case really is a live update of the state before it, and every other case
starts from the base world plus exactly its own resources.

Inputs: cases; the lab's topology documents (`base_documents`) for the world's pods and
namespaces, so unchanged Pod/Namespace documents are byte-for-byte what the lab wrote.
Outputs: `SuitePlan` = planned steps (case, apply, delete, expected cells) + the `Scenario`
(validated by the lab's own parser) + its YAML-able data (`pyfelix lab run` can run it; it
carries TCP/UDP probes with `expect`, ICMP columns are not in the scenario format).

Invariants: a case never carries two documents with the same (kind, namespace, name); the
first step starts from the base world as the lab built it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyfelix.lab import naming
from pyfelix.lab.conformance.case import Case, check_cases
from pyfelix.lab.conformance.matrix import Cell, expected_cells
from pyfelix.lab.conformance.resources import ref_of
from pyfelix.lab.conformance.world import World, scenario_data
from pyfelix.lab.datastore import topology_documents
from pyfelix.lab.family import apply_ip_family, families
from pyfelix.lab.scenario import ResourceRef, Scenario, parse_scenario
from pyfelix.lab.topology import LabTopology, plan_topology

DocKey = tuple[str, str | None, str]
WORLD_KINDS = ("Namespace", "Pod")


class PlanError(ValueError):
    pass


@dataclass(frozen=True)
class PlannedStep:
    case: Case
    apply: tuple[dict[str, Any], ...]
    delete: tuple[DocKey, ...]
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class SuitePlan:
    steps: tuple[PlannedStep, ...]
    scenario: Scenario
    scenario_data: dict[str, Any]
    base_documents: Mapping[DocKey, dict[str, Any]]

    @property
    def probe_count(self) -> int:
        return sum(len(step.cells) for step in self.steps)


def world_documents(scenario: Scenario, topology: LabTopology) -> dict[DocKey, dict[str, Any]]:
    """The Namespace and Pod documents the lab writes for this scenario and topology."""
    return {ref_of(doc): doc for doc in topology_documents(scenario, topology)
            if doc["kind"] in WORLD_KINDS}


def desired_documents(case: Case, base: Mapping[DocKey, dict[str, Any]]
                      ) -> dict[DocKey, dict[str, Any]]:
    desired = case.world.documents(base)
    for doc in case.resources:
        key = ref_of(doc)
        if key in desired:
            raise PlanError(f"case {case.name!r}: two documents for {key}")
        desired[key] = doc
    return desired


def step_between(previous: Mapping[DocKey, dict[str, Any]],
                 desired: Mapping[DocKey, dict[str, Any]]
                 ) -> tuple[tuple[dict[str, Any], ...], tuple[DocKey, ...]]:
    """(documents to apply, keys to delete) to go from `previous` to `desired`."""
    apply = tuple(doc for key, doc in desired.items() if previous.get(key) != doc)
    delete = tuple(key for key in previous if key not in desired)
    return apply, delete


def plan_steps(cases: Sequence[Case], base: Mapping[DocKey, dict[str, Any]],
               families: Sequence[int] = (4,)) -> list[PlannedStep]:
    problems = check_cases(cases)
    if problems:
        raise PlanError("bad case list:\n  " + "\n  ".join(problems))
    previous = World.base().documents(base)
    steps = []
    for case in cases:
        desired = desired_documents(case, base)
        apply, delete = step_between(previous, desired)
        steps.append(PlannedStep(case, apply, delete,
                                 tuple(expected_cells(case, families))))
        previous = desired
    return steps


def resource_ref(key: DocKey) -> ResourceRef:
    kind, namespace, name = key
    return ResourceRef(kind=kind, name=name, namespace=namespace)


def scenario_with_steps(steps: Sequence[PlannedStep], name: str = "conformance",
                        nodes: int = 1) -> dict[str, Any]:
    data = scenario_data(name, nodes)
    data["steps"] = [
        {
            "apply": [dict(doc) for doc in step.apply],
            "delete": [{"kind": kind, "name": doc_name, **({"namespace": ns} if ns else {})}
                       for kind, ns, doc_name in step.delete],
            "probes": [
                {"from": c.source, "to": c.target, "port": c.column.port,
                 "protocol": c.column.protocol, "expect": c.expect_word}
                for c in step.cells if c.column.port is not None and c.family == 4
            ],
        }
        for step in steps
    ]
    return data


def build_plan(cases: Sequence[Case], name: str = "conformance", nodes: int = 1,
               ip_family: str = "ipv4") -> SuitePlan:
    """Plan the suite on `nodes` nodes (pure: nothing is created; the lab's topology is only
    planned). `ip_family` (lab.family): the pods' addresses, every case's CIDRs and ICMP
    rules are mapped as `pyfelix lab run --ip-family` maps a scenario, and each cell is
    probed over every family of the lab. `scenario_data` stays in the IPv4 plan (emitted
    scenarios take --ip-family themselves)."""
    base_scenario = apply_ip_family(
        parse_scenario(scenario_data(name, nodes), source=f"<{name}>"), ip_family)
    topology = plan_topology(naming.new_run_id(), base_scenario)
    base = world_documents(base_scenario, topology)
    steps = plan_steps(cases, base, families(ip_family))
    data = scenario_with_steps(steps, name, nodes)
    scenario = apply_ip_family(parse_scenario(data, source=f"<{name}>"), ip_family)
    return SuitePlan(tuple(steps), scenario, data, base)

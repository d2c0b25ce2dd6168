"""A conformance case: resources to apply, a world, and the EXPECTED verdict function.

Role: the unit of the suite. A case is data: the documents it applies, how its world differs
from the base world, which probe columns it tests, and two hand-written predicates that ARE
the truth model for this case:

    ingress(src, dst, column) -> bool   does dst's ingress policy admit src's connection?
    egress(src, dst, column)  -> bool   does src's egress policy let the connection out?

A connection is expected to work when both pods have an endpoint (their Pod document is
present) and both predicates say yes. Predicates default to "allow" (no policy applies).
They are written from the Kubernetes and Calico documentation by hand, like upstream's
reachability tables, and never from anything the agent computes.

Inputs: built in `k8s_cases` / `calico_cases`.
Outputs: `Case.expected(src, dst, column)`.

Invariants:
- `follows` names the case whose state this one changes in place (a policy updated, a pod
  relabelled, a pod added back): the suite runs it directly after that case, so the step
  between them is a live update rather than a fresh start.
- Case names are unique, lowercase and dash-separated (they become report keys).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyfelix.lab.conformance.world import STANDARD_COLUMNS, Column, Pod, World, WorldChange

Verdict = Callable[[Pod, Pod, Column], bool]
_CASE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def allow_all(src: Pod, dst: Pod, column: Column) -> bool:
    return True


@dataclass(frozen=True)
class Case:
    name: str
    summary: str
    resources: tuple[dict[str, Any], ...] = ()
    ingress: Verdict = allow_all
    egress: Verdict = allow_all
    world_change: WorldChange = field(default_factory=WorldChange)
    columns: tuple[Column, ...] = STANDARD_COLUMNS
    follows: str | None = None
    group: str = ""

    @property
    def world(self) -> World:
        return World.with_change(self.world_change)

    def expected(self, src: Pod, dst: Pod, column: Column) -> bool:
        if not (src.present and dst.present):
            return False  # no endpoint: the node drops the pod's traffic both ways
        return self.egress(src, dst, column) and self.ingress(src, dst, column)


def check_cases(cases: Sequence[Case]) -> list[str]:
    """Problems with a case list: bad or duplicate names, `follows` not directly before."""
    problems: list[str] = []
    seen: set[str] = set()
    for index, case in enumerate(cases):
        if not _CASE_NAME.fullmatch(case.name):
            problems.append(f"case {case.name!r}: name must be lowercase words joined by '-'")
        if case.name in seen:
            problems.append(f"case {case.name!r}: duplicate name")
        seen.add(case.name)
        if case.follows is not None:
            before = cases[index - 1].name if index > 0 else None
            if before != case.follows:
                problems.append(f"case {case.name!r}: follows {case.follows!r} but comes after "
                                f"{before!r}")
        problems += [f"case {case.name!r}: {p}" for p in case.world_change.problems()]
    return problems


def select_cases(cases: Sequence[Case], patterns: Iterable[str]) -> list[Case]:
    """Cases whose name contains any pattern, plus the cases they follow (so a live update
    still starts from the state it updates), in suite order. No patterns: all cases."""
    wanted = list(patterns)
    if not wanted:
        return list(cases)
    by_name = {c.name: c for c in cases}
    chosen: set[str] = set()
    for case in cases:
        if any(p in case.name for p in wanted):
            name: str | None = case.name
            while name is not None and name not in chosen:
                chosen.add(name)
                name = by_name[name].follows
    return [c for c in cases if c.name in chosen]

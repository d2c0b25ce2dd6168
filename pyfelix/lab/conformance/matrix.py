"""Reachability matrices: the expected cells of a case, probing them, and truth tables.

Role: upstream netpol's "reachability" in Python. For a case, every ordered pair of distinct
pods (9 x 8 = 72; a pod talking to itself never leaves its namespace, so, as upstream
allows, it is not probed) times every column of the case is one `Cell` whose `expect` comes
from the case's truth model. `MatrixProber` probes cells concurrently, each probe a new
flow (`probes`); `truth_table` prints expected vs observed as upstream's grids do.

Inputs: a `Case`; a map from pod key to namespace name; a probe timeout and worker count.
Outputs: `Cell`s, `CellResult`s, text tables.

Invariants: cells come out in a fixed order (source, target, column), so two runs and two
dataplanes can be compared cell by cell; every probe is bounded by the timeout, and a batch
by ceil(cells / workers) timeouts.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.probes import ALLOW, DENY, FlowIds, probe_icmp, probe_tcp, probe_udp
from pyfelix.lab.conformance.world import ALL_POD_KEYS, Column, pod_ip
from pyfelix.lab.family import ipv6_for
from pyfelix.lab.probe import check_sources, run_bounded

DEFAULT_MAX_WORKERS = 96


@dataclass(frozen=True)
class Cell:
    source: str
    target: str
    column: Column
    expect: bool
    family: int = 4  # IP version probed; IPv6 targets the pod's twin address (lab.family)

    @property
    def expect_word(self) -> str:
        return ALLOW if self.expect else DENY

    @property
    def target_ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        namespace, name = self.target.split("/")
        address = pod_ip(namespace, name)
        return ipv6_for(address) if self.family == 6 else address


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    got: bool
    detail: str
    seconds: float
    # For a mismatch only: the verdict of a second probe after a pause (None: not re-probed).
    again: bool | None = None

    @property
    def mismatch(self) -> bool:
        return self.got != self.cell.expect

    @property
    def got_word(self) -> str:
        return ALLOW if self.got else DENY

    @property
    def persistent(self) -> bool | None:
        """For a mismatch: did a second probe disagree with the expectation again?"""
        return None if self.again is None else self.again != self.cell.expect


def expected_cells(case: Case, families: Sequence[int] = (4,)) -> list[Cell]:
    """Every cell of the case, once per IP version in `families`. The truth model is
    written against the IPv4 plan; an IPv6 cell expects the same verdict, since the lab's
    mapping keeps every CIDR test's answer (lab.family)."""
    world = case.world
    cells = []
    for source in ALL_POD_KEYS:
        for target in ALL_POD_KEYS:
            if source == target:
                continue
            for column in case.columns:
                expect = case.expected(world.pods[source], world.pods[target], column)
                cells.extend(Cell(source, target, column, expect, family)
                             for family in families)
    return cells


class MatrixProber:
    """Probes cells from their source pods' namespaces in one bounded thread pool; every
    probe is a new flow (`probes.FlowIds`), so no probe rides an earlier probe's conntrack
    entry."""

    def __init__(self, pod_netns: Mapping[str, str], *, timeout: float,
                 max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if timeout <= 0:
            raise ValueError(f"probe timeout must be positive, got {timeout}")
        self.pod_netns = dict(pod_netns)
        self.timeout = timeout
        self.max_workers = max(1, max_workers)
        self.flow_ids = FlowIds()

    def run(self, cells: Sequence[Cell]) -> list[CellResult]:
        check_sources((c.source for c in cells), self.pod_netns)
        return run_bounded(cells, self.probe, max_workers=self.max_workers,
                           thread_name_prefix="conformance")

    def probe(self, cell: Cell) -> CellResult:
        netns = self.pod_netns[cell.source]
        target = str(cell.target_ip)
        flow_id = self.flow_ids.next(cell.source)
        started = time.monotonic()
        column = cell.column
        if column.protocol == "ICMP":
            verdict, detail = probe_icmp(netns, target, flow_id, self.timeout)
        elif column.protocol == "TCP" and column.port is not None:
            verdict, detail = probe_tcp(netns, target, column.port, flow_id, self.timeout)
        elif column.protocol == "UDP" and column.port is not None:
            verdict, detail = probe_udp(netns, target, column.port, flow_id, self.timeout)
        else:
            raise ValueError(f"cannot probe column {column}")
        return CellResult(cell, verdict == ALLOW, detail, time.monotonic() - started)

    def reprobe(self, results: Sequence[CellResult]) -> list[CellResult]:
        """Probe the mismatches again and record the second verdict (diagnosis only: the
        first verdict is what counts)."""
        mismatched = [r for r in results if r.mismatch]
        again = {id(r): a for r, a in zip(mismatched, self.run([r.cell for r in mismatched]),
                                          strict=True)}
        return [replace(r, again=again[id(r)].got) if id(r) in again else r for r in results]


def truth_table(results: Sequence[CellResult], column: Column) -> str:
    """One column's grid, rows = from, columns = to: '.' allowed and '#' denied as expected;
    '+' allowed but expected denied, '-' denied but expected allowed; ' ' not probed."""
    by_pair: dict[tuple[str, str], CellResult] = {}
    for r in results:  # a pair probed over both families shows its worse cell
        if r.cell.column == column and (by_pair.get((r.cell.source, r.cell.target)) is None
                                        or r.mismatch):
            by_pair[(r.cell.source, r.cell.target)] = r
    width = max(len(k) for k in ALL_POD_KEYS)
    label = max(width, len(str(column)))
    lines = [f"{column!s:<{label}} " + " ".join(k.ljust(width) for k in ALL_POD_KEYS)]
    for source in ALL_POD_KEYS:
        marks = []
        for target in ALL_POD_KEYS:
            result = by_pair.get((source, target))
            marks.append(_mark(result).ljust(width))
        lines.append(f"{source:<{label}} " + " ".join(marks))
    return "\n".join(lines)


def _mark(result: CellResult | None) -> str:
    if result is None:
        return " "
    if not result.mismatch:
        return "." if result.got else "#"
    return "+" if result.got else "-"

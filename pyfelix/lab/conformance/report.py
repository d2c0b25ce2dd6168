"""The conformance report: figures per dataplane, every mismatch, truth tables of failures.

Role: format `DataplaneOutcome`s for people (text) and tools (JSON).

Figures per dataplane: cases planned / run / passed, probes, mismatches (each with case, from,
to, protocol/port, expected, got, probe detail, and whether a second probe disagreed again),
seconds (whole run) and the lab's phase timings. `all_agree` is True only when every
dataplane ran every case with zero mismatches and no lab error.

JSON shape:
    {"ok": bool, "seconds": float, "cases": int,
     "dataplanes": {"<dp>": {"nodes": n, "cases": n, "cases_run": n, "cases_passed": n, "probes": n,
                            "mismatches": [{"case", "group", "from", "to", "family", "protocol",
                                            "port", "expected", "got", "detail", "persistent"}],
                            "error": str|null, "seconds": s, "timings": {...},
                            "per_case": [{"case", "group", "probes", "mismatches",
                                          "sync_s", "probe_s"}]}}}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyfelix.lab.conformance.matrix import truth_table
from pyfelix.lab.conformance.suite import DataplaneOutcome

MAX_LISTED_MISMATCHES = 60


@dataclass
class ConformanceReport:
    outcomes: Sequence[DataplaneOutcome]
    seconds: float

    @property
    def all_agree(self) -> bool:
        return bool(self.outcomes) and all(o.ok for o in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        planned = max((o.planned_cases for o in self.outcomes), default=0)
        return {
            "ok": self.all_agree,
            "seconds": round(self.seconds, 1),
            "cases": planned,
            "dataplanes": {o.dataplane: _dataplane_json(o) for o in self.outcomes},
        }

    def format_text(self, *, tables: bool = True) -> str:
        lines = [_row(["DATAPLANE", "NODES", "CASES", "RUN", "PASSED", "PROBES", "MISMATCHES",
                       "SECONDS"])]
        for o in self.outcomes:
            lines.append(_row([o.dataplane, o.nodes, o.planned_cases, len(o.cases),
                               o.cases_passed, o.probes, len(o.mismatches), f"{o.seconds:.1f}"]))
        lines.append(f"total: {self.seconds:.1f}s; "
                     + ("every case agreed with the expected matrix on every dataplane"
                        if self.all_agree else "NOT CONFORMANT"))
        for o in self.outcomes:
            if o.error:
                lines.append(f"{o.dataplane}: lab error: {o.error}")
            timings = ", ".join(f"{k} {v:.1f}" for k, v in sorted(o.timings.items()))
            lines.append(f"{o.dataplane} timings (s): {timings}")
            for case, result in o.mismatches[:MAX_LISTED_MISMATCHES]:
                cell = result.cell
                persistent = {True: "persistent", False: "transient", None: "not re-probed"}[
                    result.persistent]
                lines.append(f"  MISMATCH {o.dataplane} {case.name}: {cell.source} -> "
                             f"{cell.target} {cell.column} IPv{cell.family}: expected "
                             f"{cell.expect_word}, got "
                             f"{result.got_word} ({result.detail}; {persistent})")
            if len(o.mismatches) > MAX_LISTED_MISMATCHES:
                lines.append(f"  ... and {len(o.mismatches) - MAX_LISTED_MISMATCHES} more "
                             "(all of them in -o json)")
            if tables:
                for case_outcome in o.cases:
                    if case_outcome.passed:
                        continue
                    lines.append(f"  {o.dataplane} {case_outcome.case.name}: "
                                 f"{case_outcome.case.summary}")
                    lines.append("  ('.' allowed, '#' denied as expected; '+' allowed but "
                                 "expected denied; '-' denied but expected allowed)")
                    bad_columns = sorted({r.cell.column for r in case_outcome.mismatches})
                    for column in bad_columns:
                        lines.extend("    " + line for line in
                                     truth_table(case_outcome.results, column).splitlines())
        return "\n".join(lines)


def _dataplane_json(o: DataplaneOutcome) -> dict[str, Any]:
    return {
        "nodes": o.nodes,
        "cases": o.planned_cases,
        "cases_run": len(o.cases),
        "cases_passed": o.cases_passed,
        "probes": o.probes,
        "mismatches": [
            {"case": case.name, "group": case.group, "from": r.cell.source,
             "to": r.cell.target, "family": r.cell.family,
             "protocol": r.cell.column.protocol, "port": r.cell.column.port,
             "expected": r.cell.expect_word, "got": r.got_word, "detail": r.detail,
             "persistent": r.persistent}
            for case, r in o.mismatches
        ],
        "error": o.error,
        "seconds": round(o.seconds, 1),
        "timings": {k: round(v, 2) for k, v in sorted(o.timings.items())},
        "per_case": [
            {"case": c.case.name, "group": c.case.group, "probes": len(c.results),
             "mismatches": len(c.mismatches), "sync_s": round(c.sync_seconds, 2),
             "probe_s": round(c.probe_seconds, 2)}
            for c in o.cases
        ],
    }


def _row(cells: Sequence[object]) -> str:
    widths = (10, 6, 6, 5, 7, 7, 11, 8)
    return "".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

"""Fixtures for the conformance tests: the lab tests' root-namespace guard (`root_guard`)
and `single_node_suite`, the whole single-node suite run once per dataplane per session.

The matrix test (test_conformance) and the explain test (test_conformance_explain) assert
on the same run: it probes every case with `ExplainEveryProbe` as its after-step hook, so
the suite's ~80 s per dataplane is spent once, not twice. The run happens inside the first
test that asks for it (`SuiteRuns.get`), after that test's `root_guard` recorded the root
namespace, so that test's guard check covers the lab's set-up and teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from pyfelix.lab.conformance.__main__ import run_conformance
from pyfelix.lab.conformance.report import ConformanceReport
from tests.privileged.conformance.explain_checker import ExplainEveryProbe
from tests.privileged.lab.conftest import root_guard


@dataclass
class SuiteRun:
    report: ConformanceReport  # one outcome: the dataplane's
    explained: ExplainEveryProbe


@dataclass
class SuiteRuns:
    runs: dict[str, SuiteRun] = field(default_factory=dict)

    def get(self, dataplane: str) -> SuiteRun:
        if dataplane not in self.runs:
            checker = ExplainEveryProbe(dataplane)
            try:
                report = run_conformance([dataplane], after_step=checker)
            finally:
                checker.close()
            self.runs[dataplane] = SuiteRun(report, checker)
        return self.runs[dataplane]


@pytest.fixture(scope="session")
def single_node_suite() -> Iterator[SuiteRuns]:
    yield SuiteRuns()


__all__ = ["SuiteRuns", "root_guard", "single_node_suite"]

"""`pyfelix explain` against every probe of the conformance suite, on both dataplanes.

The single-node suite runs once per dataplane (conftest `single_node_suite`, shared with
test_conformance's matrix test) with `ExplainEveryProbe` as its after-step hook: after each
case is probed, while its policy is in force, every cell's flow is explained on the node.
Each explanation must give the probe's observed verdict, and in BPF mode the program and
the calc graph must agree (verdict and deciding record). Once per dataplane the real CLI
runs too (nsenter into the node, JSON out).
"""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.lab.conformance import CONFORMANT_DATAPLANES
from tests.privileged.conformance.conftest import SuiteRuns

pytestmark = pytest.mark.privileged


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("dataplane", CONFORMANT_DATAPLANES)
def test_explain_gives_every_probes_observed_verdict(dataplane: str, root_guard: Any,
                                                     single_node_suite: SuiteRuns,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = single_node_suite.get(dataplane)
    outcome, checker = run.report.outcomes[0], run.explained
    with capsys.disabled():
        print(f"\nexplain[{dataplane}]: {checker.explained} probes explained "
              f"(+{checker.absent_checked} to/from pods without a Pod document) "
              f"({checker.kernel_runs} BPF program runs) in {checker.seconds:.1f}s, "
              f"{len(checker.problems)} problem(s); suite mismatches "
              f"{len(outcome.mismatches)}")
        for problem in checker.problems[:30]:
            print(f"  {problem}")
    assert outcome.error is None, outcome.error
    assert checker.explained + checker.absent_checked >= (
        outcome.probes - len(outcome.mismatches)) > 1000
    assert checker.verdicts == {"allow", "deny"}
    assert len(checker.cli_checked) == 2
    if dataplane == "bpf":
        assert checker.kernel_runs >= checker.explained
    assert not checker.problems
    root_guard.check()

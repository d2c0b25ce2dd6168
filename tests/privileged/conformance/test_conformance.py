"""The network-policy conformance suite on every conformant dataplane (real agents, real lab).

`CONFORMANT_DATAPLANES` (lab.conformance) lists the dataplanes run here; each listed
one RUNS (a broken one fails, it is never skipped). Per dataplane: one lab, one agent, one
step per case, the whole 9x8 matrix per case; the test passes only with zero mismatches and
prints the figures (cases passed, probes, seconds) whether it passes or not. The run is
conftest's `single_node_suite`, shared with test_conformance_explain (its seconds include
the explanations made after each case). A sample of the
cases runs again with the pods spread over two nodes (confd + BIRD route between them).

A second test shows the suite can fail: in a lab where nothing enforces policy, exactly the
cells the truth model expects denied come out as mismatches.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyfelix.lab.conformance import ALL_CASES, CONFORMANT_DATAPLANES, CROSS_NODE_SAMPLE
from pyfelix.lab.conformance.__main__ import run_conformance
from pyfelix.lab.conformance.case import select_cases
from pyfelix.lab.conformance.suite import run_dataplane
from pyfelix.lab.runner import NoAgents
from tests.privileged.conformance.conftest import SuiteRuns

pytestmark = pytest.mark.privileged


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("dataplane", CONFORMANT_DATAPLANES)
def test_every_case_matches_its_expected_matrix(dataplane: str, root_guard: Any,
                                                single_node_suite: SuiteRuns,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    report = single_node_suite.get(dataplane).report
    text = report.format_text()
    with capsys.disabled():
        print(f"\n{text}")
    outcome = report.outcomes[0]
    assert outcome.error is None, text
    assert len(outcome.cases) == len(ALL_CASES) >= 40
    assert outcome.probes == outcome.planned_probes
    assert not outcome.mismatches, text
    # a suite that only ever saw "allow" (or only "deny") would prove nothing
    verdicts = {r.got for c in outcome.cases for r in c.results}
    assert verdicts == {True, False}
    root_guard.check()


@pytest.mark.timeout(600)
# make test runs the cross-node sample on BPF (iptables across two nodes: test_lab_bgp,
# test_lab_ip_family); both dataplanes under make test-matrix (`extended`)
@pytest.mark.parametrize("dataplane", [
    pytest.param(d, marks=pytest.mark.extended) if d == "iptables" else d
    for d in CONFORMANT_DATAPLANES])
def test_cross_node_sample_matches_its_expected_matrices(
        dataplane: str, root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The same truth models with the pods spread over two nodes: ingress policy on one
    node, egress on the other, IP sets holding remote pods, routes learned over BGP."""
    report = run_conformance([dataplane], case_patterns=CROSS_NODE_SAMPLE, nodes=2)
    text = report.format_text()
    with capsys.disabled():
        print(f"\n{text}")
    outcome = report.outcomes[0]
    assert outcome.error is None, text
    assert outcome.nodes == 2
    assert len(outcome.cases) == len(select_cases(ALL_CASES, CROSS_NODE_SAMPLE)) >= 20
    assert not outcome.mismatches, text
    root_guard.check()


@pytest.mark.timeout(120)
def test_a_lab_that_enforces_nothing_fails_exactly_the_deny_cells(root_guard: Any) -> None:
    cases = select_cases(ALL_CASES, ["k8s-default-deny-all", "calico-icmp-deny",
                                     "k8s-named-port-udp"])
    outcome = run_dataplane(cases, "none", agents=NoAgents())
    assert outcome.error is None
    assert len(outcome.cases) == len(cases) == 3
    for case_outcome in outcome.cases:
        expected_denies = {r.cell for r in case_outcome.results if not r.cell.expect}
        assert expected_denies, case_outcome.case.name
        assert {r.cell for r in case_outcome.mismatches} == expected_denies
        assert all(r.got for r in case_outcome.results)  # nothing enforced: all allowed
        assert all(r.persistent for r in case_outcome.mismatches)
    root_guard.check()

"""`make test-matrix` (not `make test`): every lab scenario and the conformance suite, per
IP family and dataplane (issue 18's first acceptance line, in full).

Scenarios: every file under tests/lab/scenarios x {ipv6, dual} x {bpf, iptables}, through
`pyfelix lab run --ip-family F -o json`. NodePort Services run over IPv6 too
(services-nodeport: BPF NodePorts in nat6.h, kube-proxy's ip6tables rules in iptables mode),
and floating IPs (two-node-floating-ip: each floating IP gets its IPv6 twin, NATed in
ip6tables' nat table). A scenario the lab cannot run over IPv6 (see lab.family) must be
refused at once, exit 1, with an error naming the scenario and the resource. Overlay
scenarios run: VXLAN over vxlan.calico and vxlan-v6.calico; IPIP's IPv6 twin pool over BGP,
so under `ipv6` the IPIP scenario runs on any kernel, while under `dual` its IPv4 pool needs
IPIP (CONFIG_NET_IPIP): without it the lab must refuse at once naming IPIP, and the case is
skipped with that reason. Every other
one must pass (exit 0: each probe equals its `expect`), every probe must carry `family`, and
under `dual` each IPv4 probe is followed by its IPv6 twin with the same verdict, so denied
probes are denied in both.
(`ipv4` runs of the same scenarios are `make test`'s, tests/privileged/lab.)

Conformance: the whole suite under ipv6 and dual on each dataplane, and the cross-node
sample on two nodes under dual; zero mismatches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.conformance import ALL_CASES, CONFORMANT_DATAPLANES, CROSS_NODE_SAMPLE
from pyfelix.lab.conformance.__main__ import run_conformance
from pyfelix.lab.family import IpFamilyUnsupported, apply_ip_family
from pyfelix.lab.scenario import load_scenario
from tests.privileged.lab.test_lab_overlay import kernel_has_ipip

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "tests" / "lab" / "scenarios").glob("*.yaml"))
TYPHA_SCENARIOS = ("two-node-typha-steps",)


def _refusal(path: Path, family: str) -> IpFamilyUnsupported | None:
    try:
        apply_ip_family(load_scenario(path), family)
    except IpFamilyUnsupported as exc:
        return exc
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
@pytest.mark.parametrize("family", ["ipv6", "dual"])
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_per_family(path: Path, family: str, dataplane: str,
                             root_guard: Any) -> None:
    extra = ["--typha"] if path.stem in TYPHA_SCENARIOS else []
    done = subprocess.run(
        [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(path), "-o", "json",
         "--dataplane", dataplane, "--ip-family", family, "--probe-timeout", "0.5", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=280)
    refused = _refusal(path, family)
    if refused is None and "no IPIP support" in done.stderr and not kernel_has_ipip():
        assert done.returncode != 0, done.stdout + done.stderr
        pytest.skip(f"{path.stem} --ip-family {family}: this kernel has no IPIP "
                    "(CONFIG_NET_IPIP); the lab refused the IPv4 IPIP pool at once")
    if refused is not None:
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"scenario {path.stem} cannot run with --ip-family {family}" in done.stderr
        assert all(problem in done.stderr for problem in refused.problems)
        return
    assert done.returncode == 0, done.stdout + done.stderr
    probes = json.loads(done.stdout)["probes"]
    assert probes and all(p["result"] == p["expect"] for p in probes if p["expect"])
    if family == "ipv6":
        assert {p["family"] for p in probes} == {6}
    else:
        assert [p["family"] for p in probes] == [4, 6] * (len(probes) // 2)
        for v4, v6 in zip(probes[::2], probes[1::2], strict=True):
            same = ("step", "from", "to", "port", "protocol", "expect", "result")
            assert {k: v4[k] for k in same} == {k: v6[k] for k in same}, (v4, v6)
    root_guard.check()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("dataplane", CONFORMANT_DATAPLANES)
@pytest.mark.parametrize("family", ["ipv6", "dual"])
def test_conformance_per_family(family: str, dataplane: str, root_guard: Any,
                                capsys: pytest.CaptureFixture[str]) -> None:
    report = run_conformance([dataplane], ip_family=family)
    text = report.format_text()
    with capsys.disabled():
        print(f"\n[{family}] {text}")
    outcome = report.outcomes[0]
    assert outcome.error is None, text
    assert len(outcome.cases) == len(ALL_CASES)
    assert outcome.probes == outcome.planned_probes
    assert not outcome.mismatches, text
    families = {r.cell.family for c in outcome.cases for r in c.results}
    assert families == ({6} if family == "ipv6" else {4, 6})
    assert {r.got for c in outcome.cases for r in c.results} == {True, False}
    root_guard.check()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("dataplane", CONFORMANT_DATAPLANES)
def test_conformance_cross_node_sample_dual(dataplane: str, root_guard: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    report = run_conformance([dataplane], case_patterns=CROSS_NODE_SAMPLE, nodes=2,
                             ip_family="dual")
    text = report.format_text()
    with capsys.disabled():
        print(f"\n[dual, 2 nodes] {text}")
    outcome = report.outcomes[0]
    assert outcome.error is None, text
    assert outcome.nodes == 2
    assert not outcome.mismatches, text
    root_guard.check()

"""The conformance suite's own parts, without a lab (no root needed; lives beside the suite).

- every case's documents pass the agent's resource model (a typo would silently drop a
  policy and turn the case into a test of something else);
- the case list is well formed (>= 40 cases, `follows` chains in place) and the truth model
  can both catch a missing deny and an extra one (almost every case expects some deny and
  some allow; the exceptions are listed by name);
- hand-counted figures for a few cases agree with the truth model;
- the plan: the base world re-renders byte-for-byte as the lab wrote it, live updates are
  in-place applies without deletes, the emitted scenario parses;
- the ICMP packet code, flow-id allocation, case selection, truth tables and the report.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import pytest
import yaml

from pyfelix.agent.bpf.packets import checksum
from pyfelix.agent.model.resources import parse_resource
from pyfelix.lab.conformance import ALL_CASES
from pyfelix.lab.conformance.case import Case, check_cases, select_cases
from pyfelix.lab.conformance.matrix import Cell, CellResult, expected_cells, truth_table
from pyfelix.lab.conformance.plan import PlanError, build_plan, plan_steps
from pyfelix.lab.conformance.probes import (
    FlowIds,
    classify,
    echo_request,
)
from pyfelix.lab.conformance.report import ConformanceReport
from pyfelix.lab.conformance.resources import knp, labels, ref_of
from pyfelix.lab.conformance.suite import CaseOutcome, DataplaneOutcome
from pyfelix.lab.conformance.world import (
    ALL_POD_KEYS,
    ICMP_ECHO,
    TCP_80,
    UDP_80,
    World,
    WorldChange,
    pod_ip,
    scenario_data,
)
from pyfelix.lab.scenario import parse_scenario

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
BY_NAME = {case.name: case for case in ALL_CASES}
# Cases whose expected matrix is all-allow on purpose: the interesting part is the change
# into them (a delete, an in-place order change) or that a union re-opens a default deny.
ALL_ALLOW_ON_PURPOSE = {"k8s-baseline-no-policy", "k8s-policy-deleted",
                        "k8s-allow-all-ingress-union", "k8s-allow-all-egress-union",
                        "calico-order-update"}
ALL_DENY_ON_PURPOSE = {"k8s-deny-everywhere", "calico-global-default-deny"}


@pytest.fixture(scope="module")
def plan():  # type: ignore[no-untyped-def]
    return build_plan(ALL_CASES)


def test_every_document_passes_the_agents_resource_model() -> None:
    for case in ALL_CASES:
        for doc in case.resources:
            parse_resource(doc)  # raises ValidationError naming the field


def test_case_list_is_well_formed() -> None:
    assert check_cases(ALL_CASES) == []
    assert len(ALL_CASES) >= 40
    groups = {c.group for c in ALL_CASES}
    assert groups == {"kubernetes", "calico"}
    assert sum(1 for c in ALL_CASES if ICMP_ECHO in c.columns) >= 5


def test_check_cases_reports_a_follows_out_of_place() -> None:
    a = Case("a-case", "a")
    b = Case("b-case", "b", follows="a-case")
    assert check_cases([a, b]) == []
    assert check_cases([b, a]) == ["case 'b-case': follows 'a-case' but comes after None"]
    assert "duplicate name" in check_cases([a, a])[0]
    assert "lowercase" in check_cases([Case("Bad_Name", "x")])[0]


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_expected_matrix_can_catch_missing_and_extra_enforcement(case: Case) -> None:
    cells = expected_cells(case)
    assert len(cells) == 72 * len(case.columns)  # every ordered pair of distinct pods
    allowed = {c.expect for c in cells}
    if case.name in ALL_ALLOW_ON_PURPOSE:
        assert allowed == {True}
    elif case.name in ALL_DENY_ON_PURPOSE:
        assert allowed == {False}
    else:
        assert allowed == {True, False}


@pytest.mark.parametrize(("name", "denied"), [
    # x's 3 pods x 8 sources x 3 columns
    ("k8s-default-deny-ingress", 3 * 8 * 3),
    # ingress into x (24 pairs) + egress out of x to non-x (3 x 6 pairs), x 4 columns
    ("k8s-default-deny-all", (3 * 8 + 3 * 6) * 4),
    # into x/a: 8 sources x 3 columns, except x/b on all three
    ("k8s-pod-selector", 7 * 3),
    # into x/a only y/b; everyone else (7) is denied, on 3 columns
    ("k8s-and-peer", 7 * 3),
    # into x/a: y (3) + x/b allowed, the other 4 sources denied
    ("k8s-or-peers", 4 * 3),
    # x/b absent: 8 pairs each way x 3 columns; plus nothing else
    ("k8s-pod-absent", 16 * 3),
    # into x: sources from z (3 sources x 3 pods) on UDP only
    ("calico-order-three-policies", 3 * 3),
    # into x: everything but the 3 y sources on every column
    ("calico-tier-order", (8 * 3 - 3 * 3) * 3),
    # into x: ICMP from every source (8 each)
    ("calico-icmp-deny", 3 * 8),
])
def test_truth_model_matches_hand_counts(name: str, denied: int) -> None:
    cells = expected_cells(BY_NAME[name])
    assert sum(1 for c in cells if not c.expect) == denied


def test_truth_model_spot_checks() -> None:
    def expect(name: str, source: str, target: str, column: object) -> bool:
        return next(c.expect for c in expected_cells(BY_NAME[name])
                    if (c.source, c.target, c.column) == (source, target, column))

    assert expect("k8s-pod-relabel-source", "x/c", "x/a", TCP_80)  # relabelled pod=b
    assert not expect("k8s-pod-selector", "x/c", "x/a", TCP_80)
    assert expect("k8s-namespace-relabel", "z/b", "x/a", UDP_80)
    assert not expect("k8s-namespace-relabel-before", "z/b", "x/a", UDP_80)
    assert expect("calico-pass-to-k8s-policy", "y/a", "x/b", TCP_80)
    assert not expect("calico-pass-to-k8s-policy", "y/b", "x/b", TCP_80)
    assert expect("calico-tier-default-pass", "y/c", "x/c", UDP_80)
    assert not expect("calico-tier-default-deny", "y/c", "x/c", UDP_80)
    assert expect("calico-service-account-selector", "x/a", "z/a", TCP_80)
    assert not expect("calico-service-account-selector", "y/a", "z/a", TCP_80)
    assert not expect("calico-global-set-from-namespaced-policy", "z/c", "x/b", TCP_80)


def test_world_changes() -> None:
    world = World.with_change(WorldChange(
        pod_labels={"x/c": {"pod": "b"}}, namespace_labels={"z": {"team": "blue"}},
        service_accounts={"y/a": "admin"}, absent=frozenset({"x/b"})))
    assert world.pods["x/c"].labels == {"pod": "b"}
    assert world.pods["z/a"].namespace_labels == {"kubernetes.io/metadata.name": "z",
                                                  "team": "blue"}
    assert world.pods["y/a"].service_account == "admin"
    assert not world.pods["x/b"].present
    assert str(world.pods["y/b"].ip) == "10.65.2.11"
    with pytest.raises(ValueError, match="unknown pod 'q/a'"):
        World.with_change(WorldChange(absent=frozenset({"q/a"})))


def test_pods_spread_over_nodes() -> None:
    data = scenario_data(nodes=2)
    assert data["nodes"] == ["node1", "node2"]
    nodes_by_namespace = {ns: {p["node"] for p in data["pods"] if p["namespace"] == ns}
                          for ns in ("x", "y", "z")}
    assert all(nodes == {"node1", "node2"} for nodes in nodes_by_namespace.values())
    assert "nodes" not in scenario_data()
    assert {p["node"] for p in scenario_data()["pods"]} == {"node1"}
    two_node_plan = build_plan(select_cases(ALL_CASES, ["k8s-and-peer"]), nodes=2)
    assert two_node_plan.scenario.nodes == ("node1", "node2")
    with pytest.raises(ValueError, match="nodes must be"):
        scenario_data(nodes=0)


def test_base_world_rerenders_as_the_lab_wrote_it(plan) -> None:  # type: ignore[no-untyped-def]
    assert World.base().documents(plan.base_documents) == plan.base_documents
    pod = plan.base_documents[("Pod", "x", "a")]
    assert pod["status"]["podIP"] == str(pod_ip("x", "a"))
    assert {p["name"] for p in pod["spec"]["containers"][0]["ports"]} == {
        "serve-80-tcp", "serve-81-tcp", "serve-80-udp"}


def test_plan_steps_are_diffs(plan) -> None:  # type: ignore[no-untyped-def]
    steps = {s.case.name: s for s in plan.steps}
    first = plan.steps[0]
    assert first.case.name == ALL_CASES[0].name and not first.apply and not first.delete
    update = steps["k8s-policy-update"]  # x/c's labels restored + the policy replaced
    assert sorted(ref_of(d) for d in update.apply) == [
        ("NetworkPolicy", "x", "allow-from-b"), ("Pod", "x", "c")]
    assert update.delete == ()
    relabel = steps["k8s-pod-relabel-source"]
    assert [ref_of(d) for d in relabel.apply] == [("Pod", "x", "c")]
    assert relabel.apply[0]["metadata"]["labels"] == {"pod": "b"}
    deleted = steps["k8s-policy-deleted"]
    assert deleted.apply == () and deleted.delete == (("NetworkPolicy", "x", "deny-all"),)
    absent = steps["k8s-pod-absent"]
    assert ("Pod", "x", "b") in absent.delete
    added = steps["k8s-pod-added-after-policy"]
    assert [ref_of(d) for d in added.apply] == [("Pod", "x", "b")]
    assert plan.probe_count == sum(len(s.cells) for s in plan.steps)


def test_plan_rejects_two_documents_with_one_identity(plan) -> None:  # type: ignore[no-untyped-def]
    doc = knp("same", "x", labels())
    with pytest.raises(PlanError, match="two documents"):
        plan_steps([Case("dup-case", "d", resources=(doc, doc))], plan.base_documents)


def test_emitted_scenario_is_a_valid_lab_scenario(plan) -> None:  # type: ignore[no-untyped-def]
    data = yaml.load(yaml.dump(plan.scenario_data, Dumper=_DUMPER), Loader=_LOADER)
    scenario = parse_scenario(data)
    assert len(scenario.steps) == len(ALL_CASES)
    tcp_udp_cells = sum(1 for s in plan.steps for c in s.cells if c.column.port is not None)
    assert len(scenario.probes) == tcp_udp_cells
    assert {p.expect for p in scenario.probes} == {"allow", "deny"}


def test_select_cases_pulls_in_what_a_case_follows() -> None:
    chosen = [c.name for c in select_cases(ALL_CASES, ["k8s-policy-update"])]
    assert chosen == ["k8s-pod-selector", "k8s-pod-relabel-source", "k8s-policy-update"]
    assert select_cases(ALL_CASES, []) == list(ALL_CASES)
    assert select_cases(ALL_CASES, ["no-such-case"]) == []


def test_icmp_packets() -> None:
    request = echo_request(0x1234, 7, b"token")
    assert checksum(request) == 0  # a packet with its checksum in place sums to zero
    assert struct.unpack("!BBHHH", request[:8])[::2][:1] == (8,)
    ip_header = bytes([0x45]) + bytes(11) + socket.inet_aton("10.65.2.10") + bytes(4)
    reply = bytes([0, 0]) + request[2:]
    assert classify(ip_header + reply, "10.65.2.10", 0x1234, 7, b"token") == "echoed"
    assert classify(ip_header + reply, "10.65.2.10", 0x1235, 7, b"token") is None
    assert classify(ip_header + reply, "10.65.2.11", 0x1234, 7, b"token") is None
    inner_ip = bytes([0x45]) + bytes(15) + socket.inet_aton("10.65.2.10")
    unreachable = bytes([3, 1, 0, 0, 0, 0, 0, 0]) + inner_ip + request[:8]
    assert classify(ip_header + unreachable, "10.65.2.10", 0x1234, 7, b"x") == "unreachable"
    assert classify(b"\x45", "10.65.2.10", 1, 1, b"") is None


def test_flow_ids_never_repeat_within_the_range() -> None:
    ids = FlowIds(100, 199)
    seen: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(25):
            value = ids.next("x/a")
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(100, 200))
    assert ids.next("x/b") == 100  # per source
    assert ids.next("x/a") == 100  # wraps only after the whole range
    with pytest.raises(ValueError):
        FlowIds(0, 10)


def _outcome_with(results: list[CellResult], case: Case) -> DataplaneOutcome:
    outcome = DataplaneOutcome("iptables", planned_cases=1, planned_probes=len(results))
    outcome.cases.append(CaseOutcome(case, results, 0.1, 0.5))
    outcome.seconds = 1.0
    return outcome


def test_report_lists_mismatches_and_truth_tables() -> None:
    case = BY_NAME["k8s-pod-selector"]
    results = [CellResult(c, c.expect, "echoed" if c.expect else "timeout", 0.01)
               for c in expected_cells(case)]
    wrong = next(i for i, r in enumerate(results)
                 if (r.cell.source, r.cell.target, r.cell.column) == ("x/c", "x/a", TCP_80))
    results[wrong] = CellResult(results[wrong].cell, True, "echoed", 0.01, again=True)
    report = ConformanceReport([_outcome_with(results, case)], seconds=2.0)
    assert not report.all_agree
    data = report.to_json()
    figures = data["dataplanes"]["iptables"]
    assert (figures["cases_passed"], figures["probes"]) == (0, 216)
    assert figures["mismatches"] == [{
        "case": "k8s-pod-selector", "group": "kubernetes", "from": "x/c", "to": "x/a",
        "family": 4, "protocol": "TCP", "port": 80, "expected": "deny", "got": "allow",
        "detail": "echoed", "persistent": True}]
    text = report.format_text()
    assert "MISMATCH iptables k8s-pod-selector: x/c -> x/a TCP/80" in text
    table = truth_table(results, TCP_80).splitlines()
    assert table[0].split()[1:] == list(ALL_POD_KEYS)
    row_xc = table[ALL_POD_KEYS.index("x/c") + 1].split()
    assert row_xc[0] == "x/c" and row_xc[1] == "+"  # x/c -> x/a allowed, expected denied


def test_report_all_agree_needs_every_case_and_no_error() -> None:
    case = BY_NAME["k8s-baseline-no-policy"]
    results = [CellResult(c, c.expect, "echoed", 0.01) for c in expected_cells(case)]
    good = _outcome_with(results, case)
    assert ConformanceReport([good], 1.0).all_agree
    good.error = "AgentStartError: boom"
    assert not ConformanceReport([good], 1.0).all_agree
    assert not ConformanceReport([], 1.0).all_agree
    missing = DataplaneOutcome("iptables", planned_cases=2, planned_probes=0)
    missing.cases.append(CaseOutcome(case, results, 0.1, 0.1))
    assert not ConformanceReport([missing], 1.0).all_agree


def test_cell_target_ip() -> None:
    assert str(Cell("x/a", "z/c", TCP_80, True).target_ip) == "10.65.3.12"


def test_command_line_without_a_lab(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from pyfelix.lab.conformance.__main__ import main

    assert main(["--list", "--case", "k8s-policy-update"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [
        "k8s-pod-selector", "k8s-pod-relabel-source", "k8s-policy-update"]
    target = tmp_path / "suite.yaml"
    assert main(["--case", "calico-icmp-type", "--emit-scenario", str(target)]) == 0
    scenario = parse_scenario(yaml.load(target.read_text(), Loader=_LOADER))
    assert len(scenario.steps) == 1 and len(scenario.probes) == 216  # ICMP is not in it
    assert main(["--probe-timeout", "0"]) == 2
    assert main(["--nodes", "10"]) == 2
    assert main(["--case", "no-such-case"]) == 2

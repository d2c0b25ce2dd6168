"""`pyfelix lab run|sweep|demo` end to end, as a user runs them (subprocess, real namespaces)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "tests" / "lab" / "scenarios"


def pyfelix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyfelix.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_run_json_reports_every_probe_and_fails_on_unmet_expectations(root_guard: Any) -> None:
    done = pyfelix("lab", "run", str(SCENARIOS / "calico-gnp-order.yaml"), "-o", "json",
                   "--no-agent", "--probe-timeout", "0.5")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [(p["step"], p["from"], p["to"], p["port"], p["protocol"], p["expect"])
            for p in report["probes"]] == [
        (0, "prod/client", "prod/api", 443, "TCP", "allow"),
        (0, "prod/client", "prod/api", 9000, "TCP", "deny"),
        (0, "prod/scanner", "prod/api", 443, "TCP", "deny"),
        (0, "prod/api", "prod/client", 80, "TCP", "allow"),
    ]
    # no agent: nothing enforces the policies, so every probe connects
    assert {p["result"] for p in report["probes"]} == {"allow"}
    assert {"build_s", "probes_s", "teardown_s", "total_s"} <= set(report["timings"])
    assert "no policy is enforced" in done.stderr
    assert "2 probe(s) did not match their expect" in done.stderr
    assert "prod/scanner -> prod/api 443/TCP: expected deny, got allow" in done.stderr
    root_guard.check()


def test_run_table_marks_mismatches(root_guard: Any) -> None:
    done = pyfelix("lab", "run", str(SCENARIOS / "k8s-allow-from-namespace.yaml"),
                   "--no-agent", "--probe-timeout", "0.5")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STEP", "FROM", "TO", "PORT", "PROTO", "RESULT", "EXPECT"]
    mismatched = [line.split()[1:3] for line in lines[1:5] if line.endswith("MISMATCH")]
    assert mismatched == [["other/intruder", "db/postgres"]]
    root_guard.check()


def test_run_exits_zero_when_every_expectation_holds(tmp_path: Path, root_guard: Any) -> None:
    scenario = tmp_path / "ok.yaml"
    scenario.write_text(
        "nodes: [n1, n2]\n"
        "namespaces: [{name: x}]\n"
        "pods:\n"
        "  - {namespace: x, name: a, node: n1, ports: [{port: 80}]}\n"
        "  - {namespace: x, name: b, node: n2, ports: [{port: 53, protocol: UDP, name: dns}]}\n"
        "probes:\n"
        "  - {from: x/b, to: x/a, port: 80, expect: allow}\n"
        "  - {from: x/a, to: x/b, port: dns, protocol: UDP, expect: allow}\n"
        "  - {from: x/a, to: x/b, port: 54, protocol: UDP, expect: deny}\n"
    )
    done = pyfelix("lab", "run", str(scenario), "-o", "json", "--no-agent",
                   "--probe-timeout", "0.5")
    assert done.returncode == 0, done.stderr
    assert [p["result"] for p in json.loads(done.stdout)["probes"]] == ["allow", "allow", "deny"]
    root_guard.check()


def test_run_json_gives_each_probe_its_flow_log_record(root_guard: Any) -> None:
    done = pyfelix("lab", "run", str(SCENARIOS / "calico-gnp-order.yaml"), "-o", "json",
                   "--dataplane", "iptables")
    assert done.returncode == 0, done.stderr
    probes = json.loads(done.stdout)["probes"]
    assert probes and all(p["flow"]["action"] == p["result"] for p in probes), probes
    policies = {(p["from"], p["port"]): p["flow"]["policy"] for p in probes}
    assert policies[("prod/scanner", 443)] == "0|default|deny-scanner|deny|0", probes
    assert policies[("prod/client", 443)] == "0|default|allow-https|allow|0", probes
    root_guard.check()


def test_malformed_scenario_is_rejected_before_anything_is_built(
    tmp_path: Path, root_guard: Any
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("namespaces: [{name: x}]\npods:\n  - {namespace: x, name: a}\n"
                        "  - {name: b}\n")
    done = pyfelix("lab", "run", str(scenario))
    assert done.returncode == 1
    assert "pods[1].namespace: missing" in done.stderr
    assert str(scenario) in done.stderr
    assert "Traceback" not in done.stderr
    root_guard.check()


@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_demo_shows_the_policy_take_effect(dataplane: str, root_guard: Any) -> None:
    done = pyfelix("lab", "demo", "--dataplane", dataplane, "--probe-timeout", "0.5")
    assert done.returncode == 0, done.stderr
    before_text, _, after_text = done.stdout.partition("AFTER")
    after_text, _, flows_text = after_text.partition("FLOW LOGS")
    flows_text, _, explain_text = flows_text.partition("EXPLAIN the first denial")

    def matrix(text: str) -> dict[str, list[str]]:
        return {line.split()[0]: line.split()[1:] for line in text.splitlines()
                if line.split() and "/" in line.split()[0] and "\\" not in line
                and not line.startswith(" ")}

    before, after = matrix(before_text), matrix(after_text)
    assert set(before) == set(after) == {"web/frontend", "web/cache", "db/postgres",
                                         "other/intruder"}
    assert all(cells == ["allow"] * 3 for cells in before.values()), done.stdout
    # columns are sorted: db/postgres:5432/TCP first; only the intruder loses postgres
    assert after["other/intruder"][0] == "deny*", done.stdout
    changed = [(src, c) for src, cells in after.items() for c in cells if c.endswith("*")]
    assert changed == [("other/intruder", "deny*")], done.stdout
    # every probe after policy has its flow-log record: the intruder's postgres probe as a
    # deny at the end of the tier (db-from-web does not select it), the others allowed
    flows = [line.split() for line in flows_text.splitlines()[2:] if line.strip()]
    assert len(flows) == 12 and all(row[3] == row[2] for row in flows), done.stdout
    [denied] = [row for row in flows if row[2] == "deny"]
    assert denied[:2] == ["other/intruder", "db/postgres:5432/TCP"], done.stdout
    assert "__TIER_END__" in denied[4] and denied[5] == "dst", done.stdout
    to_db = [row for row in flows if row[1] == "db/postgres:5432/TCP" and row[2] == "allow"]
    assert len(to_db) == 2 and all("db-from-web|allow|0" in row[4] for row in to_db), done.stdout
    # and explain, run beside node2's agent, gives the same verdict
    assert "--from other/intruder --to db/postgres --port 5432" in explain_text, done.stdout
    assert "deny" in explain_text.lower(), done.stdout
    if dataplane == "bpf":  # the map dump, read from the pins while the lab was up
        assert "BPF map ipsets on node2 (3 entries):" in done.stdout, done.stdout
    root_guard.check()


def test_sweep_json(root_guard: Any) -> None:
    done = pyfelix("lab", "sweep", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert {"removed_runs", "removed_netns", "killed_pids", "live_runs", "orphan_netns",
            "removed_scratch_pin_dirs", "errors"} == set(json.loads(done.stdout))
    root_guard.check()

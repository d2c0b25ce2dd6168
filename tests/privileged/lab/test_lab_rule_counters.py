"""Per-rule counters grow with real traffic (BPF dataplane, real agent, lab namespaces), as
`pyfelix bpf rules dump` shows them: each rule named by policy, tier, direction and index,
its match criteria as written (selectors, not IP-set ids), and the end-of-tier deny.

Scenario tests/lab/scenarios/calico-gnp-order.yaml: `deny-scanner` (Deny from role ==
'scanner') before `allow-https` (Allow TCP 443) on the api pod. Its probes run once, the
dump is read (the real CLI in the node's namespace), the probes run ROUNDS more times, and
the dump again: the allow rule, the deny rule and the tier's end deny each grew by at least
one packet per round (each probe is a new connection: its first packet goes through policy;
retransmitted SYNs of a denied one do too), and a rule no probe exercises did not move.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import load_scenario

pytestmark = pytest.mark.privileged

SCENARIOS = Path(__file__).resolve().parents[2] / "lab" / "scenarios"
REPO = Path(__file__).resolve().parents[3]
ROUNDS = 5
METRICS_PORT = 9091


def _dump(lab: LabRunner) -> list[dict[str, Any]]:
    [(name, node)] = lab.topology.nodes.items()
    env = {**os.environ, "FELIX_BPFPINDIR": str(lab.bpffs_dir / name), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["nsenter", f"--net=/run/netns/{node.netns}", sys.executable, "-m", "pyfelix.cli.main",
         "bpf", "rules", "dump", "-o", "json", "--datastore", str(lab.datastore_dir),
         "--hostname", name], capture_output=True, text=True, timeout=120, env=env,
        check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _row(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    assert len(found) == 1, (want, rows)
    return found[0]


@pytest.mark.timeout(300)
def test_rule_counters_grow_with_traffic_and_name_their_rules(root_guard: Any) -> None:
    scenario = load_scenario(SCENARIOS / "calico-gnp-order.yaml")
    agents = AgentProcesses("bpf", extra_env={"FELIX_PROMETHEUSMETRICSENABLED": "true",
                                              "FELIX_PROMETHEUSMETRICSPORT": str(METRICS_PORT)})
    with LabRunner(scenario, agents=agents, dataplane="bpf",
                   program_routes=False, probe_timeout=1.0) as lab:
        lab.build()
        lab.start_agents()
        results = lab.run_steps()
        assert not [r for r in results if r.mismatch]
        before = _dump(lab)
        deny = _row(before, policy="deny-scanner", direction="ingress", rule=0)
        assert deny["tier"] == "default" and deny["action"] == "deny"
        assert 'role == "scanner"' in deny["match"] and "s:" not in deny["match"]
        allow = _row(before, policy="allow-https", direction="ingress", rule=0)
        assert allow["action"] == "allow" and "tcp" in allow["match"] and "443" in allow["match"]
        tier_end = _row(before, policy=None, tier="default", direction="ingress")
        for row in (deny, allow, tier_end):
            assert row["packets"] >= 1 and row["bytes"] >= 40 * row["packets"], row
        for _ in range(ROUNDS):
            again = lab.run_probes(scenario.steps[0].probes)
            assert not [r for r in again if r.mismatch]
        after = _dump(lab)
        metrics = _metrics(lab)
        scanner_ip = str(lab.topology.pods["prod/scanner"].spec.ip)
    for row in (deny, allow, tier_end):
        grown = _row(after, counter=row["counter"])
        assert grown["packets"] >= row["packets"] + ROUNDS, (row, grown)
        assert grown["bytes"] > row["bytes"]
    # the client's egress is allowed by its profile rule, never by the api's policies:
    # a rule of another direction that nothing exercised stays where it was
    untouched = [r for r in before if r["direction"] == "egress" and r["packets"] == 0]
    for row in untouched:
        assert _row(after, counter=row["counter"])["packets"] == 0, row
    # Prometheus: Felix's denied metrics per deciding rule and source; per-policy counters
    denied = _sample(metrics, "calico_denied_packets",
                     policy="default|deny-scanner|0|deny", srcIP=scanner_ip)
    assert denied >= ROUNDS + 1
    assert _sample(metrics, "calico_denied_bytes", policy="default|deny-scanner|0|deny",
                   srcIP=scanner_ip) >= 40 * denied
    assert _sample(metrics, "pyfelix_policy_packets_total", tier="default",
                   policy="allow-https", action="allow") >= ROUNDS + 1
    assert _sample(metrics, "pyfelix_policy_packets_total", tier="default",
                   policy="__TIER_END__", action="deny") >= ROUNDS + 1
    root_guard.check()


def _metrics(lab: LabRunner) -> str:
    [node] = lab.topology.nodes.values()
    script = ("import urllib.request\nprint(urllib.request.urlopen("
              f"'http://127.0.0.1:{METRICS_PORT}/metrics', timeout=5).read().decode())")
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{node.netns}", sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _sample(text: str, name: str, **labels: str) -> float:
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric == name and want <= set(rest.rstrip("}").split(",")):
            return float(value)
    raise AssertionError(f"{name}{labels} not in /metrics")


@pytest.mark.timeout(300)
def test_explain_says_loudly_when_the_program_and_the_calc_graph_disagree(
        root_guard: Any) -> None:
    """The allowing record of client -> api:443 is turned into a DENY behind the agent's
    back (a pinned-map write): `pyfelix explain` must run the real program (which now
    denies), see that the calc graph allows, and exit 3 with agree: false. Before the write
    the same command agrees and exits 0."""
    import dataclasses

    from pyfelix.agent.bpf.maps import rules as rules_map
    from pyfelix.agent.bpf.maps.base import BpfMap

    scenario = load_scenario(SCENARIOS / "calico-gnp-order.yaml")
    with LabRunner(scenario, agents=AgentProcesses("bpf"), dataplane="bpf",
                   program_routes=False, probe_timeout=1.0) as lab:
        lab.build()
        lab.start_agents()
        lab.enter_step(scenario.steps[0])
        [(name, node)] = lab.topology.nodes.items()
        pin_dir = str(lab.bpffs_dir / name)

        def explain() -> subprocess.CompletedProcess[str]:
            env = {**os.environ, "FELIX_BPFPINDIR": pin_dir, "PYTHONPATH": str(REPO)}
            return subprocess.run(
                ["nsenter", f"--net=/run/netns/{node.netns}", sys.executable, "-m",
                 "pyfelix.cli.main", "explain", "--datastore", str(lab.datastore_dir),
                 "--hostname", name, "--from", "prod/client", "--to", "prod/api", "--port",
                 "443", "-o", "json"], capture_output=True, text=True, timeout=120, env=env,
                check=False)

        ok = explain()
        assert ok.returncode == 0, ok.stderr
        out = json.loads(ok.stdout)
        assert (out["verdict"], out["policy"], out["agree"]) == ("allow", "allow-https", True)
        ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
        record = ingress["kernel"]["trace"]["chain_start"] + ingress["kernel"]["trace"]["record"]
        with BpfMap.open_pinned(rules_map.PARAMS, pin_dir) as m:
            key = rules_map.encode_index(record)
            rec = rules_map.decode(m.lookup(key))
            assert rec.action == rules_map.Action.ALLOW
            m.update(key, rules_map.encode(dataclasses.replace(rec, action=rules_map.Action.DENY)))
        bad = explain()
        assert bad.returncode == 3, bad.stdout + bad.stderr
        out = json.loads(bad.stdout)
        assert out["agree"] is False and out["kernel_verdict"] == "deny"
        assert out["verdict"] == "allow"  # the calc graph's, unchanged
        assert "disagree" in bad.stderr
    root_guard.check()

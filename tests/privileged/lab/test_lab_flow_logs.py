"""Flow logs on both dataplanes with a real agent in lab namespaces (BPF: the tc programs'
ring buffer; iptables: the NFLOG rules), one lab per dataplane:
- every probe of tests/lab/scenarios/calico-gnp-order.yaml appears in `pyfelix flows -o
  json` (the real CLI over the agent's flows.log) with the probe's action and the deciding
  policy rule, reported by the destination's ingress policy (the source's egress is its
  profile's allow), with the pods named; and in the lab's own join (`collect_flows`);
- a flood of 100,000 new flows a second for 5 s (the rate counted by the kernel) leaves the
  agent responsive with its drops counted (flow_flood.py says how);
- the allowed probe's flow ends with its packet and byte counts: BPF when the conntrack
  cleaner deletes the closed flow's entries (BPFConntrackTimeouts TCPFinsSeen=3s and the
  cleaner every second here: Felix's 30 s default would be most of the test's time),
  iptables on conntrack's destroy events (the node namespace's TCP closing timeouts cut to
  1 s here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.flows import read_records
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import load_scenario
from tests.privileged.lab.flow_flood import FLOOD_AGENT_ENV, flood_and_check

pytestmark = pytest.mark.privileged

SCENARIOS = Path(__file__).resolve().parents[2] / "lab" / "scenarios"
REPO = Path(__file__).resolve().parents[3]

EXPECTED = {  # (source, destination port) -> (action, Calico policy string)
    ("client", 443): ("allow", "0|default|allow-https|allow|0"),
    ("client", 9000): ("deny", "0|default|default.__TIER_END__|deny|-1"),
    ("scanner", 443): ("deny", "0|default|deny-scanner|deny|0"),
}


def _flows(directory: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "flows", "--dir",
                           str(directory), "-o", "json"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("dataplane", ["bpf", "iptables"])
def test_flow_logs_record_every_probe_survive_a_flood_and_end_flows(
        root_guard: Any, tmp_path: Path, dataplane: str) -> None:
    """One lab per dataplane (the BPF build is the costly part): the probes' records, then
    the flood (flow_flood.flood_and_check), then the allowed probe's flow end,
    whose closing timers ran meanwhile."""
    agents = AgentProcesses(dataplane, flow_logs=True, extra_env={
        "FELIX_BPFCONNTRACKCLEANUPINTERVAL": "1", "FELIX_BPFCONNTRACKTIMEOUTS": "TCPFinsSeen=3s",
        **FLOOD_AGENT_ENV})
    scenario = load_scenario(SCENARIOS / "calico-gnp-order.yaml")
    with LabRunner(scenario, agents=agents, dataplane=dataplane, program_routes=False,
                   probe_timeout=1.0) as lab:
        lab.build()
        [node] = lab.topology.nodes.values()
        if dataplane == "iptables":  # conntrack's closing timeouts: the flow end sooner
            for state in ("time_wait", "close", "close_wait", "fin_wait", "last_ack"):
                subprocess.run(["ip", "netns", "exec", node.netns, "sysctl", "-qw",
                                f"net.netfilter.nf_conntrack_tcp_timeout_{state}=1"],
                               check=True, timeout=30)
        lab.start_agents()
        results = lab.run_steps()
        assert not [r for r in results if r.mismatch]
        # the lab's own join (what `lab run -o json` reports): every probe has the record
        # of its verdict, naming the deciding policy where the scenario says which
        probed = lab.collect_flows()
        for r in probed:
            assert r.flow is not None and r.flow["action"] == r.result, r
            expected = EXPECTED.get((r.probe.source.split("/")[1], r.probe.port))
            if expected is not None and r.probe.target == "prod/api":
                assert (r.flow["action"], r.flow["policy"]) == expected, r
        assert all("flow" in r.to_json() for r in probed)
        [flows_dir] = agents.flow_log_dirs.values()
        ips = {key: str(pod.spec.ip) for key, pod in lab.topology.pods.items()}
        deadline = time.monotonic() + 15
        while True:
            records = _flows(flows_dir) if (flows_dir / "flows.log").exists() else []
            seen = {(r["source_name"], r["dest_port"]): r for r in records
                    if r["reporter"] == "dst" and r["dest_name"] == "api"}
            if set(EXPECTED) <= set(seen) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        flood = flood_and_check(lab, agents, dataplane, tmp_path)
        ends = _flow_ends(lab, agents)
    for (source, port), (action, policy) in EXPECTED.items():
        rec = seen.get((source, port))
        assert rec is not None, (source, port, records)
        assert (rec["action"], rec["policies"]["all_policies"]) == (action, [policy]), rec
        assert rec["source_ip"] == ips[f"prod/{source}"] and rec["dest_ip"] == ips["prod/api"]
        assert (rec["source_namespace"], rec["dest_namespace"], rec["proto"]) == (
            "prod", "prod", "tcp")
        assert rec["num_flows"] >= 1 and rec["policy_packets"] >= 1
    # the allowed probe api -> client:80, reported by the client's ingress profile... or
    # policy: the client has no policy, so its profile decides
    back = [r for r in records if r["source_name"] == "api" and r["dest_name"] == "client"
            and r["dest_port"] == 80 and r["reporter"] == "dst"]
    assert back and back[0]["action"] == "allow", records
    flood.check()
    assert not [r for r in flood.after if r.mismatch], flood.after
    _check_flow_ends(ends)
    root_guard.check()


def _flow_ends(lab: LabRunner, agents: AgentProcesses) -> list[dict[str, Any]]:
    """The client -> api:443 probe's flow-end records (BPF: its conntrack entries expire
    3 s after the FINs, the cleaner runs every second; iptables: conntrack's destroy
    events), waited for up to 90 s."""
    [probe] = [r for r in lab.report.results
               if (r.probe.source, r.probe.port, r.step) == ("prod/client", 443, 0)]
    client = str(lab.topology.pods["prod/client"].spec.ip)
    deadline = time.monotonic() + 90
    while True:
        ends = [r for r in read_records(agents.flow_log_dirs.values())
                if r.get("num_flows_completed") and r["source_ip"] == client
                and r["dest_port"] == 443 and probe.sport in r["source_ports"]]
        if {r["reporter"] for r in ends} == {"src", "dst"} or time.monotonic() > deadline:
            return ends
        time.sleep(1)


def _check_flow_ends(ends: list[dict[str, Any]]) -> None:
    by_reporter = {r["reporter"]: r for r in ends}
    assert set(by_reporter) == {"src", "dst"}, ends
    ingress = by_reporter["dst"]
    assert ingress["policies"]["all_policies"] == ["0|default|allow-https|allow|0"], ingress
    assert by_reporter["src"]["policies"]["all_policies"][0].startswith("0|__PROFILE__|")
    for rec in ends:
        # the probe's connection: handshake, token out and back, close (>= 6 packets)
        assert rec["action"] == "allow" and rec["flow_packets"] >= 6, rec
        assert rec["flow_bytes"] > rec["flow_packets"] * 40, rec

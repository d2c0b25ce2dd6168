"""The built-in demo: probe every pod port from every other pod and tabulate the verdicts.

Role: what `pyfelix lab demo` (and `make demo`) shows. Library side only: the demo scenario
path, the all-pairs probe list, the matrix of results, and `run_demo()`, which runs the lab
with real agents and reports the matrix BEFORE the scenario's policies (only the cluster
documents exist) and AFTER them, plus a dump of every node's BPF maps taken while the lab
is still up, the flow logs' record of each probe after policy, and `pyfelix explain`
(run in the destination node's namespace beside its agent) of the first denial the policy
caused (the first starred cell); the CLI formats it.

Inputs: a `Scenario` (default: `DEMO_SCENARIO`), then the `ProbeResult`s of running it.
Outputs: a matrix {source pod: {"ns/pod:port/proto": "allow"|"deny"}} per phase; for a
scenario prepared by `lab.family` for ipv6 or dual the columns end in ` v4` / ` v6` (under
dual: the dual-stack matrix, each pod port probed over both families).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyfelix.lab.probe import ProbeResult
from pyfelix.lab.scenario import ProbeSpec, Scenario, Step

DEMO_SCENARIO = Path(__file__).parent / "scenarios" / "demo.yaml"
# the demo's probes are pod to pod: the wait for their flow-log records ends as soon as each
# has its deciding one; the bound matters only on a loaded machine (a CI run saw a node's
# deny record miss the lab's 5 s bound)
DEMO_FLOW_WAIT_SECONDS = 15.0


def matrix_probes(scenario: Scenario) -> tuple[ProbeSpec, ...]:
    """One probe from each pod to each port of every other pod, over each of the target's
    addresses (IPv4 then IPv6 under `--ip-family dual`: the dual-stack matrix)."""
    return tuple(
        ProbeSpec(
            source=source.key,
            target=target.key,
            target_ip=address,
            port=port.port,
            protocol=port.protocol,
        )
        for source in scenario.pods
        for target in scenario.pods
        if target.key != source.key
        for port in target.ports
        for address in target.addresses
    )


def with_matrix_probes(scenario: Scenario) -> Scenario:
    """The scenario reduced to one step: its top-level resources, then all-pairs probes."""
    step = Step(apply=scenario.resources, probes=matrix_probes(scenario))
    return dataclasses.replace(scenario, steps=(step,))


def matrix_column(probe: ProbeSpec, with_family: bool = False) -> str:
    """`ns/pod:port/PROTO`, with ` v4` / ` v6` appended when `with_family` (IPv6 labs)."""
    family = f" v{probe.family}" if with_family else ""
    return f"{probe.target}:{probe.port}/{probe.protocol}{family}"


def connectivity_matrix(results: Iterable[ProbeResult],
                        with_family: bool = False) -> dict[str, dict[str, str]]:
    matrix: dict[str, dict[str, str]] = {}
    for result in results:
        column = matrix_column(result.probe, with_family)
        matrix.setdefault(result.probe.source, {})[column] = result.result
    return matrix


DUMPED_MAPS = ("endpoints", "ipsets", "rules")


@dataclass
class DemoReport:
    scenario: Scenario
    dataplane: str
    before: dict[str, dict[str, str]]
    after: dict[str, dict[str, str]]
    map_dumps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    flows: list[ProbeResult] = field(default_factory=list)  # after policy, with `flow`
    explained: ProbeSpec | None = None  # the first denial the policy caused
    explain_output: str = ""  # `pyfelix explain`'s text output for it


def first_new_denial(before: list[ProbeResult], after: list[ProbeResult]) -> ProbeSpec | None:
    """The first IPv4 probe allowed before policy and denied after (the first starred
    IPv4 cell): `pyfelix explain` explains IPv4 flows only."""
    was = {(r.probe.source, matrix_column(r.probe, True)): r.result for r in before}
    for r in after:
        if r.probe.family == 4 and r.result == "deny" and was.get((r.probe.source,
                                           matrix_column(r.probe, True))) == "allow":
            return r.probe
    return None


def explain_in_node(runner: Any, probe: ProbeSpec, dataplane: str) -> str:
    """`pyfelix explain` of `probe`, run in its destination node's namespace with that
    node's agent settings (datastore, hostname, pin dir); its output (or error) as text."""
    pod = next(p for p in runner.scenario.pods if p.key == probe.target)
    node = runner.topology.nodes[pod.node]
    env = {**os.environ, "FELIX_BPFPINDIR": str(runner.bpffs_dir / pod.node),
           "FELIX_BPFENABLED": "true" if dataplane == "bpf" else "false"}
    args = ["explain", "--datastore", str(runner.datastore_dir), "--hostname", pod.node,
            "--from", probe.source, "--to", probe.target, "--protocol", probe.protocol]
    if probe.protocol.upper() != "ICMP":
        args += ["--port", str(probe.port)]
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{node.netns}", sys.executable, "-m",
                           "pyfelix.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    return proc.stdout + (proc.stderr if proc.returncode else "")


def run_demo(scenario: Scenario, *, dataplane: str, probe_timeout: float,
             interface_prefix: str, progress: Callable[[str], None] | None = None) -> DemoReport:
    """Build the lab with one agent per node, probe all pairs, apply the scenario's
    resources, probe again, dump the first node's BPF maps (BPF dataplane), tear down."""
    from pyfelix.lab.agents import AgentProcesses
    from pyfelix.lab.runner import LabRunner

    say = progress or (lambda message: None)
    probes = matrix_probes(scenario)
    agents = AgentProcesses(dataplane, interface_prefix=interface_prefix, flow_logs=True)
    runner = LabRunner(scenario, agents=agents, dataplane=dataplane, program_routes=False,
                       probe_timeout=probe_timeout, interface_prefix=interface_prefix)
    with runner:
        say(f"demo {runner.run_id}: building {len(scenario.nodes)} nodes, "
            f"{len(scenario.pods)} pods, starting one {dataplane} agent per node")
        runner.build()
        runner.start_agents()
        runner.wait_in_sync()
        say(f"demo {runner.run_id}: probing {len(probes)} pod/port pairs before policy")
        before_results = runner.run_probes(probes, 0)
        with_family = scenario.ip_family != "ipv4"
        before = connectivity_matrix(before_results, with_family)
        say(f"demo {runner.run_id}: applying {len(scenario.resources)} resource(s)")
        runner.apply_resources(scenario.resources)
        runner.wait_in_sync()
        say(f"demo {runner.run_id}: probing again")
        after_results = runner.run_probes(probes, 1)
        after = connectivity_matrix(after_results, with_family)
        say(f"demo {runner.run_id}: reading the nodes' flow logs")
        flows = runner.collect_flows(DEMO_FLOW_WAIT_SECONDS)[len(before_results):]
        explained = first_new_denial(before_results, after_results)
        explain_output = ""
        if explained is not None:
            say(f"demo {runner.run_id}: explaining {explained.source} -> {explained.target}")
            explain_output = explain_in_node(runner, explained, dataplane)
        dumps: dict[str, list[dict[str, Any]]] = {}
        if dataplane == "bpf":
            from pyfelix.agent.bpf.maps import dump_pinned

            for node in scenario.nodes:
                for name in DUMPED_MAPS:
                    dumps[f"{name} on {node}"] = dump_pinned(name,
                                                             str(runner.bpffs_dir / node))
        say(f"demo {runner.run_id}: tearing down")
    return DemoReport(scenario, dataplane, before, after, dumps, dict(runner.report.timings),
                      flows, explained, explain_output)

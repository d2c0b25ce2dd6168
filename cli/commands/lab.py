"""`pyfelix lab`: build scenarios in network namespaces, probe them, tear them down.

Subcommands call `lab` and only format: `run` (probe table or JSON, exit 1 on any
`expect` mismatch), `sweep` (remove stale lab runs), `demo` (the built-in scenario as a
connectivity matrix). Progress and notices go to stderr so `-o json` stdout stays parseable.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import click

OUTPUT_FORMATS = ("table", "json")
DATAPLANES = ("bpf", "iptables")
IP_FAMILIES = ("ipv4", "ipv6", "dual")  # as lab.family.IP_FAMILIES (the CLI imports lazily)
DEFAULT_SYNC_TIMEOUT_SECONDS = 60.0  # as lab.runner.DEFAULT_SYNC_TIMEOUT_SECONDS
NO_AGENT_NOTICE = (
    "notice: --no-agent: no agent runs, so no policy is enforced: the scenario's resources "
    "are only written to the lab datastore, and every probe to a listening port comes out "
    "allow."
)


def _require_root() -> None:
    if os.geteuid() != 0:
        raise click.ClickException("the lab creates network namespaces: run it as root")


def _interface_prefix() -> str:
    """Felix's FELIX_INTERFACEPREFIX (first entry), so the lab names veths as the agent."""
    return os.environ.get("FELIX_INTERFACEPREFIX", "cali").split(",")[0].strip() or "cali"


def _stderr(message: str) -> None:
    click.echo(message, err=True)


def _format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


def _run_lab(scenario: Any, **options: Any) -> Any:
    """Run a scenario; on SIGINT/SIGTERM report and exit 130/143 after teardown."""
    from pyfelix.lab.agents import AgentStartError
    from pyfelix.lab.runner import LabInterrupted, LabSyncTimeout, LabTeardownError, run_scenario

    try:
        return run_scenario(scenario, progress=_stderr, **options)
    except LabInterrupted as exc:
        _stderr(f"lab: interrupted by {signal.Signals(exc.signum).name}; torn down")
        sys.exit(128 + exc.signum)
    except LabTeardownError as exc:
        raise click.ClickException(f"{exc}\nrun `pyfelix lab sweep` to retry") from exc
    except ValueError as exc:  # e.g. FELIX_INTERFACEPREFIX too long for interface names
        raise click.ClickException(str(exc)) from exc
    except (AgentStartError, LabSyncTimeout) as exc:  # torn down already; say why, no trace
        raise click.ClickException(str(exc)) from exc


@click.group("lab")
def command() -> None:
    """Build network-namespace labs from scenarios and probe them.

    \b
    Examples:
      pyfelix lab run scenario.yaml
      pyfelix lab run scenario.yaml --dataplane bpf -o json
      pyfelix lab run scenario.yaml --hold 600     # keep it up to inspect; Ctrl-C ends
      pyfelix lab run scenario.yaml --ip-family dual   # every probe over IPv4 and IPv6
      pyfelix lab sweep
      pyfelix lab demo
    """


@command.command("run")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--dataplane", type=click.Choice(DATAPLANES), default="bpf", show_default=True,
              help="Dataplane the node agents enforce policy with.")
@click.option("--no-agent", is_flag=True,
              help="Build and probe the topology only: no agent, no policy, no BGP.")
@click.option("-o", "--output", type=click.Choice(OUTPUT_FORMATS), default="table",
              show_default=True)
@click.option("--probe-timeout", type=click.FloatRange(min=0.05, max=30.0), default=1.0,
              show_default=True, help="Seconds before a probe without answer counts as deny.")
@click.option("--static-routes/--no-static-routes", default=None,
              help="Static cross-node routes to remote pods instead of BGP (default: only "
                   "with --no-agent).")
@click.option("--hold", type=click.FloatRange(min=0.0), default=0.0,
              help="Keep the lab up this many seconds after the probes, for inspection.")
@click.option("--typha", is_flag=True,
              help="Run `pyfelix typha` on the first node; every agent and confd reads the "
                   "datastore through it.")
@click.option("--flow-logs/--no-flow-logs", default=True, show_default=True,
              help="Agents write flow logs; each probe reports what they recorded about it "
                   "(`flow`: action and deciding policy).")
@click.option("--ip-family", type=click.Choice(IP_FAMILIES), default="ipv4",
              show_default=True,
              help="Pods' addresses and probes: IPv4, IPv6 (each lab address and CIDR "
                   "mapped to its IPv6 twin) or both (every probe runs over each family).")
@click.option("--sync-timeout", type=click.FloatRange(min=1.0), default=None,
              envvar="PYFELIX_LAB_SYNC_TIMEOUT", show_envvar=True,
              help=f"Seconds the agents get to report in sync before the run fails "
                   f"[default: {DEFAULT_SYNC_TIMEOUT_SECONDS:g}; more on an emulated CPU, "
                   f"where compiling the BPF programs alone can take minutes].")
def run_command(
    scenario_file: str,
    dataplane: str,
    no_agent: bool,
    output: str,
    probe_timeout: float,
    static_routes: bool | None,
    hold: float,
    typha: bool,
    flow_logs: bool,
    ip_family: str,
    sync_timeout: float | None,
) -> None:
    """Build SCENARIO_FILE's topology, run its steps and probes, tear everything down.

    Exit status 1 when any probe's result differs from its `expect`.

    \b
    Examples:
      pyfelix lab run tests/lab/scenarios/calico-gnp-order.yaml -o json
      pyfelix lab run my.yaml --probe-timeout 0.5
      pyfelix lab run my.yaml --dataplane iptables --typha
      pyfelix lab run tests/lab/scenarios/two-node-policy.yaml --ip-family dual -o json
    """
    from pyfelix.lab.family import apply_ip_family
    from pyfelix.lab.scenario import ScenarioError, load_scenario

    try:
        scenario = apply_ip_family(load_scenario(scenario_file), ip_family)
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from exc
    _require_root()
    if typha and no_agent:
        raise click.UsageError("--typha serves the agents: it cannot go with --no-agent")
    agents = None
    if no_agent:
        _stderr(NO_AGENT_NOTICE)
    else:
        from pyfelix.lab.agents import AgentProcesses

        agents = AgentProcesses(dataplane, interface_prefix=_interface_prefix(),
                                bgp=False if static_routes else None, typha=typha,
                                flow_logs=flow_logs)
    report = _run_lab(
        scenario,
        agents=agents,
        dataplane=None if no_agent else dataplane,
        program_routes=no_agent,
        probe_timeout=probe_timeout,
        static_cross_node_routes=no_agent if static_routes is None else static_routes,
        interface_prefix=_interface_prefix(),
        hold_seconds=hold,
        sync_timeout=DEFAULT_SYNC_TIMEOUT_SECONDS if sync_timeout is None else sync_timeout,
    )
    if output == "json":
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        flows = any(r.flows_collected for r in report.results)  # agents wrote flow logs
        rows = [
            [str(r.step), r.probe.source, r.probe.target, str(r.probe.port), r.probe.protocol,
             *([f"v{r.probe.family}"] if ip_family != "ipv4" else []), r.result,
             r.probe.expect or "-", *([_flow_cell(r)] if flows else []),
             "MISMATCH" if r.mismatch else ""]
            for r in report.results
        ]
        headers = ["STEP", "FROM", "TO", "PORT", "PROTO",
                   *(["FAMILY"] if ip_family != "ipv4" else []), "RESULT", "EXPECT",
                   *(["FLOW LOG"] if flows else []), ""]
        click.echo(_format_table(headers, rows))
        timings = ", ".join(f"{k} {v:.3f}" for k, v in report.timings.items())
        click.echo(f"timings (s): {timings}")
    if report.mismatches:
        _stderr(f"{len(report.mismatches)} probe(s) did not match their expect:")
        for r in report.mismatches:
            p = r.probe
            family = f" IPv{p.family}" if ip_family != "ipv4" else ""
            _stderr(f"  step {r.step}: {p.source} -> {p.target} {p.port}/{p.protocol}{family}: "
                    f"expected {p.expect}, got {r.result} ({r.detail})")
        sys.exit(1)


@command.command("sweep")
@click.option("--orphans", is_flag=True,
              help="Also remove pf<hex>-* namespaces that have no run directory.")
@click.option("-o", "--output", type=click.Choice(OUTPUT_FORMATS), default="table",
              show_default=True)
def sweep_command(orphans: bool, output: str) -> None:
    """Remove lab namespaces, processes and files left by runs that are no longer alive,
    and the scratch BPF pin directories of killed benchmarks and tests.

    Live runs (their lock is held) are never touched.

    \b
    Examples:
      pyfelix lab sweep
      pyfelix lab sweep --orphans -o json
    """
    _require_root()
    from pyfelix.lab.runstate import sweep_stale_runs

    report = sweep_stale_runs(include_orphans=orphans)
    if output == "json":
        click.echo(json.dumps(report.__dict__, indent=2, sort_keys=True))
    else:
        click.echo(f"removed runs: {' '.join(report.removed_runs) or '-'}")
        click.echo(f"removed namespaces: {' '.join(report.removed_netns) or '-'}")
        click.echo(f"killed processes: {' '.join(map(str, report.killed_pids)) or '-'}")
        click.echo(f"live runs left alone: {' '.join(report.live_runs) or '-'}")
        click.echo("removed scratch pin directories: "
                   f"{' '.join(report.removed_scratch_pin_dirs) or '-'}")
        if report.orphan_netns:
            click.echo(f"namespaces without a run directory (use --orphans): "
                       f"{' '.join(report.orphan_netns)}")
    if report.errors:
        raise click.ClickException("sweep incomplete:\n  " + "\n  ".join(report.errors))


@command.command("conformance", context_settings={"ignore_unknown_options": True,
                                                  "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def conformance_command(args: tuple[str, ...]) -> None:
    """Network-policy conformance suite (x/y/z x a/b/c matrices) on real agents.

    Options are the suite's own (`pyfelix lab conformance --help`): --dataplane, --case,
    --nodes, -o json, --list, --emit-scenario.
    """
    from pyfelix.lab.conformance.__main__ import main

    if "--list" not in args and "--help" not in args:
        _require_root()
    sys.exit(main(list(args), prog="pyfelix lab conformance"))


@command.command("demo")
@click.option("--dataplane", type=click.Choice(DATAPLANES), default="bpf", show_default=True)
@click.option("--probe-timeout", type=click.FloatRange(min=0.05, max=30.0), default=0.5,
              show_default=True)
@click.option("--ip-family", type=click.Choice(IP_FAMILIES), default="ipv4",
              show_default=True,
              help="dual: the dual-stack matrix, every pod port probed over IPv4 and IPv6.")
def demo_command(dataplane: str, probe_timeout: float, ip_family: str) -> None:
    """Run the built-in demo: who can reach whom before and after policy, and the maps.

    Two nodes (BGP between them), four pods in three namespaces, one Kubernetes
    NetworkPolicy (pyfelix/lab/scenarios/demo.yaml). Prints the connectivity matrix with no
    policy, then with the policy enforced by real agents, then each node's BPF maps, what
    the nodes' flow logs recorded of each probe, and `pyfelix explain` of the first denial.

    \b
    Examples:
      pyfelix lab demo
      pyfelix lab demo --dataplane iptables
      pyfelix lab demo --ip-family dual
    """
    from pyfelix.lab.demo import DEMO_SCENARIO, matrix_column, run_demo
    from pyfelix.lab.family import apply_ip_family
    from pyfelix.lab.runner import LabInterrupted
    from pyfelix.lab.scenario import load_scenario

    _require_root()
    scenario = apply_ip_family(load_scenario(DEMO_SCENARIO), ip_family)
    try:
        report = run_demo(scenario, dataplane=dataplane, probe_timeout=probe_timeout,
                          interface_prefix=_interface_prefix(), progress=_stderr)
    except LabInterrupted as exc:
        _stderr(f"lab: interrupted by {signal.Signals(exc.signum).name}; torn down")
        sys.exit(128 + exc.signum)
    click.echo(f"scenario {scenario.name}: {len(scenario.nodes)} nodes, {len(scenario.pods)} "
               f"pods, {dataplane} dataplane, {ip_family}; rows = from, columns = to\n")
    for title, matrix in (("BEFORE policy (cluster only):", report.before),
                          (f"AFTER {len(scenario.resources)} policy resource(s):",
                           report.after)):
        click.echo(title)
        columns = sorted({col for row in matrix.values() for col in row})
        rows = [[src, *[_changed(matrix[src].get(col, ""), report.before[src].get(col, ""))
                        for col in columns]] for src in sorted(matrix)]
        click.echo(_format_table(["FROM \\ TO", *columns], rows) + "\n")
    for name, rows in report.map_dumps.items():
        click.echo(f"BPF map {name} ({len(rows)} entries):")
        for row in rows[:12]:
            click.echo("  " + json.dumps(row, sort_keys=True))
        if len(rows) > 12:
            click.echo(f"  ... {len(rows) - 12} more (pyfelix bpf {name.split()[0]} dump)")
        click.echo("")
    click.echo("FLOW LOGS of the probes after policy (what the nodes recorded):")
    rows = [[r.probe.source, matrix_column(r.probe, ip_family != "ipv4"), r.result,
             _flow_cell(r),
             str((r.flow or {}).get("reporter", "-"))] for r in report.flows]
    click.echo(_format_table(["FROM", "TO", "PROBE", "FLOW LOG (ACTION POLICY)", "REPORTER"],
                             rows) + "\n")
    if report.explained is not None:
        p = report.explained
        click.echo(f"EXPLAIN the first denial (*): pyfelix explain --from {p.source} --to "
                   f"{p.target} --port {p.port} --protocol {p.protocol}")
        click.echo(report.explain_output.rstrip() + "\n")
    elif ip_family == "ipv6":
        click.echo("EXPLAIN: not shown under --ip-family ipv6 (pyfelix explain explains IPv4 "
                   "flows only)\n")
    timings = ", ".join(f"{k} {v:.3f}" for k, v in report.timings.items())
    click.echo(f"timings (s): {timings}")


def _flow_cell(result: Any) -> str:
    """`<action> <policy>` of what the flow logs recorded, `-` if nothing."""
    if not result.flow:
        return "-"
    return f"{result.flow['action']} {result.flow['policy']}"


def _changed(now: str, before: str) -> str:
    """Mark verdicts the policy changed, so the effect stands out in the matrix."""
    return f"{now}*" if before and now != before else now

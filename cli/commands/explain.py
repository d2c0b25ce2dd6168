"""`pyfelix explain`: the verdict this node gives a new connection, and why.

Combines the two halves: the calc graph's reasoning (`agent.calc.explain`: tiers, policies,
rules in order, the IP sets looked up) for the source pod's egress (when it is on this node)
and the destination pod's ingress (when it is on this node); and, in BPF mode, the real
program attached to each pod's interface run on a crafted packet (`agent.bpf.explain`,
BPF_PROG_TEST_RUN against the node's pinned maps; no traffic is sent). The two must agree on
the verdict and on the record that decided (its counter names the rule); a disagreement is
printed loudly (and `agree: false` in JSON; exit status 3). In iptables mode the chains the
packet traverses are named (Felix's layout, `agent.dataplane.iptables.names`).

`explain_flow()` is the library call (the conformance test runs it in-process for every
probe); the command formats its `dict`. Run beside the agent: in its network namespace and
with its settings (`--datastore`/PYFELIX_DATASTORE or Felix's datastore settings,
`--hostname`/NODENAME, FELIX_BPFPINDIR, FELIX_BPFENABLED).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pyfelix.cli.params import DATASTORE

if TYPE_CHECKING:
    from pyfelix.agent.bpf.explain import KernelVerdict
    from pyfelix.agent.calc.explain import DirectionVerdict, ExplainModel, Flow

PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132, "ICMP": 1}
# Source ports of crafted packets: outside the kernel's ephemeral range and the lab's
# probe ports, so the tuple is not a live flow that conntrack would pass before policy.
SPORT_RANGE = (30000, 32767)
EXIT_DISAGREE = 3

KernelRunner = Callable[[str, str, str, bytes], "KernelVerdict"]


def make_flow(src: str, dst: str, protocol: str, port: int, sport: int | None = None,
              icmp_type: int = 8, icmp_code: int = 0) -> Flow:
    from pyfelix.agent.calc.explain import Flow

    number = PROTOCOLS[protocol.upper()]
    if sport is None:
        sport = random.randint(*SPORT_RANGE)
    if number == 1:
        return Flow(src, dst, 1, sport=sport, dport=sport, icmp_type=icmp_type,
                    icmp_code=icmp_code)
    return Flow(src, dst, number, sport=sport, dport=port)


def flow_packet(flow: Flow) -> bytes:
    from pyfelix.agent.bpf import packets

    if flow.protocol == 6:
        return packets.tcp(flow.src, flow.dst, flow.sport, flow.dport, "S")
    if flow.protocol == 17:
        return packets.udp(flow.src, flow.dst, flow.sport, flow.dport)
    if flow.protocol == 132:
        return packets.sctp(flow.src, flow.dst, flow.sport, flow.dport)
    return packets.icmp(flow.src, flow.dst, flow.icmp_type, flow.icmp_code, ident=flow.sport)


def _chains(direction: DirectionVerdict, interface: str) -> list[str]:
    from pyfelix.agent.dataplane.iptables import names

    inbound = direction.direction == "ingress"
    chains = [names.endpoint_chain_name(interface, to_workload=inbound)]
    for step in direction.steps:
        chain = (names.policy_chain_name(step.tier, step.owner, inbound) if step.kind == "policy"
                 else names.profile_chain_name(step.owner, inbound))
        if chain not in chains:
            chains.append(chain)
    return chains


def _kernel_dict(k: KernelVerdict) -> dict[str, Any]:
    return {"hook": k.hook, "interface": k.interface, "prog_id": k.prog_id,
            "verdict": "allow" if k.allowed else "deny", "retval": k.retval,
            "decided_before_policy": k.decided_before_policy, "trace": k.trace,
            "counter": k.counter_name}


def explain_flow(model: ExplainModel, flow: Flow, *, dataplane: str, pin_dir: str | None = None,
                 kernel: KernelRunner | None = None) -> dict[str, Any]:
    """Explain `flow` on the model's node. BPF mode runs `kernel(pin_dir, interface, hook,
    packet)` (default `agent.bpf.explain.run_policy_program`, in this thread's namespace)."""
    from pyfelix.agent.calc.explain import EGRESS, INGRESS, ExplainError, explain_direction

    src_rec = model.directory.by_address(flow.src)
    dst_rec = model.directory.by_address(flow.dst)
    directions = []
    for record, direction in ((src_rec, EGRESS), (dst_rec, INGRESS)):
        endpoint = model.local_endpoint(record)
        if endpoint is None or record is None:
            continue
        reasoning = explain_direction(model, endpoint, record.name, direction, flow)
        entry = reasoning.as_dict()
        entry["interface"] = endpoint.name
        if dataplane == "iptables":
            entry["chains"] = _chains(reasoning, endpoint.name)
        if dataplane == "bpf":
            if kernel is None:
                from pyfelix.agent.bpf.explain import run_policy_program as kernel
            hook = "from_wep" if direction == EGRESS else "to_wep"
            assert pin_dir is not None
            k = kernel(pin_dir, endpoint.name, hook, flow_packet(flow))
            entry["kernel"] = _kernel_dict(k)
            problems = []
            if k.allowed != (reasoning.verdict == "allow"):
                problems.append(f"the program said {entry['kernel']['verdict']}, the calc "
                                f"graph {reasoning.verdict}")
            if k.decided_before_policy:
                problems.append("the program decided before policy (conntrack, source "
                                "check, no endpoint or service NAT)")
            elif k.counter_name != reasoning.counter_name:
                problems.append(f"the program's deciding record counts {k.counter_name!r}, "
                                f"the calc graph's decision is {reasoning.counter_name!r}")
            entry["agree"] = not problems
            entry["disagreement"] = "; ".join(problems) or None
        directions.append((reasoning, entry))
    if not directions:
        raise ExplainError(f"neither {flow.src} nor {flow.dst} is a workload endpoint of node "
                           f"{model.hostname}: nothing on this node polices the flow")
    denied = [d for d in directions if d[0].verdict == "deny"]
    deciding = denied[0] if denied else directions[-1]
    reasoning = deciding[0]
    rule: int | None = reasoning.rule
    out: dict[str, Any] = {
        "verdict": "deny" if denied else "allow",
        "policy": reasoning.policy, "tier": reasoning.tier, "rule": rule,
        "rule_text": reasoning.rule_text, "decided_by": reasoning.decided_by,
        "direction": reasoning.direction,
        "node": model.hostname, "dataplane": dataplane, "flow": flow.describe(),
        "source": src_rec.name if src_rec else None,
        "destination": dst_rec.name if dst_rec else None,
        "directions": [d[1] for d in directions],
        # addresses no workload endpoint of the datastore has: policy cannot say what
        # happens to them (a pod without its Pod document is dropped as "no endpoint")
        "unknown_addresses": [a for a, r in ((flow.src, src_rec), (flow.dst, dst_rec))
                              if r is None],
    }
    if dataplane == "bpf":
        out["agree"] = all(d[1]["agree"] for d in directions)
        kernel_denied = any(d[1]["kernel"]["verdict"] == "deny" for d in directions)
        out["kernel_verdict"] = "deny" if kernel_denied else "allow"
    return out


def render_text(out: dict[str, Any]) -> str:
    lines = [f"{out['flow']}  on node {out['node']} ({out['dataplane']} dataplane)"]
    head = out["verdict"].upper()
    if out["decided_by"] == "rule":
        where = (f"policy {out['tier']}/{out['policy']} rule {out['rule']}" if out["tier"]
                 else f"profile {out['policy']} rule {out['rule']}")
        head += f" by {where}: {out['rule_text']}"
    elif out["decided_by"] == "tier-end":
        head += f" at the end of tier {out['tier']} (no policy matched)"
    else:
        head += f" ({out['decided_by']}: nothing allowed it)"
    whose = out["destination"] if out["direction"] == "ingress" else out["source"]
    lines.append(f"verdict: {head}  [{out['direction']} of {whose}]")
    for address in out["unknown_addresses"]:
        lines.append(f"note: no workload endpoint has {address}: only the other end's policy "
                     "is shown (a workload interface without an endpoint drops everything)")
    if out.get("agree") is False:
        lines.append("!!! DISAGREEMENT: the loaded BPF program and the calc graph differ !!!")
    for d in out["directions"]:
        lines.append("")
        lines.append(f"{d['direction']} of {d['endpoint']} (interface {d['interface']}): "
                     f"{d['verdict']}")
        for t in d["tiers"]:
            if "tier" in t:
                lines.append(f"  tier {t['tier']} (default {t['default_action']}): "
                             f"{', '.join(t['policies'])}")
            else:
                lines.append(f"  profile {t['profile']}")
        for s in d["steps"]:
            owner = f"{s['tier']}/{s['policy']}" if s["tier"] else f"profile {s['policy']}"
            mark = "MATCH" if s["matched"] else "no   "
            lines.append(f"    {mark} {owner} rule {s['rule']}: {s['text']}")
            if not s["matched"] or s["ip_sets"]:
                lines.append(f"          {s['why']}")
            for lk in s["ip_sets"]:
                port = f" port {lk['port']}" if "port" in lk else ""
                lines.append(f"          ip set {lk['id']} ({lk['selector']}): {lk['address']}"
                             f"{port} {'is' if lk['member'] else 'is NOT'} a member")
        if d["decided_by"] != "rule":
            lines.append(f"    -> {d['decided_by']}: deny")
        if "chains" in d:
            lines.append(f"  iptables chains: {' -> '.join(d['chains'])}")
        if "kernel" in d:
            k = d["kernel"]
            lines.append(f"  BPF program {k['hook']} (prog id {k['prog_id']}) on a crafted "
                         f"packet: {k['verdict']}, deciding record counter {k['counter']}"
                         + (f", record {k['trace']['record']} of a {k['trace']['chain_len']}-"
                            f"record chain" if k["trace"] else ", decided before policy"))
            lines.append("  agrees with the calc graph" if d["agree"]
                         else f"  !!! DISAGREES: {d['disagreement']}")
    return "\n".join(lines)


def _dataplane(requested: str, model: ExplainModel) -> str:
    if requested != "auto":
        return requested
    from pyfelix.agent.config import parse_bool

    text = os.environ.get("FELIX_BPFENABLED") or (model.state.config or {}).get("BPFEnabled")
    return "bpf" if text is None or parse_bool(str(text)) else "iptables"


@click.command("explain")
@click.option("--from", "source", required=True, metavar="NS/POD|IP",
              help="The client: a pod (namespace/name) or an IPv4 address.")
@click.option("--to", "target", required=True, metavar="NS/POD|IP",
              help="The server: a pod (namespace/name) or an IPv4 address.")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Destination port (TCP, UDP, SCTP).")
@click.option("--protocol", type=click.Choice(sorted(PROTOCOLS), case_sensitive=False),
              default="TCP", show_default=True)
@click.option("--sport", type=click.IntRange(1, 65535), default=None,
              help="Source port (ICMP: echo id). Default: random in 30000-32767.")
@click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE", default=None,
              help="As `pyfelix agent --datastore` (default: Felix's datastore settings).")
@click.option("--hostname", envvar="NODENAME", required=True, metavar="NODE",
              help="This node's name, as the agent's. Env: NODENAME.")
@click.option("--dataplane", type=click.Choice(["auto", "bpf", "iptables"]), default="auto",
              show_default=True, help="auto: the agent's BPFEnabled (FELIX_BPFENABLED, then "
                                      "FelixConfiguration).")
@click.option("--pin-dir", envvar="FELIX_BPFPINDIR", default="/sys/fs/bpf/pyfelix",
              show_default=True, metavar="DIR", help="The agent's BPFPinDir.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for a watched datastore to be in sync.")
def command(source: str, target: str, port: int, protocol: str, sport: int | None,
            datastore: Any, hostname: str, dataplane: str, pin_dir: str, output: str,
            timeout: float) -> None:
    """Explain the verdict NODE gives a new connection from --from to --to.

    Prints each tier and policy considered, every rule in order with why it matched or not,
    the IP sets looked up (their selectors), and the deciding rule. In BPF mode the loaded
    program is also run on a crafted packet (BPF_PROG_TEST_RUN: no traffic is sent) and its
    verdict is shown beside the calc graph's; they must agree (exit status 3 if not). In
    iptables mode the chains are named. Run it in the node's network namespace.

    \b
    Examples:
      pyfelix explain --from default/client --to prod/db --port 5432 --hostname node1
      pyfelix explain --from 10.65.0.3 --to prod/db --protocol ICMP -o json
    """
    import logging

    from pyfelix.agent.bpf.explain import ExplainError as KernelExplainError
    from pyfelix.agent.calc.explain import ExplainError, compute_model
    from pyfelix.agent.calc.snapshot import CalcTimeout
    from pyfelix.agent.syncer.client import DatastoreClientError

    if protocol.upper() != "ICMP" and not port:
        raise click.UsageError(f"--port is required for {protocol.upper()}")
    if datastore is None:
        from pyfelix.agent.config import ConfigError, load_config
        from pyfelix.agent.felix_datastore import felix_datastore_location

        try:
            datastore = felix_datastore_location(load_config(), os.environ)
        except (ConfigError, ValueError) as exc:
            raise click.ClickException(f"no --datastore and no usable Felix datastore "
                                       f"settings: {exc}") from exc
    agent_log = logging.getLogger("pyfelix.agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)
    try:
        model = compute_model(datastore, hostname, timeout=timeout)
    except FileNotFoundError as exc:
        raise click.ClickException(f"datastore path not found: {exc.filename or datastore}"
                                   ) from exc
    except (DatastoreClientError, CalcTimeout) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        agent_log.setLevel(level)
    try:
        src, _ = model.resolve(source)
        dst, _ = model.resolve(target)
        flow = make_flow(src, dst, protocol, port, sport)
        out = explain_flow(model, flow, dataplane=_dataplane(dataplane, model), pin_dir=pin_dir)
    except (ExplainError, KernelExplainError) as exc:
        raise click.ClickException(str(exc)) from exc
    if output == "json":
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(render_text(out))
    if out.get("agree") is False:
        click.echo("error: the loaded BPF program and the calc graph disagree (see above)",
                   err=True)
        raise SystemExit(EXIT_DISAGREE)

"""`pyfelix calc`: what a node's dataplane would be programmed with, computed offline.

Calls `agent.calc.snapshot.compute` (validator + calc graph + event sequencer, no kernel)
and prints the result: tables by default, or with `-o json` the object of docs/ARCHITECTURE.md
section 11 (`endpoints` and `ipsets`, sorted; `host_endpoints` too when the node has any).
Warnings (invalid resources, datastore errors) go to stderr and do not change the output.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.cli.params import DATASTORE, DATASTORE_HELP

_MEMBERS_SHOWN = 4


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def _endpoint_rows(title: str, endpoints: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    rows = [[title, "INGRESS", "EGRESS", "PROFILES"]]
    for name, ep in endpoints.items():
        rows.append([name, ",".join(ep["ingress"]) or "-", ",".join(ep["egress"]) or "-",
                     ",".join(ep["profiles"]) or "-"])
    return rows


def _ipset_rows(ipsets: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["IPSET", "COUNT", "MEMBERS"]]
    for ipset in ipsets:
        members = ipset["members"]
        shown = ",".join(members[:_MEMBERS_SHOWN])
        if len(members) > _MEMBERS_SHOWN:
            shown += f",... (+{len(members) - _MEMBERS_SHOWN})"
        rows.append([ipset["id"], str(len(members)), shown or "-"])
    return rows


def render_tables(summary: dict[str, Any]) -> str:
    parts = [_table(_endpoint_rows("ENDPOINT", summary["endpoints"]))]
    if summary.get("host_endpoints"):
        parts.append(_table(_endpoint_rows("HOST ENDPOINT", summary["host_endpoints"])))
    parts.append(_table(_ipset_rows(summary["ipsets"])))
    return "\n\n".join(parts)


@click.command("calc")
@click.option("--datastore", required=True, type=DATASTORE, envvar="PYFELIX_DATASTORE",
              help=DATASTORE_HELP)
@click.option("--hostname", required=True, envvar="FELIX_FELIXHOSTNAME", metavar="NODE",
              help="The node to compute for (its endpoints are the local ones).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for a watched datastore to be in sync.")
def command(datastore: DatastoreLocation, hostname: str, output: str, timeout: float) -> None:
    """Compute, without touching the kernel, what NODE's dataplane would hold.

    Endpoints of NODE with their ingress/egress policies (in evaluation order: tiers, then
    order, then name) and profiles, and every IP set those policies use with its members.

    \b
    Examples:
      pyfelix calc --datastore ./resources --hostname node1
      pyfelix calc --datastore cluster.yaml --hostname node1 -o json
    """
    from pyfelix.agent.calc.snapshot import CalcTimeout, compute
    from pyfelix.agent.syncer.client import DatastoreClientError

    # The validator logs each rejected document; they are printed below, once, instead.
    # (The level is restored afterwards: run in-process, e.g. by a test, the command must
    # not silence the agent's loggers for whatever runs next.)
    agent_log = logging.getLogger("pyfelix.agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)
    try:
        snapshot = compute(datastore, hostname, timeout=timeout)
    except FileNotFoundError as exc:
        raise click.ClickException(f"datastore path not found: {exc.filename or datastore}"
                                   ) from exc
    except (DatastoreClientError, CalcTimeout) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        agent_log.setLevel(level)
    for warning in snapshot.warnings:
        click.echo(f"warning: {warning}", err=True)
    summary = snapshot.summary
    if output == "json":
        click.echo(json.dumps(summary, indent=2, sort_keys=False))
    else:
        click.echo(render_tables(summary))

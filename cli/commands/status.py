"""`pyfelix status`: the agent's sync and dataplane status, its status records in the
datastore, and (optionally) its BGP sessions.

Calls `agent.status.view.collect` and prints tables, or with `-o json` the collected object:
`{"agent": {...}, "nodes": [...], "endpoints": [...], "bgp": [...], "problems": [...]}`
(each key present when its source was given). Exit status 1 with `--check` when the node's
record is missing, expired or not in sync (for scripts and probes).
"""

from __future__ import annotations

import json

import click

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.cli.params import DATASTORE


@click.command("status")
@click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE",
              help="Read status records from this datastore (a directory or YAML file, or "
                   "etcd3://HOST:PORT). Env: PYFELIX_DATASTORE.")
@click.option("--hostname", envvar="FELIX_FELIXHOSTNAME", metavar="NODE",
              help="Only this node's records (default: every node).")
@click.option("--status-file", envvar="FELIX_STATUSFILE", metavar="PATH",
              help="The agent's status file (its StatusFile setting). Env: FELIX_STATUSFILE.")
@click.option("--bird-socket", metavar="PATH",
              help="Also show BGP protocols from the BIRD behind this control socket.")
@click.option("--check", is_flag=True,
              help="Exit 1 unless --hostname's record exists, is live and in sync.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def command(datastore: DatastoreLocation | None, hostname: str | None, status_file: str | None,
            bird_socket: str | None, check: bool, output: str) -> None:
    """Show the agent's sync state, status records and BGP sessions.

    \b
    Examples:
      pyfelix status --datastore ./resources
      pyfelix status --datastore etcd3://127.0.0.1:2379 --hostname node1 -o json
      pyfelix status --status-file /run/pyfelix/status.json --bird-socket /run/bird.ctl
      pyfelix status --datastore ./resources --hostname node1 --check
    """
    from pyfelix.agent.status.view import collect, render

    if check and not (hostname and datastore):
        raise click.UsageError("--check needs --hostname and --datastore")
    bgp = None
    if bird_socket:
        from pyfelix.confd.bird import BirdTools

        bgp = BirdTools().protocols(bird_socket)
    status = collect(datastore=datastore, status_file=status_file, hostname=hostname, bgp=bgp)
    if output == "json":
        click.echo(json.dumps(status, indent=2, sort_keys=True))
    else:
        click.echo(render(status))
    if check:
        nodes = status.get("nodes") or []
        if not nodes or nodes[0]["expired"] or not nodes[0]["in_sync"]:
            raise SystemExit(1)

"""`pyfelix flows`: the node's recent flows, from the agent's flow-log files.

Reads `<dir>/flows.log` and its rotations (`flows.log.N`, oldest first), the JSON lines the
flow-log managers write (BPF and iptables) (`agent.dataplane.managers.flow_logs`), filters them
and prints a table or, with `-o json`, one JSON object per line. `--follow` keeps printing
records as the agent appends them. The directory defaults to FELIX_FLOWLOGSFILEDIRECTORY,
else /var/log/calico/flowlogs (the agent's FlowLogsFileDirectory).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

FILE_NAME = "flows.log"


def read_records(directory: str) -> list[dict[str, Any]]:
    """Every record of the directory's flow-log files, oldest file first."""
    base = Path(directory) / FILE_NAME
    rotated = sorted(Path(directory).glob(f"{FILE_NAME}.*"),
                     key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    out = []
    for path in [*rotated, base]:
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def matches(rec: dict[str, Any], *, denied: bool, namespace: str | None,
            pod: str | None) -> bool:
    if denied and rec.get("action") != "deny":
        return False
    if namespace and namespace not in (rec.get("source_namespace"), rec.get("dest_namespace")):
        return False
    return not pod or pod in (rec.get("source_name"), rec.get("dest_name"))


def _row(rec: dict[str, Any]) -> list[str]:
    src = (f"{rec['source_namespace']}/{rec['source_name']}" if rec["source_type"] == "wep"
           else rec["source_ip"])
    dst = (f"{rec['dest_namespace']}/{rec['dest_name']}" if rec["dest_type"] == "wep"
           else rec["dest_ip"])
    port = "" if rec.get("dest_port") is None else f":{rec['dest_port']}"
    return [time.strftime("%H:%M:%S", time.localtime(rec["start_time"])), src, dst + port,
            rec["proto"], rec["action"].upper(), rec["reporter"],
            ",".join(rec["policies"]["all_policies"]), str(rec["num_flows"])]


def _follow(path: Path) -> Iterator[dict[str, Any]]:
    offset = path.stat().st_size if path.exists() else 0
    while True:
        if path.exists():
            size = path.stat().st_size
            if size < offset:  # rotated
                offset = 0
            if size > offset:
                with open(path) as f:
                    f.seek(offset)
                    data = f.read()
                    offset = f.tell()
                for line in data.splitlines():
                    if line.strip():
                        yield json.loads(line)
        time.sleep(0.5)


@click.command("flows")
@click.option("--dir", "directory", envvar="FELIX_FLOWLOGSFILEDIRECTORY",
              default="/var/log/calico/flowlogs", show_default=True, metavar="DIR",
              help="The agent's FlowLogsFileDirectory. Env: FELIX_FLOWLOGSFILEDIRECTORY.")
@click.option("--denied", is_flag=True, help="Only denied flows.")
@click.option("--namespace", default=None, help="Only flows from or to this namespace.")
@click.option("--pod", default=None, help="Only flows from or to this pod (name).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def command(directory: str, denied: bool, namespace: str | None, pod: str | None,
            follow: bool, output: str) -> None:
    """The flows the agent logged (FlowLogsFileEnabled, both dataplanes): source, destination,
    port, protocol, action, the deciding policy rule, aggregated per flush interval.

    \b
    Examples:
      pyfelix flows --dir /var/log/calico/flowlogs
      pyfelix flows --denied --namespace prod -o json
      pyfelix flows --follow
    """
    records = [r for r in read_records(directory)
               if matches(r, denied=denied, namespace=namespace, pod=pod)]
    header = ["TIME", "SOURCE", "DESTINATION", "PROTO", "ACTION", "REPORTER", "POLICY",
              "FLOWS"]

    def emit(recs: list[dict[str, Any]], with_header: bool) -> None:
        if output == "json":
            for r in recs:
                click.echo(json.dumps(r, sort_keys=True))
            return
        rows = ([header] if with_header else []) + [_row(r) for r in recs]
        if rows:
            widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
            for r in rows:
                click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())

    emit(records, True)
    if follow:
        for rec in _follow(Path(directory) / FILE_NAME):
            if matches(rec, denied=denied, namespace=namespace, pod=pod):
                emit([rec], False)

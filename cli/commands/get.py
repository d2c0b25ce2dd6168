"""`pyfelix get`: print resources from a datastore, as `calicoctl get` does.

KIND is case-insensitive, singular or plural. Namespaced kinds default to namespace
"default"; `-A` lists every namespace. `-o yaml|json` prints the document itself for one
NAME, else a `<Kind>List` that `pyfelix apply -f` accepts back. Problems found while reading
(unparsable files, duplicate keys) go to stderr as warnings.
"""

from __future__ import annotations

import json
from typing import Any

import click
import yaml

from pyfelix.agent.datastore import DatastoreLocation, open_datastore
from pyfelix.agent.syncer.client import DatastoreClientError, KindInfo, resolve_kind
from pyfelix.cli.params import DATASTORE, DATASTORE_HELP


def _as_list(info: KindInfo, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": info.api_version, "kind": f"{info.document_kind}List", "items": docs}


def _table(info: KindInfo, docs: list[dict[str, Any]]) -> str:
    header = ["NAMESPACE", "NAME"] if info.namespaced else ["NAME"]
    rows = [header]
    for doc in docs:
        meta = doc.get("metadata") or {}
        name = str(meta.get("name", ""))
        rows.append([str(meta.get("namespace") or "default"), name] if info.namespaced
                    else [name])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                         strict=True)).rstrip()
                     for row in rows)


def _print_status(datastore: DatastoreLocation, hostname: str | None, output: str) -> None:
    """Felix's status records (node records with TTL, endpoint up/down/error) as written by
    the agents into the datastore; the same view as `pyfelix status --datastore`."""
    from pyfelix.agent.status.view import collect, render

    status = collect(datastore=datastore, hostname=hostname)
    if output == "json":
        click.echo(json.dumps(status, indent=2, sort_keys=True, default=str))
    elif output == "yaml":
        click.echo(yaml.safe_dump(json.loads(json.dumps(status, default=str)), sort_keys=True))
    else:
        click.echo(render(status))


@click.command("get")
@click.argument("kind")
@click.argument("name", required=False)
@click.option("-n", "--namespace", help="Namespace of a namespaced KIND (default: default).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace.")
@click.option("-o", "--output", type=click.Choice(["table", "yaml", "json"]), default="table",
              show_default=True)
@click.option("--datastore", required=True, type=DATASTORE, envvar="PYFELIX_DATASTORE",
              help=DATASTORE_HELP)
def command(kind: str, name: str | None, namespace: str | None, all_namespaces: bool,
            output: str, datastore: DatastoreLocation) -> None:
    """Read resources from a datastore (like calicoctl get).

    \b
    Examples:
      pyfelix get globalnetworkpolicies --datastore ./resources
      pyfelix get networkpolicy allow-web -n shop -o yaml --datastore ./resources
      pyfelix get workloadendpoints -A -o json --datastore cluster.yaml
      pyfelix get status node1 --datastore ./resources      # agents' status records
    """
    if kind.lower() in ("status", "felixstatus", "felixstatuses"):
        _print_status(datastore, name, output)
        return
    if namespace and all_namespaces:
        raise click.UsageError("give -n/--namespace or -A/--all-namespaces, not both")
    try:
        info = resolve_kind(kind)
        if not info.namespaced and namespace:
            raise click.UsageError(f"{info.kind} is not namespaced; drop -n/--namespace")
        wanted_namespace = None if all_namespaces or not info.namespaced else (
            namespace or "default")
        store = open_datastore(datastore)
        docs = store.get(info.kind, name, wanted_namespace)
    except DatastoreClientError as exc:
        raise click.ClickException(str(exc)) from exc
    for warning in store.warnings:
        click.echo(f"warning: {warning}", err=True)
    if name and not docs:
        where = f" in namespace {wanted_namespace}" if wanted_namespace else ""
        raise click.ClickException(f"{info.kind} {name!r} not found{where} in "
                                   f"{store.description}")
    if output == "table":
        click.echo(_table(info, docs))
        return
    payload: Any = docs[0] if name and len(docs) == 1 else _as_list(info, docs)
    if output == "json":
        click.echo(json.dumps(payload, indent=2))
    else:
        click.echo(yaml.safe_dump(payload, sort_keys=False, default_flow_style=False), nl=False)

"""`pyfelix delete`: remove resources from a datastore, as `calicoctl delete` does.

Either every resource named in a file (`-f`) or one `KIND NAME [-n NS]`. Every resource must
exist (unless `--skip-not-exists`) or nothing is deleted. The library
(`agent.syncer.client`) does the work.
"""

from __future__ import annotations

import click

from pyfelix.agent.datastore import DatastoreLocation, open_datastore
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.client import DatastoreClientError, resolve_kind
from pyfelix.cli.commands.apply import read_input
from pyfelix.cli.params import DATASTORE, DATASTORE_HELP


def _keys_from_file(filename: str) -> list[ResourceKey]:
    updates = read_input(filename, not_done="deleted", empty="names no resources")
    return [update.key for update in updates]


def _key_from_arguments(kind: str, name: str, namespace: str | None) -> ResourceKey:
    info = resolve_kind(kind)
    if info.namespaced:
        return ResourceKey(info.kind, namespace or "default", name)
    if namespace:
        raise click.UsageError(f"{info.kind} is not namespaced; drop -n/--namespace")
    return ResourceKey(info.kind, "", name)


@click.command("delete")
@click.argument("kind", required=False)
@click.argument("name", required=False)
@click.option("-f", "--filename", metavar="FILE|DIR|-",
              help="Delete every resource named in this file, directory or stdin (-).")
@click.option("-n", "--namespace", help="Namespace of a namespaced KIND (default: default).")
@click.option("--skip-not-exists", is_flag=True,
              help="Skip resources that do not exist instead of failing.")
@click.option("--datastore", required=True, type=DATASTORE, envvar="PYFELIX_DATASTORE",
              help=DATASTORE_HELP)
def command(kind: str | None, name: str | None, filename: str | None, namespace: str | None,
            skip_not_exists: bool, datastore: DatastoreLocation) -> None:
    """Delete resources from a datastore (like calicoctl delete).

    \b
    Examples:
      pyfelix delete globalnetworkpolicy deny-all --datastore ./resources
      pyfelix delete networkpolicies allow-web -n shop --datastore ./resources
      pyfelix delete -f policy.yaml --datastore ./resources
    """
    try:
        if filename:
            if kind or name:
                raise click.UsageError("give either -f FILE or KIND NAME, not both")
            keys = _keys_from_file(filename)
        elif kind and name:
            keys = [_key_from_arguments(kind, name, namespace)]
        else:
            raise click.UsageError("give -f FILE, or KIND and NAME")
        store = open_datastore(datastore)
        existing = store.list()
        missing = [key for key in keys if key not in existing]
        if missing and not skip_not_exists:
            names = ", ".join(str(key) for key in missing)
            raise click.ClickException(
                f"not found in {store.description}: {names}; nothing was deleted")
        for key in keys:
            if key in existing:
                store.delete(key)
                click.echo(f"{key} deleted")
            else:
                click.echo(f"{key} skipped (does not exist)")
    except DatastoreClientError as exc:
        raise click.ClickException(str(exc)) from exc

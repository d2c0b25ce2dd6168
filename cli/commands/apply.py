"""`pyfelix apply`: create or replace resources in a datastore, as `calicoctl apply` does.

Reads every document of the input first (a file, a directory read recursively like the file
datastore, or `-` for stdin); if any document fails to parse, cannot be keyed or is
invalid, nothing is written. The library (`agent.syncer.client`) does the work.
"""

from __future__ import annotations

import os
import sys

import click

from pyfelix.agent.datastore import DatastoreLocation, open_datastore
from pyfelix.agent.syncer.api import RawUpdate
from pyfelix.agent.syncer.client import DatastoreClientError
from pyfelix.agent.syncer.file import load_path, load_text
from pyfelix.cli.params import DATASTORE, DATASTORE_HELP


def read_input(filename: str, *, not_done: str, empty: str) -> list[RawUpdate]:
    """Every document of `filename` (a file, a directory read recursively, or - for stdin).

    A missing input, any unreadable document (the message ends "nothing was `not_done`")
    or an input without documents ("`filename` `empty`") is a `click.ClickException`.
    Shared by `apply` and `delete`.
    """
    if filename == "-":
        updates, errors = load_text("<stdin>", sys.stdin.read())
    elif not os.path.exists(filename):
        raise click.ClickException(f"input {filename} does not exist")
    else:
        updates, errors = load_path(filename)
    if errors:
        lines = "\n".join(f"  {error}" for error in errors)
        raise click.ClickException(f"cannot read the input; nothing was {not_done}:\n{lines}")
    if not updates:
        raise click.ClickException(f"{filename} {empty}")
    return updates


def _validate(doc: object) -> None:
    """Full validation (the agent's own): a document the agent would reject is not written."""
    from pyfelix.agent.validator import validate_document

    validate_document(doc)


@click.command("apply")
@click.option("-f", "--filename", "filename", required=True, metavar="FILE|DIR|-",
              help="Resources to apply: a YAML/JSON file, a directory (recursive), or - for "
                   "stdin.")
@click.option("--datastore", required=True, type=DATASTORE, envvar="PYFELIX_DATASTORE",
              help=DATASTORE_HELP)
def command(filename: str, datastore: DatastoreLocation) -> None:
    """Create or update resources in a datastore (like calicoctl apply).

    \b
    Examples:
      pyfelix apply -f policy.yaml --datastore ./resources
      pyfelix apply -f manifests/ --datastore ./resources
      cat pool.yaml | pyfelix apply -f - --datastore cluster.yaml
    """
    updates = read_input(filename, not_done="written", empty="holds no resources")
    try:
        store = open_datastore(datastore, validate=_validate)
        results = store.apply([u.value or {} for u in updates],
                              sources=[u.source for u in updates])
    except DatastoreClientError as exc:
        raise click.ClickException(str(exc)) from exc
    for result in results:
        click.echo(f"{result.key} {result.action}")

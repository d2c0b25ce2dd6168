"""`pyfelix confd`: BIRD configuration from the datastore.

`pyfelix confd render` prints this node's bird.conf; `pyfelix confd run` (or `pyfelix confd`
with options and no subcommand) runs the watch-render-check-reload loop against a running
BIRD. The library (`confd`) does the work; this module parses options and prints.
"""

from __future__ import annotations

from typing import Any

import click

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.cli.params import DATASTORE, DATASTORE_HELP

HOSTNAME_HELP = "This node's name (its Node resource). Env: NODENAME."


def _common_options(fn: Any) -> Any:
    fn = click.option("--interface-prefix", default="cali", show_default=True,
                      envvar="FELIX_INTERFACEPREFIX",
                      help="Workload interface prefix, excluded from BIRD's direct protocol.")(fn)
    fn = click.option("--hostname", envvar="NODENAME", metavar="NODE", help=HOSTNAME_HELP)(fn)
    fn = click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE",
                      help=DATASTORE_HELP)(fn)
    return fn


def _run_options(fn: Any) -> Any:
    fn = click.option("--prometheus-port", type=click.IntRange(0, 65535), default=0,
                      show_default=True, help="Serve metrics on this port (0: do not).")(fn)
    fn = click.option("--config-file", metavar="PATH", default="/etc/bird/bird.conf",
                      show_default=True, help="The config file BIRD was started with (-c).")(fn)
    fn = click.option("--bird-socket", metavar="PATH", default="/run/bird/bird.ctl",
                      show_default=True, help="BIRD's control socket (-s).")(fn)
    return _common_options(fn)


def _require(datastore: DatastoreLocation | None,
             hostname: str | None) -> tuple[DatastoreLocation, str]:
    if not datastore:
        raise click.UsageError("--datastore is required (or PYFELIX_DATASTORE)")
    if not hostname:
        raise click.UsageError("--hostname is required (or NODENAME)")
    return datastore, hostname


def _run_loop(datastore: DatastoreLocation | None, hostname: str | None, interface_prefix: str,
              bird_socket: str, config_file: str, prometheus_port: int) -> None:
    from pyfelix.confd.daemon import ConfdStartError, run

    datastore, hostname = _require(datastore, hostname)
    try:
        run(datastore, hostname, interface_prefix=interface_prefix, bird_socket=bird_socket,
            config_file=config_file, prometheus_port=prometheus_port)
    except ConfdStartError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group("confd", invoke_without_command=True)
@_run_options
@click.pass_context
def command(ctx: click.Context, datastore: DatastoreLocation | None, hostname: str | None,
            interface_prefix: str, bird_socket: str, config_file: str,
            prometheus_port: int) -> None:
    """Render BIRD config from the datastore and keep BIRD reloaded.

    Without a subcommand, runs the loop (same as `pyfelix confd run`): on every datastore
    change it renders bird.conf, checks it with `bird -p`, renames it into place and runs
    `birdc configure`. A config BIRD rejects is never installed; the reason is logged and
    counted (pyfelix_confd_bird_check_failures_total).

    \b
    Examples:
      pyfelix confd render --datastore ./resources --hostname node1
      pyfelix confd --datastore ./resources --hostname node1 \\
          --bird-socket /run/bird/bird.ctl --config-file /etc/bird/bird.conf
      pyfelix confd run --datastore ./resources --hostname node1
    """
    if ctx.invoked_subcommand is None:
        _run_loop(datastore, hostname, interface_prefix, bird_socket, config_file,
                  prometheus_port)


@command.command("run")
@_run_options
def run_command(datastore: DatastoreLocation | None, hostname: str | None, interface_prefix: str,
                bird_socket: str, config_file: str, prometheus_port: int) -> None:
    """Run the watch-render-check-reload loop until SIGTERM or Ctrl-C.

    \b
    Example:
      pyfelix confd run --datastore ./resources --hostname node1 \\
          --bird-socket /run/bird/bird.ctl --config-file /etc/bird/bird.conf
    """
    _run_loop(datastore, hostname, interface_prefix, bird_socket, config_file, prometheus_port)


@command.command("render")
@_common_options
@click.option("--check/--no-check", default=False, show_default=True,
              help="Also parse the result with `bird -p` and fail if BIRD rejects it.")
def render_command(datastore: DatastoreLocation | None, hostname: str | None, interface_prefix: str,
                   check: bool) -> None:
    """Print this node's bird.conf, computed from the datastore.

    Skipped resources are listed as `# note:` comments in the output and on stderr.

    \b
    Examples:
      pyfelix confd render --datastore ./resources --hostname node1
      pyfelix confd render --datastore ./resources --hostname node1 --check > bird.conf
    """
    from pyfelix.confd.bgp_config import ConfdError
    from pyfelix.confd.datastore import DatastoreUnavailable, read_once
    from pyfelix.confd.render import render_from_updates

    datastore, hostname = _require(datastore, hostname)
    try:
        updates, errors = read_once(datastore)
        text, config = render_from_updates(updates, hostname, interface_prefix=interface_prefix)
    except (DatastoreUnavailable, ConfdError) as exc:
        raise click.ClickException(str(exc)) from exc
    for error in errors:
        click.echo(f"warning: datastore: {error}", err=True)
    for note in config.notes:
        click.echo(f"warning: {note}", err=True)
    if check:
        _check_text(text)
    click.echo(text, nl=False)


def _check_text(text: str) -> None:
    import tempfile

    from pyfelix.confd.bird import BirdTools

    with tempfile.NamedTemporaryFile("w", suffix=".conf") as staged:
        staged.write(text)
        staged.flush()
        result = BirdTools().check(staged.name)
    if not result.ok:
        raise click.ClickException(f"bird -p rejected the rendered config: {result.message}")

"""Entry point of the `pyfelix` command: a click group of the subcommands in `cli.commands`.

Commands add no logic: each calls the library and formats its answer (a table by default,
`-o json` where it makes sense). Modules are imported lazily so `pyfelix --help` stays fast
and a command's heavy imports (bcc, pyroute2, kubernetes) load only when it runs.
"""

from __future__ import annotations

import importlib

import click

# name -> one-line help shown by `pyfelix --help` (kept here so --help imports nothing heavy)
COMMANDS: dict[str, str] = {
    "agent": "Run the node agent: datastore -> calc graph -> dataplane.",
    "apply": "Create or update resources in a datastore (like calicoctl apply).",
    "bench": "Run benchmarks and print their figures.",
    "bpf": "Dump the pinned BPF maps.",
    "calc": "Compute what a node's dataplane would be programmed with.",
    "confd": "Render BIRD config from the datastore and keep BIRD reloaded.",
    "delete": "Delete resources from a datastore.",
    "flows": "Show the flows the agent logged (BPF mode flow logs).",
    "explain": "Explain the verdict this node gives a new connection (and run the BPF program).",
    "get": "Read resources from a datastore.",
    "lab": "Build network-namespace labs from scenarios and probe them.",
    "selector": "Parse, normalise and evaluate Calico selectors.",
    "status": "Show the agent's sync and dataplane status.",
    "typha": "Serve one datastore watch to many agents (fan-out).",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"pyfelix.cli.commands.{cmd_name}")
        cmd: click.Command = module.command
        if not cmd.short_help:
            cmd.short_help = COMMANDS[cmd_name]
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name]) for name in sorted(COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyfelix")
def cli() -> None:
    """pyfelix: a Felix-style node dataplane agent (BPF + iptables, BIRD via confd).

    \b
    Examples:
      pyfelix calc --datastore ./resources --hostname node1 -o json
      pyfelix lab run scenario.yaml --dataplane bpf -o json
      pyfelix selector eval "role == 'api'" role=api
    """


if __name__ == "__main__":
    cli()

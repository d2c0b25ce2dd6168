"""`pyfelix typha`: not implemented yet (owned by a later issue)."""

import click


@click.command("typha", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Not implemented yet."""
    raise click.ClickException("'pyfelix typha' is not implemented yet")

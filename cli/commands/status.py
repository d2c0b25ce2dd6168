"""`pyfelix status`: not implemented yet (owned by a later issue)."""

import click


@click.command("status", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Not implemented yet."""
    raise click.ClickException("'pyfelix status' is not implemented yet")

"""`pyfelix selector parse|eval`: normalise and evaluate Calico selectors from the shell.

Adds no logic: `agent.selector` parses, normalises and evaluates; this module formats.
Exit status: `parse` 0 (valid) or 2 (invalid selector); `eval` 0 when the selector
matches, 1 when it does not (like grep), 2 for an invalid selector or label argument.
Errors print the reason with the column, then the selector with a caret under the spot.
"""

from __future__ import annotations

import json

import click

from pyfelix.agent.selector import Selector, SelectorError, parse

EXIT_NO_MATCH = 1
EXIT_INVALID = 2


@click.group("selector")
def command() -> None:
    """Parse, normalise and evaluate Calico selectors.

    \b
    Examples:
      pyfelix selector parse "role == 'api' && has(version)"
      pyfelix selector parse "a in {'y', 'x'}" -o json
      pyfelix selector eval "role == 'api' && env != 'dev'" role=api env=prod
    """


def _parse_or_exit(text: str) -> Selector:
    try:
        return parse(text)
    except SelectorError as exc:
        click.echo(f"Error: invalid selector: {exc}", err=True)
        click.echo(exc.caret_lines(), err=True)
        raise SystemExit(EXIT_INVALID) from exc


def _requirements_text(selector: Selector) -> str:
    parts = []
    for key, values in sorted(selector.required_labels().items()):
        if values is None:
            parts.append(f"has({key})")
        else:
            listed = ", ".join(json.dumps(v) for v in sorted(values))
            parts.append(f"{key} in {{{listed}}}")
    return " && ".join(parts) if parts else "(nothing)"


@command.command("parse")
@click.argument("text")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def parse_command(text: str, output: str) -> None:
    """Print TEXT's canonical form, IP-set id and required labels (exit 2 if invalid).

    \b
    Examples:
      pyfelix selector parse "b == 'x' && a == 'y'"
        canonical: a == "y" && b == "x"
      pyfelix selector parse "a == 'x' && (b == '1' || b == '2')" -o json
    """
    selector = _parse_or_exit(text)
    if output == "json":
        required = {
            key: None if values is None else sorted(values)
            for key, values in sorted(selector.required_labels().items())
        }
        document = {
            "canonical": selector.canonical,
            "unique_id": selector.unique_id,
            "required_labels": required,
            "referenced_keys": sorted(selector.referenced_keys),
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"canonical: {selector.canonical}")
    click.echo(f"id:        {selector.unique_id}")
    click.echo(f"requires:  {_requirements_text(selector)}")


def _labels_from_args(pairs: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{pair!r} is not KEY=VALUE (use KEY= for an empty value)", param_hint="LABELS"
            )
        labels[key] = value
    return labels


@command.command("eval")
@click.argument("text")
@click.argument("labels", nargs=-1)
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def eval_command(text: str, labels: tuple[str, ...], output: str) -> None:
    """Print whether TEXT matches the labels KEY=VALUE ... (true/false).

    Exit status 0 on a match, 1 on no match, 2 for an invalid selector or label.

    \b
    Examples:
      pyfelix selector eval "role == 'api'" role=api              # true, exit 0
      pyfelix selector eval "env != 'dev'"                        # true: absent matches !=
      pyfelix selector eval "has(team) && !global()" team=a projectcalico.org/namespace=ns1
    """
    label_map = _labels_from_args(labels)
    selector = _parse_or_exit(text)
    matched = selector.evaluate(label_map)
    if output == "json":
        click.echo(json.dumps({"match": matched, "canonical": selector.canonical}))
    else:
        click.echo("true" if matched else "false")
    if not matched:
        raise SystemExit(EXIT_NO_MATCH)

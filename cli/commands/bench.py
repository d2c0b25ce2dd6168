"""`pyfelix bench [NAME ...] [-o table|json]`: run registered benchmarks, print their figures.

Adds no logic: `bench.run` measures, `bench.report` formats. JSON output is
`{"<bench>": {"<figure>": n}}` (contract in docs/ARCHITECTURE.md section 11), plus
`"notes": {"<bench>": {"<name>": "text"}}` when a benchmark left notes (e.g. why one point
of a sweep has no figure). Exit status:
0 when every requested benchmark ran; 1 when one failed (the others' figures are still
printed, the failures go to stderr); 2 for unknown names (the message lists the known ones).
"""

from __future__ import annotations

import json

import click

from pyfelix.bench import BenchSettings, UnknownBenchmarkError, known_benchmarks, run
from pyfelix.bench.registry import NOTES_KEY
from pyfelix.bench.report import text_table


@click.command("bench")
@click.argument("names", nargs=-1)
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Samples per figure; the figure is their median.",
)
@click.option(
    "--min-sample-seconds",
    type=click.FloatRange(min=0.0),
    default=0.2,
    show_default=True,
    help="Each sample runs at least this long.",
)
@click.option("--quick", is_flag=True, help="Few, short samples (smoke test; noisy figures).")
@click.option("--list", "list_only", is_flag=True, help="List the benchmarks and exit.")
def command(
    names: tuple[str, ...],
    output: str,
    repeats: int,
    min_sample_seconds: float,
    quick: bool,
    list_only: bool,
) -> None:
    """Run benchmarks (all by default) and print their figures.

    Each figure is the median of --repeats samples taken in this run, with F_min and F_max
    beside it (the table shows them as min, max and spread).

    \b
    Examples:
      pyfelix bench                      # every benchmark, as a table
      pyfelix bench selector -o json     # {"selector": {"evals_per_s": ...}}
      pyfelix bench --list
    """
    if list_only:
        for name, bench in known_benchmarks().items():
            status = f"unavailable: {bench.unavailable}" if bench.unavailable else bench.description
            click.echo(f"{name}\t{status}")
        return
    settings = BenchSettings.quick() if quick else BenchSettings(repeats, min_sample_seconds)
    try:
        results = run(list(names), settings)
    except UnknownBenchmarkError as exc:
        raise click.UsageError(str(exc)) from exc
    if output == "json":
        document: dict[str, object] = dict(results.figures)
        if results.notes:
            document[NOTES_KEY] = results.notes
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    elif results.figures:
        click.echo(text_table(results.figures))
    if output != "json":
        for bench_name, notes in sorted(results.notes.items()):
            for name, text in sorted(notes.items()):
                click.echo(f"note: {bench_name} {name}: {text}")
    for name, error in sorted(results.errors.items()):
        click.echo(f"Error: benchmark {name} failed: {error}", err=True)
    if results.errors:
        raise SystemExit(1)

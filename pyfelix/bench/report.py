"""Benchmark figures -> table rows, plain text table, markdown; `python -m pyfelix.bench.report`.

Input: `{"<bench>": {"<figure>": number}}` (what `pyfelix bench -o json` prints). A figure
`F` with `F_min` and `F_max` beside it is one measured quantity and becomes ONE row with
median, min, max and spread (`(max - min) / median`); any other figure is a row of its own.

A results file may also hold `"notes": {"<bench>": {"<name>": "text"}}` (see
`bench.registry`): markdown lists them under the table.

Usage: `python -m pyfelix.bench.report results.json [--plots DIR] > DIR/results.md` (the
Makefile's `bench`); with `--plots` the charts of `bench.plots` are written to DIR
and the markdown shows them (links relative to DIR, where results.md goes).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pyfelix.bench.registry import NOTES_KEY

HEADERS = ("bench", "figure", "median", "min", "max", "spread")


@dataclass(frozen=True)
class Row:
    """One quantity of one benchmark; `low`/`high` are None for a plain figure."""

    bench: str
    figure: str
    value: float
    low: float | None = None
    high: float | None = None

    def cells(self) -> tuple[str, ...]:
        if self.low is None or self.high is None:
            return (self.bench, self.figure, format_number(self.value), "", "", "")
        spread = (self.high - self.low) / self.value if self.value else 0.0
        return (
            self.bench,
            self.figure,
            format_number(self.value),
            format_number(self.low),
            format_number(self.high),
            f"{spread:.1%}",
        )


def format_number(value: float) -> str:
    """Readable number: thousands separators for large ones, 3 significant digits otherwise."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


def rows(results: Mapping[str, Mapping[str, float]]) -> list[Row]:
    """Rows sorted by bench then figure, pairing `F` with `F_min`/`F_max`."""
    out: list[Row] = []
    for bench in sorted(results):
        figures = results[bench]
        for name in sorted(figures):
            base, _, suffix = name.rpartition("_")
            if suffix in ("min", "max") and base in figures:
                continue  # shown in its base figure's row
            low, high = figures.get(f"{name}_min"), figures.get(f"{name}_max")
            out.append(Row(bench, name, figures[name], low, high))
    return out


def text_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """A plain aligned table (what `pyfelix bench` prints by default)."""
    table = [HEADERS, *(row.cells() for row in rows(results))]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    numeric = {2, 3, 4, 5}
    lines = []
    for line in table:
        cells = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def markdown_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """A GitHub-flavoured markdown table of the same rows."""
    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows(results)]
    return "\n".join(lines)


def load(path: str) -> dict[str, dict[str, float]]:
    """Read and check a results file: an object of objects of numbers (notes left out)."""
    return load_document(path)[0]


def load_document(path: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """Read and check a results file: (figures per bench, notes per bench)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of benchmarks, got {type(data).__name__}")
    notes = data.pop(NOTES_KEY, {})
    if not isinstance(notes, dict) or not all(
            isinstance(v, dict) and all(isinstance(t, str) for t in v.values())
            for v in notes.values()):
        raise ValueError(f"{path}: {NOTES_KEY}: expected an object of objects of strings")
    for bench, figures in data.items():
        if not isinstance(figures, dict):
            raise ValueError(f"{path}: benchmark {bench!r}: expected an object of figures")
        for figure, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{path}: {bench}.{figure}: expected a number, got {value!r}")
    return data, notes


def notes_markdown(notes: Mapping[str, Mapping[str, str]]) -> str:
    """The notes as a markdown list ("" when there are none)."""
    lines = [f"- {bench} `{name}`: {text}" for bench in sorted(notes)
             for name, text in sorted(notes[bench].items())]
    return "\n".join(["", "Notes:", "", *lines]) if lines else ""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options: dict[str, str] = {}
    for option in ("--plots", "--baseline"):
        if option in args:
            at = args.index(option)
            if at + 1 >= len(args):
                args = []
                break
            options[option] = args.pop(at + 1)
            args.pop(at)
    if len(args) != 1:
        print("usage: python -m pyfelix.bench.report RESULTS.json [--plots DIR] "
              "[--baseline BASELINE.json]", file=sys.stderr)
        return 2
    plots_dir = options.get("--plots")
    try:
        results, notes = load_document(args[0])
        baseline = None
        if "--baseline" in options:
            with open(options["--baseline"]) as f:
                baseline = json.load(f)
            if not isinstance(baseline, dict):
                raise ValueError(f"{options['--baseline']}: not a JSON object")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(markdown_table(results))
    if notes:
        print(notes_markdown(notes))
    if plots_dir is not None:
        from pathlib import Path

        from pyfelix.bench.plots import draw_all

        for name in draw_all(results, notes, Path(plots_dir), baseline):
            print(f"\n![{name.removesuffix('.png').replace('_', ' ')}]({name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

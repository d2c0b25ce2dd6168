"""Benchmark figures -> table rows, plain text table, markdown; `python -m agent.bench.report`.

Input: `{"<bench>": {"<figure>": number}}` (what `pyfelix bench -o json` prints). A figure
`F` with `F_min` and `F_max` beside it is one measured quantity and becomes ONE row with
median, min, max and spread (`(max - min) / median`); any other figure is a row of its own.

Usage: `python -m agent.bench.report results.json > results.md` (the Makefile's `bench`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

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
    """Read and check a results file: an object of objects of numbers."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of benchmarks, got {type(data).__name__}")
    for bench, figures in data.items():
        if not isinstance(figures, dict):
            raise ValueError(f"{path}: benchmark {bench!r}: expected an object of figures")
        for figure, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{path}: {bench}.{figure}: expected a number, got {value!r}")
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agent.bench.report RESULTS.json", file=sys.stderr)
        return 2
    try:
        results = load(args[0])
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

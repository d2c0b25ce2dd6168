"""Charts of a results file (`pyfelix bench -o json`): PNGs for bench/results.md and the README.

Role: turn the figures that `make bench` measured into three charts, drawing only what the
file holds (a chart whose figures are absent is not drawn; a point that failed is marked
with its note, never given a value):
- `per_packet_cost.png` (bench `bpf-verdict`): first-packet verdict cost against the number
  of rules, one line per series `<prefix>first_packet_ns_<N>` and
  `<prefix>first_packet_v6_ns_<N>` (IPv4 and IPv6 packets), with `ct_hit_ns` and
  `harness_ns` as horizontal references; log-log. With a baseline results file (`report
  --baseline`, e.g. bench/baseline_linear_walk.json: the linear rule walk the classifier
  replaced, as it was measured), its series are drawn beside, labelled with its `label`.
- `new_conn_rate.png` (bench `dataplane-compare`): new connections/s against rules for each
  dataplane (`<dp>_new_conn_per_s_<N>` with _min/_max as error bars); a failed point (note
  `<dp>_<N>`) is drawn as a cross on the axis, labelled "failed".
- `typha_latency.png` (bench `typha`): update fan-out p50/p99 against connected clients
  (`fanout_p50_ms_<C>` / `fanout_p99_ms_<C>` for a sweep, else the run's `clients` with
  `fanout_p50_ms` / `fanout_p99_ms`), with the 1 s target line; a count that failed (note
  `clients_<C>`) is a cross on the axis.

Inputs: the results mapping and its notes (`bench.report.load_document`).
Outputs: PNG files in a directory; `series` helpers are pure (unit-tested without drawing).
matplotlib is imported only when drawing, with the non-interactive Agg backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Results = Mapping[str, Mapping[str, float]]
Notes = Mapping[str, Mapping[str, str]]

PER_PACKET_PNG = "per_packet_cost.png"
NEW_CONN_PNG = "new_conn_rate.png"
TYPHA_PNG = "typha_latency.png"
TYPHA_TARGET_MS = 1000.0


@dataclass
class Series:
    """Points (x -> y) of one line, with optional (low, high) ranges and failed x's."""

    label: str
    points: dict[int, float] = field(default_factory=dict)
    ranges: dict[int, tuple[float, float]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


def _suffixed(figures: Mapping[str, float], pattern: str) -> dict[str, dict[int, float]]:
    """{group: {N: value}} for figures matching `pattern` (groups: prefix, N)."""
    out: dict[str, dict[int, float]] = {}
    regex = re.compile(pattern)
    for name, value in figures.items():
        match = regex.fullmatch(name)
        if match:
            out.setdefault(match.group(1), {})[int(match.group(2))] = value
    return out


def _with_ranges(series: Series, figures: Mapping[str, float], name_of: Any) -> Series:
    for x in series.points:
        low, high = figures.get(f"{name_of(x)}_min"), figures.get(f"{name_of(x)}_max")
        if low is not None and high is not None:
            series.ranges[x] = (low, high)
    return series


def per_packet_series(results: Results, baseline: Mapping[str, Any] | None = None
                      ) -> list[Series]:
    """First-packet series of `results` and, labelled "<its label>", of `baseline`."""
    out = []
    sources = [(results, "")]
    if baseline:
        label = str(baseline.get("label") or "baseline")
        sources.append((baseline, label))
    for source, source_label in sources:
        figures = source.get("bpf-verdict", {})
        found = _suffixed(figures, r"(.*first_packet_(?:v6_)?)ns_(\d+)")
        for stem, points in sorted(found.items()):
            prefix = stem.removesuffix("first_packet_").removesuffix("first_packet_v6_")
            family = "IPv6" if stem.endswith("v6_") else "IPv4"
            name = prefix.rstrip("_") or "BPF first packet"
            label = f"{source_label or name} ({family})"
            series = Series(label, dict(sorted(points.items())))
            out.append(_with_ranges(series, figures, lambda n, s=stem: f"{s}ns_{n}"))
    return out


def new_conn_series(results: Results, notes: Notes) -> list[Series]:
    figures = results.get("dataplane-compare", {})
    bench_notes = notes.get("dataplane-compare", {})
    planned = sorted(int(v) for k, v in figures.items() if re.fullmatch(r"rules_\d+", k))
    out = []
    for dataplane in ("bpf", "iptables"):
        points = _suffixed(figures, rf"({dataplane})_new_conn_per_s_(\d+)").get(dataplane, {})
        series = Series(dataplane, dict(sorted(points.items())))
        for rules in planned:
            note = bench_notes.get(f"{dataplane}_{rules}")
            if rules not in series.points and note:
                series.failed[rules] = note
        if series.points or series.failed:
            out.append(_with_ranges(series, figures,
                                    lambda n, d=dataplane: f"{d}_new_conn_per_s_{n}"))
    return out


def typha_series(results: Results) -> list[Series]:
    figures = results.get("typha", {})
    out = []
    for quantile in ("p50", "p99"):
        swept = _suffixed(figures, rf"fanout_({quantile})_ms_(\d+)").get(quantile, {})
        if not swept and f"fanout_{quantile}_ms" in figures and "clients" in figures:
            swept = {int(figures["clients"]): figures[f"fanout_{quantile}_ms"]}
        if swept:
            out.append(Series(f"update fan-out {quantile}", dict(sorted(swept.items()))))
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _error_bars(series: Series, xs: list[int]) -> list[list[float]] | None:
    if not series.ranges:
        return None
    low = [series.points[x] - series.ranges.get(x, (series.points[x],) * 2)[0] for x in xs]
    high = [series.ranges.get(x, (series.points[x],) * 2)[1] - series.points[x] for x in xs]
    return [low, high]


def draw_per_packet(results: Results, path: Path,
                    baseline: Mapping[str, Any] | None = None) -> bool:
    series = per_packet_series(results, baseline)
    if not series:
        return False
    figures = results.get("bpf-verdict", {})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for line in series:
        xs = sorted(line.points)
        ax.errorbar(xs, [line.points[x] for x in xs], yerr=_error_bars(line, xs), marker="o",
                    capsize=3, label=line.label)
    for name, style in (("ct_hit_ns", "--"), ("harness_ns", ":")):
        if name in figures:
            ax.axhline(figures[name], linestyle=style, color="grey",
                       label=f"{name} ({figures[name]:g} ns)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rules in the endpoint's policy")
    ax.set_ylabel("ns per packet (BPF_PROG_TEST_RUN)")
    ax.set_title("BPF verdict cost of a connection's first packet")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw_new_conn(results: Results, notes: Notes, path: Path) -> bool:
    series = new_conn_series(results, notes)
    if not series:
        return False
    xs_all = sorted({x for s in series for x in (*s.points, *s.failed)})
    position = {x: i for i, x in enumerate(xs_all)}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for offset, line in zip((-0.08, 0.08), series, strict=False):
        xs = sorted(line.points)
        drawn = ax.errorbar([position[x] + offset for x in xs], [line.points[x] for x in xs],
                            yerr=_error_bars(line, xs), marker="o", capsize=3,
                            label=line.label)
        for x in line.failed:
            ax.plot([position[x] + offset], [0], marker="x", markersize=10,
                    color=drawn[0].get_color())
            ax.annotate(f"{line.label}: failed", (position[x] + offset, 0),
                        textcoords="offset points", xytext=(0, 12), ha="center",
                        fontsize="small", color=drawn[0].get_color())
    ax.set_xticks(range(len(xs_all)))
    ax.set_xticklabels(["no policy" if x == 0 else f"{x:,}" for x in xs_all])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rules in the server's policy")
    ax.set_ylabel("new TCP connections/s (wrk, Connection: close)")
    ax.set_title("New-connection rate through each dataplane")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def typha_failed(notes: Notes) -> dict[int, str]:
    """Client counts the typha sweep could not complete (notes `clients_<N>`)."""
    out = {}
    for name, text in notes.get("typha", {}).items():
        match = re.fullmatch(r"clients_(\d+)", name)
        if match:
            out[int(match.group(1))] = text
    return out


def draw_typha(results: Results, path: Path, notes: Notes | None = None) -> bool:
    series = typha_series(results)
    failed = typha_failed(notes or {})
    if not series and not failed:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for line in series:
        xs = sorted(line.points)
        ax.plot(xs, [line.points[x] for x in xs], marker="o", label=line.label)
    for clients in sorted(failed):
        ax.plot([clients], [0], marker="x", markersize=10, color="red")
        ax.annotate(f"{clients:,} clients: failed", (clients, 0), textcoords="offset points",
                    xytext=(0, 12), ha="center", fontsize="small", color="red")
    ax.axhline(TYPHA_TARGET_MS, linestyle="--", color="grey", label="target p99 (1 s)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("Typha clients")
    ax.set_ylabel("ms from datastore write to client")
    ax.set_title("Typha update fan-out latency")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw_all(results: Results, notes: Notes, directory: Path,
             baseline: Mapping[str, Any] | None = None) -> list[str]:
    """Draw every chart the results allow; the file names written, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if draw_per_packet(results, directory / PER_PACKET_PNG, baseline):
        written.append(PER_PACKET_PNG)
    if draw_new_conn(results, notes, directory / NEW_CONN_PNG):
        written.append(NEW_CONN_PNG)
    if draw_typha(results, directory / TYPHA_PNG, notes):
        written.append(TYPHA_PNG)
    return written

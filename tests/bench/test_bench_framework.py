"""The benchmark framework: registry and discovery, measuring, running, reporting, CLI."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

import pyfelix.bench.registry as registry_module
from pyfelix.bench import (
    BenchContext,
    BenchmarkRegistrationError,
    BenchSettings,
    Stat,
    UnknownBenchmarkError,
    benchmark,
    known_benchmarks,
    resolve,
    run,
)
from pyfelix.bench.report import main as report_main
from pyfelix.bench.report import markdown_table, rows, text_table
from pyfelix.cli.main import cli


@pytest.fixture
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry with nothing registered and the real package marked as discovered."""
    monkeypatch.setattr(registry_module, "_registered", {})
    monkeypatch.setattr(registry_module, "_discovered_packages", {registry_module.BENCH_PACKAGE})


class FakeClock:
    """A clock that only moves when the measured function moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- measuring -----------------------------------------------------------------------------


def test_rate_is_median_of_repeats_with_min_and_max() -> None:
    clock = FakeClock()
    call_costs = iter([0.001] * 1000 + [0.002] * 100000)  # calibration, then slower calls

    def work() -> None:
        clock.now += next(call_costs)

    ctx = BenchContext(BenchSettings(repeats=3, min_sample_seconds=0.01), clock=clock)
    figures = ctx.rate("ops_per_s", work, ops_per_call=10)
    assert set(figures) == {"ops_per_s", "ops_per_s_min", "ops_per_s_max"}
    assert figures["ops_per_s_min"] <= figures["ops_per_s"] <= figures["ops_per_s_max"]
    # every call is 1 ms (10 ops) or 2 ms (10 ops): rates lie between 5,000 and 10,000 ops/s
    assert figures["ops_per_s_min"] >= 5000 and figures["ops_per_s_max"] <= 10000 + 1e-6


def test_rate_of_a_steady_function_is_exact() -> None:
    clock = FakeClock()

    def work() -> None:
        clock.now += 0.004

    ctx = BenchContext(BenchSettings(repeats=5, min_sample_seconds=0.05), clock=clock)
    figures = ctx.rate("x_per_s", work, ops_per_call=2)
    assert figures["x_per_s"] == pytest.approx(500.0)
    assert figures["x_per_s_min"] == pytest.approx(500.0)


def test_seconds_reports_per_call_duration() -> None:
    clock = FakeClock()
    durations = iter([0.3, 0.1, 0.2])

    def work() -> None:
        clock.now += next(durations)

    figures = BenchContext(BenchSettings(repeats=3), clock=clock).seconds("sync_s", work)
    assert figures == pytest.approx({"sync_s": 0.2, "sync_s_min": 0.1, "sync_s_max": 0.3})


def test_stat_of_samples() -> None:
    assert Stat.of([3.0, 1.0, 2.0, 10.0]) == Stat(2.5, 1.0, 10.0)


# --- registry and running --------------------------------------------------------------------


def test_registered_benchmarks_run_and_failures_are_collected(empty_registry: None) -> None:
    @benchmark("good", description="works")
    def good(ctx: BenchContext) -> dict[str, float]:
        return {"things": 3, "rate": 1.5}

    @benchmark("crashes")
    def crashes(ctx: BenchContext) -> dict[str, float]:
        """Raises."""
        raise RuntimeError("boom")

    @benchmark("not_numbers")
    def not_numbers(ctx: BenchContext) -> dict[str, float]:
        return {"x": "fast"}  # type: ignore[dict-item]

    assert list(known_benchmarks()) == ["crashes", "good", "not_numbers"]
    assert known_benchmarks()["crashes"].description == "Raises."
    results = run(None, BenchSettings.quick())
    assert results.figures == {"good": {"things": 3, "rate": 1.5}}
    assert "RuntimeError: boom" in results.errors["crashes"]
    assert "is not a number" in results.errors["not_numbers"]


def test_unknown_names_list_the_known_ones(empty_registry: None) -> None:
    @benchmark("alpha")
    def alpha(ctx: BenchContext) -> dict[str, float]:
        return {"x": 1}

    with pytest.raises(UnknownBenchmarkError) as info:
        resolve(["alpha", "beta"])
    assert info.value.unknown == ["beta"]
    assert "known: alpha" in str(info.value)
    assert [b.name for b in resolve(["alpha", "alpha"])] == ["alpha"]


def test_a_name_registered_twice_is_an_error(empty_registry: None) -> None:
    @benchmark("dup")
    def first(ctx: BenchContext) -> dict[str, float]:
        return {"x": 1}

    with pytest.raises(BenchmarkRegistrationError, match="'dup' registered twice"):

        @benchmark("dup")
        def second(ctx: BenchContext) -> dict[str, float]:
            return {"x": 2}


def test_discovery_imports_modules_and_a_broken_one_breaks_only_itself(
    empty_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = f"fakebench_{uuid.uuid4().hex[:8]}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "working.py").write_text(
        textwrap.dedent(
            """
            from pyfelix.bench import benchmark

            @benchmark("working")
            def working(ctx):
                return {"answer": 42}
            """
        )
    )
    (root / "needs_bcc.py").write_text("import module_that_does_not_exist_anywhere\n")
    (root / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry_module.discover(package)
        known = known_benchmarks()
        assert set(known) == {"working", "needs_bcc"}
        assert "module_that_does_not_exist_anywhere" in (known["needs_bcc"].unavailable or "")
        results = run(["working", "needs_bcc"], BenchSettings.quick())
        assert results.figures == {"working": {"answer": 42}}
        assert "failed to import" in results.errors["needs_bcc"]
    finally:
        for name in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[name]


# --- the selector benchmark ----------------------------------------------------------------


def test_selector_bench_runs_and_reports_positive_figures() -> None:
    results = run(["selector"], BenchSettings.quick())
    assert results.errors == {}
    figures = results.figures["selector"]
    for name in ("evals_per_s", "parses_per_s"):
        assert figures[name] > 0
        assert figures[f"{name}_min"] <= figures[name] <= figures[f"{name}_max"]


def test_selector_bench_workload_is_what_it_claims() -> None:
    from pyfelix.agent.selector import parse
    from pyfelix.bench.selector import BENCH_SELECTOR, LABELS_PER_SET, label_sets

    selector = parse(BENCH_SELECTOR)
    assert BENCH_SELECTOR.count("&&") == 4  # five terms
    sets = label_sets()
    assert all(len(labels) == LABELS_PER_SET for labels in sets)
    matched = sum(selector.evaluate(labels) for labels in sets)
    assert 0 < matched < len(sets)


# --- reporting -----------------------------------------------------------------------------

RESULTS = {
    "selector": {
        "evals_per_s": 2_000_000.0,
        "evals_per_s_min": 1_900_000.0,
        "evals_per_s_max": 2_100_000.0,
    },
    "calc": {"rules": 1000, "sync_s": 0.25},
}


def test_rows_pair_figures_with_their_range() -> None:
    assert [row.cells() for row in rows(RESULTS)] == [
        ("calc", "rules", "1,000", "", "", ""),
        ("calc", "sync_s", "0.25", "", "", ""),
        ("selector", "evals_per_s", "2,000,000", "1,900,000", "2,100,000", "10.0%"),
    ]


def test_markdown_and_text_tables() -> None:
    markdown = markdown_table(RESULTS).splitlines()
    assert markdown[0] == "| bench | figure | median | min | max | spread |"
    assert markdown[-1] == "| selector | evals_per_s | 2,000,000 | 1,900,000 | 2,100,000 | 10.0% |"
    text = text_table(RESULTS).splitlines()
    assert text[0].split() == ["bench", "figure", "median", "min", "max", "spread"]
    assert len(text) == 4


def test_report_module_reads_a_results_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(RESULTS))
    assert report_main([str(path)]) == 0
    assert "| calc | rules | 1,000 |" in capsys.readouterr().out
    path.write_text(json.dumps({"calc": {"rules": "many"}}))
    assert report_main([str(path)]) == 1
    assert "calc.rules: expected a number" in capsys.readouterr().err
    assert report_main([str(tmp_path / "missing.json")]) == 1
    assert report_main([]) == 2


# --- CLI -----------------------------------------------------------------------------------


def test_cli_bench_selector_json() -> None:
    result = CliRunner().invoke(cli, ["bench", "selector", "--quick", "-o", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert list(document) == ["selector"]
    assert document["selector"]["evals_per_s"] > 0


def test_cli_bench_table_and_list() -> None:
    table = CliRunner().invoke(
        cli, ["bench", "selector", "--repeats", "1", "--min-sample-seconds", "0.001"]
    )
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].split()[:3] == ["bench", "figure", "median"]
    assert any(line.startswith("selector  evals_per_s") for line in table.stdout.splitlines())
    listing = CliRunner().invoke(cli, ["bench", "--list"])
    assert listing.exit_code == 0 and "selector" in listing.stdout


def test_cli_bench_unknown_name_exits_2_listing_known() -> None:
    result = CliRunner().invoke(cli, ["bench", "no_such_bench"])
    assert result.exit_code == 2
    assert "unknown benchmark(s): no_such_bench" in result.stderr
    assert "selector" in result.stderr


def test_cli_bench_failure_exits_1_after_printing_the_rest(empty_registry: None) -> None:
    @benchmark("fine")
    def fine(ctx: BenchContext) -> dict[str, float]:
        return {"x": 1}

    @benchmark("broken")
    def broken(ctx: BenchContext) -> dict[str, float]:
        raise OSError("no bpffs")

    result = CliRunner().invoke(cli, ["bench", "-o", "json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"fine": {"x": 1}}
    assert "benchmark broken failed: OSError: no bpffs" in result.stderr


def test_notes_are_collected_and_printed_in_json(empty_registry: None) -> None:
    @benchmark("sweep")
    def sweep(ctx: BenchContext) -> dict[str, float]:
        ctx.note("point_3", "FAILED: did not fit")
        return {"point_1": 1.0}

    results = run(["sweep"], BenchSettings.quick())
    assert results.notes == {"sweep": {"point_3": "FAILED: did not fit"}}
    out = CliRunner().invoke(cli, ["bench", "-o", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"sweep": {"point_1": 1.0},
                                      "notes": {"sweep": {"point_3": "FAILED: did not fit"}}}
    table = CliRunner().invoke(cli, ["bench"])
    assert "note: sweep point_3: FAILED: did not fit" in table.stdout


def test_notes_is_not_a_benchmark_name(empty_registry: None) -> None:
    with pytest.raises(BenchmarkRegistrationError, match="reserved"):
        benchmark("notes")


def test_every_bpf_benchmark_is_registered_and_importable():
    """The BPF benchmarks import without bcc at collection time; their end-to-end smoke runs
    are `make test-bench` (tests/bench_bpf)."""
    from pyfelix.bench import known_benchmarks

    known = known_benchmarks()
    for name in ("bpf-verdict", "map-sync", "policy-latency", "restart", "dataplane-compare",
                 "policy-programming", "agent-memory", "services"):
        assert name in known, name
        assert known[name].unavailable is None, known[name].unavailable

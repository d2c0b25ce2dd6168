"""The benchmark registry: named benchmarks, discovered by importing `bench.*` modules.

Role: let any module under `pyfelix/bench/` declare benchmarks with `@benchmark("name")`, and
let `pyfelix bench` / `make bench` run them by name and collect their figures.

Writing a benchmark (in a new module `pyfelix/bench/<name>.py`; no list to edit)::

    @benchmark("calc_sync", description="Calc graph: resources -> messages")
    def calc_sync(ctx: BenchContext) -> dict[str, float]:
        graph = build_once()
        return ctx.rate("updates_per_s", lambda: graph.apply(batch), ops_per_call=len(batch))

A benchmark returns `{figure: number}`. Measured figures come from `BenchContext.rate` or
`BenchContext.seconds`: each is the MEDIAN of `settings.repeats` samples taken in this run,
reported with `<figure>_min` and `<figure>_max` beside it (the spread of the same run).
Plain counts (e.g. `rules: 1000`) may be returned as they are.

Discovery: `known_benchmarks()` imports every module of the `bench` package except the
framework's own (`FRAMEWORK_MODULES`) and names starting with `_`. A module that fails to
import (say, `bcc` missing) does not break the others: it is recorded as an unavailable
benchmark named after the module, and running it reports the import error. So name a
module after the benchmark it registers.

Invariants: benchmark names are unique (a second registration under a name is an error);
running never raises for a failing benchmark: failures are collected in `BenchResults`.
Notes (`ctx.note(name, text)`) carry what is not a number, e.g. why one point of a sweep
failed; figures stay numbers only, and a failed point has no figure (never a made-up one).
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

BENCH_PACKAGE = "pyfelix.bench"
FRAMEWORK_MODULES = frozenset({"registry", "report", "plots", "__main__"})
NOTES_KEY = "notes"  # top-level key of the notes in `pyfelix bench -o json`

Figures = dict[str, float]
BenchFunction = Callable[["BenchContext"], Mapping[str, float]]


@dataclass(frozen=True)
class BenchSettings:
    """How hard to measure. `quick()` is for tests: cheap, figures still positive."""

    repeats: int = 5
    min_sample_seconds: float = 0.2

    @classmethod
    def quick(cls) -> BenchSettings:
        return cls(repeats=3, min_sample_seconds=0.002)


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark, or (when `unavailable` is set) a module that failed to import."""

    name: str
    module: str
    description: str = ""
    function: BenchFunction | None = None
    unavailable: str | None = None


@dataclass
class BenchResults:
    """Figures of the benchmarks that ran, and an error message for each that did not."""

    figures: dict[str, Figures] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    # per benchmark, text notes (e.g. why one point of a sweep has no figure)
    notes: dict[str, dict[str, str]] = field(default_factory=dict)


class UnknownBenchmarkError(LookupError):
    """Names that no benchmark module registered; the message lists the known ones."""

    def __init__(self, unknown: list[str], known: list[str]) -> None:
        self.unknown = unknown
        self.known = known
        super().__init__(
            f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(known) or '(none)'}"
        )


class BenchmarkRegistrationError(ValueError):
    """A benchmark name registered twice."""


_registered: dict[str, Benchmark] = {}
_discovered_packages: set[str] = set()


def benchmark(name: str, *, description: str = "") -> Callable[[BenchFunction], BenchFunction]:
    """Decorator registering `function(ctx) -> {figure: number}` as benchmark `name`."""

    if name == NOTES_KEY:
        raise BenchmarkRegistrationError(f"{NOTES_KEY!r} is reserved for the notes in JSON")

    def register(function: BenchFunction) -> BenchFunction:
        existing = _registered.get(name)
        if existing is not None and existing.function is not function:
            raise BenchmarkRegistrationError(
                f"benchmark {name!r} registered twice ({existing.module}, {function.__module__})"
            )
        doc = (function.__doc__ or "").strip().splitlines()
        _registered[name] = Benchmark(
            name=name,
            module=function.__module__,
            description=description or (doc[0] if doc else ""),
            function=function,
        )
        return function

    return register


def discover(package_name: str = BENCH_PACKAGE) -> None:
    """Import every benchmark module of a package once (see module docstring)."""
    if package_name in _discovered_packages:
        return
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in FRAMEWORK_MODULES or info.name.startswith("_"):
            continue
        module_name = f"{package_name}.{info.name}"
        try:
            importlib.import_module(module_name)
        except Exception as exc:  # any import failure disables only this module's benches
            if info.name not in _registered:
                _registered[info.name] = Benchmark(
                    name=info.name,
                    module=module_name,
                    unavailable=f"module {module_name} failed to import: "
                    f"{type(exc).__name__}: {exc}",
                )
    _discovered_packages.add(package_name)


def known_benchmarks() -> dict[str, Benchmark]:
    """All benchmarks by name (discovering them on first use), sorted by name."""
    discover()
    return dict(sorted(_registered.items()))


def resolve(names: Iterable[str] | None) -> list[Benchmark]:
    """The benchmarks called `names` (all when None or empty); unknown names raise."""
    known = known_benchmarks()
    wanted = list(names or known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UnknownBenchmarkError(unknown, list(known))
    return [known[n] for n in dict.fromkeys(wanted)]


def run(names: Iterable[str] | None = None, settings: BenchSettings | None = None) -> BenchResults:
    """Run the named benchmarks (all by default) and collect figures and errors."""
    settings = settings or BenchSettings()
    results = BenchResults()
    for bench in resolve(names):
        if bench.function is None:
            results.errors[bench.name] = bench.unavailable or "no function"
            continue
        ctx = BenchContext(settings)
        try:
            figures = bench.function(ctx)
            results.figures[bench.name] = _checked_figures(bench.name, figures)
        except Exception as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1]
            results.errors[bench.name] = (
                f"{type(exc).__name__}: {exc} ({last.filename}:{last.lineno})"
            )
        if ctx.notes:
            results.notes[bench.name] = dict(ctx.notes)
    return results


def _checked_figures(name: str, figures: Mapping[str, float]) -> Figures:
    checked: Figures = {}
    for figure, value in figures.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"benchmark {name!r} figure {figure!r} is not a number: {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"benchmark {name!r} figure {figure!r} is not finite: {value!r}")
        checked[figure] = value
    if not checked:
        raise ValueError(f"benchmark {name!r} returned no figures")
    return checked


@dataclass(frozen=True)
class Stat:
    """Median and range of repeated samples of one quantity."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        return cls(statistics.median(samples), min(samples), max(samples))

    def figures(self, name: str) -> Figures:
        return {name: self.median, f"{name}_min": self.low, f"{name}_max": self.high}


class BenchContext:
    """Measuring helpers handed to each benchmark; all samples come from this run."""

    def __init__(self, settings: BenchSettings, clock: Callable[[], float] | None = None) -> None:
        self.settings = settings
        self._clock = clock or time.perf_counter
        self.notes: dict[str, str] = {}

    def note(self, name: str, text: str) -> None:
        """Record a text note, e.g. why a point of a sweep has no figure (`bpf_10000`)."""
        self.notes[name] = text

    def rate(self, name: str, function: Callable[[], object], *, ops_per_call: int) -> Figures:
        """Operations per second of `function` (each call does `ops_per_call` operations)."""
        loops = self._calibrate(function)
        samples = [loops * ops_per_call / self._time(function, loops) for _ in self._repeats()]
        return Stat.of(samples).figures(name)

    def seconds(self, name: str, function: Callable[[], object]) -> Figures:
        """Seconds per call of `function` (one call per sample: for slow operations)."""
        samples = [self._time(function, 1) for _ in self._repeats()]
        return Stat.of(samples).figures(name)

    def _repeats(self) -> range:
        return range(max(1, self.settings.repeats))

    def _time(self, function: Callable[[], object], loops: int) -> float:
        clock = self._clock
        started = clock()
        for _ in range(loops):
            function()
        return max(clock() - started, 1e-9)

    def _calibrate(self, function: Callable[[], object]) -> int:
        """Calls per sample so a sample lasts at least `min_sample_seconds` (warms up too)."""
        loops = 1
        while True:
            elapsed = self._time(function, loops)
            if elapsed >= self.settings.min_sample_seconds or loops >= 1 << 30:
                return loops
            # aim a little past the target so the next round usually ends the search
            grow = self.settings.min_sample_seconds * 1.2 / elapsed
            loops = max(loops * 2, math.ceil(loops * min(grow, 100.0)))

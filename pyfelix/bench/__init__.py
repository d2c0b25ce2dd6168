"""Benchmarks: `pyfelix bench [NAME ...]` and `make bench` run what is registered here.

Each module under `pyfelix/bench/` (other than the framework's `registry` and `report`)
registers benchmarks with `@benchmark("name")`; `registry` finds them by importing the
package's modules, so adding a benchmark is adding a module, e.g. `pyfelix/bench/calc_sync.py`.
A module that cannot import (missing `bcc`, say) only makes its own benchmark unavailable.
See `bench.registry` for the measuring rules (median of repeats, with min/max).
"""

from pyfelix.bench.registry import (
    BenchContext,
    Benchmark,
    BenchmarkRegistrationError,
    BenchResults,
    BenchSettings,
    Stat,
    UnknownBenchmarkError,
    benchmark,
    known_benchmarks,
    resolve,
    run,
)

__all__ = [
    "BenchContext",
    "BenchResults",
    "BenchSettings",
    "Benchmark",
    "BenchmarkRegistrationError",
    "Stat",
    "UnknownBenchmarkError",
    "benchmark",
    "known_benchmarks",
    "resolve",
    "run",
]

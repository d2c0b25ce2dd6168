"""Benchmark `selector`: how fast compiled selectors evaluate, and how fast new ones parse.

Figures (each the median of the run's repeats, with `_min`/`_max`):
- `evals_per_s`: `Selector.evaluate` calls per second for the 5-term selector
  `BENCH_SELECTOR` against 100 different label sets of 10 labels each. Every set passes the
  first four terms and a third fail the last, so nearly every term is evaluated each time
  (short-circuiting cannot flatter the figure). The loop calling `evaluate` is included in
  the time. Target (issue 2): 1,000,000 per second.
- `parses_per_s`: uncached parse + normalise + compile of distinct 5-term selectors (what a
  policy change costs per new selector).
"""

from __future__ import annotations

from pyfelix.agent.selector import parse, parse_uncached
from pyfelix.bench.registry import BenchContext, Figures, benchmark

BENCH_SELECTOR = (
    "app == 'web' && tier in {'frontend', 'backend'} && has(version) "
    "&& env != 'dev' && !has(quarantine)"
)
LABEL_SETS = 100
LABELS_PER_SET = 10
PARSE_TEXTS = 50


def label_sets() -> list[dict[str, str]]:
    """LABEL_SETS label dicts of LABELS_PER_SET labels; every third one is quarantined."""
    sets = []
    for i in range(LABEL_SETS):
        labels = {
            "app": "web",
            "tier": "frontend" if i % 2 else "backend",
            "version": f"v{i}",
            "env": "prod",
            "projectcalico.org/namespace": "default",
            "pod-template-hash": f"{i:08x}",
        }
        labels["quarantine" if i % 3 == 0 else "team"] = "x"
        for extra in range(LABELS_PER_SET - len(labels)):
            labels[f"example.com/extra-{extra}"] = str(i)
        sets.append(labels)
    return sets


@benchmark("selector", description="Selector evaluations and parses per second")
def selector_bench(ctx: BenchContext) -> Figures:
    evaluate = parse(BENCH_SELECTOR).evaluate
    workload = label_sets()

    def evaluate_all() -> None:
        for labels in workload:
            evaluate(labels)

    texts = [BENCH_SELECTOR.replace("'web'", f"'web-{n}'") for n in range(PARSE_TEXTS)]

    def parse_all() -> None:
        for text in texts:
            parse_uncached(text)

    return {
        **ctx.rate("evals_per_s", evaluate_all, ops_per_call=len(workload)),
        **ctx.rate("parses_per_s", parse_all, ops_per_call=len(texts)),
    }

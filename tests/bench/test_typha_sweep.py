"""The typha benchmark's sweep over client counts (the runs faked; tests/typha runs it for
real): per-count figures, the largest completed run's figures, a failed count as a note."""

from __future__ import annotations

import pytest

from pyfelix.bench import typha
from pyfelix.bench.registry import BenchContext, BenchSettings


def fake_run(plan: typha.TyphaBenchPlan) -> dict[str, float]:
    if plan.clients == 1000:
        raise RuntimeError("a client process failed: 300 of 500 clients had the hello")
    return {name: float(plan.clients) for name in typha.SWEPT_FIGURES} | {
        "clients": float(plan.clients)}


def test_sweep_keeps_completed_counts_and_notes_the_failed_one(monkeypatch):
    monkeypatch.setattr(typha, "run_typha_bench", fake_run)
    ctx = BenchContext(BenchSettings())
    figures = typha.run_sweep(typha.TyphaBenchPlan(), (1000, 250, 500), ctx)
    assert figures["clients"] == 500  # the largest run that completed
    assert figures["fanout_p99_ms_250"] == 250 and figures["fanout_p99_ms_500"] == 500
    assert not any(name.endswith("_1000") for name in figures)
    assert ctx.notes == {"clients_1000": "FAILED: a client process failed: 300 of 500 "
                                         "clients had the hello"}


def test_sweep_with_nothing_completed_raises(monkeypatch):
    monkeypatch.setattr(typha, "run_typha_bench", fake_run)
    with pytest.raises(RuntimeError, match="no client count completed"):
        typha.run_sweep(typha.TyphaBenchPlan(), (1000,), BenchContext(BenchSettings()))

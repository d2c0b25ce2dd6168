"""The agent process's garbage-collector policy: keep the cyclic collector off long-lived state.

Role: the calculation graph and the dataplane managers hold the node's whole state for the
life of the process (10^4..10^5 small dicts, sets and frozen dataclasses). CPython's full
(generation 2) collection walks every tracked object, and the calc and dataplane threads
stall meanwhile: with the state of the benchmarks' node (1,000 endpoints plus what earlier
benchmarks left) each full pass took 58-72 ms and was the whole tail of `policy-latency`
(apply max 85 ms with full passes, 24 ms without). That state is almost entirely acyclic,
so reference counting frees it; walking it again and again finds nothing.

Policy (`tick()` is called by the daemon's supervision loop, every 0.1 s):

    not yet in sync ........ nothing (the initial load runs with the collector paused per
                             batch anyway: agent.calc.pipeline)
    first tick in sync ..... settle: gc.collect(), then gc.freeze() - everything alive now
                             moves to the permanent generation, which collections skip
    every refreeze_interval  settle again: the collection walks only what is not frozen
    every full_interval .... gc.unfreeze() first, so cycles among frozen objects that have
                             become garbage are reclaimed: the one planned full pass

Inputs: `tick(now, in_sync)`; the `gc` module is injectable (tests record the calls).
Outputs: `pyfelix_gc_frozen_objects` (objects in the permanent generation after the last
settle), `pyfelix_gc_settle_seconds` (how long each settle took, the pauses it replaces),
`pyfelix_gc_collected_objects_total{pass}` (what each settle's collection found: the full
passes show how much cyclic garbage froze meanwhile, i.e. whether "acyclic" holds).
Invariant: nothing is frozen before the dataplane is first in sync; a full pass (unfreeze)
happens at most once per `full_interval`.
Cost of the policy: cyclic garbage among frozen objects (with any finalizers it has) lives
until the next full pass, at most `full_interval`.
"""

from __future__ import annotations

import gc as _gc
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge, Summary

log = logging.getLogger(__name__)

FROZEN_OBJECTS = Gauge(
    "pyfelix_gc_frozen_objects",
    "Objects in the garbage collector's permanent generation after the last settle.",
)
SETTLE_SECONDS = Summary(
    "pyfelix_gc_settle_seconds",
    "Seconds each garbage-collector settle (collect + freeze) took.",
)
COLLECTED_OBJECTS = Counter(
    "pyfelix_gc_collected_objects",
    "Unreachable objects found by the settles' collections, by pass (young: only what was "
    "not frozen; full: frozen objects included).",
    ["pass"],
)


class GcPolicy:
    """Freezes the long-lived state once in sync; refreezes and fully collects periodically."""

    def __init__(self, *, refreeze_interval: float = 300.0, full_interval: float = 3600.0,
                 gc_module: Any = _gc) -> None:
        if refreeze_interval <= 0 or full_interval < refreeze_interval:
            raise ValueError("GcPolicy: refreeze_interval must be > 0 and "
                             "full_interval >= refreeze_interval")
        self._refreeze_interval = refreeze_interval
        self._full_interval = full_interval
        self._gc = gc_module
        self._next_settle: float | None = None
        self._next_full: float | None = None
        self.settles = 0

    def tick(self, now: float, in_sync: bool) -> None:
        """Settle when due (see the module docstring); cheap when not."""
        if not in_sync and self._next_settle is None:
            return
        if self._next_settle is not None and now < self._next_settle:
            return
        full = self._next_full is not None and now >= self._next_full
        self.settle(full=full)
        self._next_settle = now + self._refreeze_interval
        if self._next_full is None or full:
            self._next_full = now + self._full_interval

    def settle(self, *, full: bool = False) -> None:
        """Collect what is garbage now, then freeze the survivors; `full` unfreezes first so
        frozen objects are examined too."""
        started = time.perf_counter()
        if full:
            self._gc.unfreeze()
        collected = self._gc.collect()
        self._gc.freeze()
        seconds = time.perf_counter() - started
        self.settles += 1
        frozen = self._gc.get_freeze_count()
        FROZEN_OBJECTS.set(frozen)
        SETTLE_SECONDS.observe(seconds)
        COLLECTED_OBJECTS.labels("full" if full else "young").inc(collected)
        log.log(logging.INFO if full else logging.DEBUG,
                "gc settle%s: %d unreachable objects collected, %d frozen, in %.3f s",
                " (full pass)" if full else "", collected, frozen, seconds)

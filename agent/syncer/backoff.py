"""Jittered exponential backoff for datastore reconnects (etcd, Kubernetes).

Role: how long a syncer waits before its next attempt after a failure. Inputs: `failed()`
after each failed attempt, `succeeded()` after a good one. Output: the delay to wait.

Invariants: delays grow by `factor` from `initial` up to `maximum`, each multiplied by a
random factor in [1 - jitter, 1 + jitter] (so many agents do not reconnect in lockstep),
and never exceed `maximum`; one success resets the sequence.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float = 0.1, maximum: float = 5.0, factor: float = 2.0,
                 jitter: float = 0.2, *, rng: random.Random | None = None) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or not 0 <= jitter < 1:
            raise ValueError("backoff needs 0 < initial <= maximum, factor >= 1, "
                             "0 <= jitter < 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._next = initial
        self.failures = 0

    def failed(self) -> float:
        """Record a failure; returns how long to wait before the next attempt."""
        self.failures += 1
        delay = self._next * self._rng.uniform(1 - self.jitter, 1 + self.jitter)
        self._next = min(self._next * self.factor, self.maximum)
        return min(delay, self.maximum)

    def succeeded(self) -> None:
        self.failures = 0
        self._next = self.initial

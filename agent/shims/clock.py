"""Clock shim: monotonic time and sleeping, injectable so loops and backoffs are testable.

Real default: `SystemClock` (time.monotonic / time.sleep). Tests use `tests.fakes.clock.FakeClock`,
whose time moves only when the test advances it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

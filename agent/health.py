"""Health aggregation and the `/liveness` + `/readiness` HTTP endpoints (Felix's health.go).

Role: each long-running loop of the agent registers a reporter (`register()` returns a
`HealthReporter`) saying whether it reports liveness and/or readiness, with a timeout, and
then reports FROM ITS OWN THREAD on a timer, also while idle (`HealthReporter.interval`: a
third of the timeout, at most 10 s, as Felix's loops report every 10 s). A loop stuck in a
syscall, a lock or an endless computation stops reporting, and that is what liveness sees;
"is the thread alive" would stay true forever. The agent's reporters (`agent.daemon`):

    datastore      readiness only, registered before the health port is served: not
                   ready until the datastore answered with the agent's configuration
                   (an agent waiting for etcd/the API server is live, never ready)
    calc-graph     the calc pipeline thread (between batches and every interval while idle)
    dataplane      the dataplane loop (after every step; its queue wait is bounded by the
                   interval). Felix's name for it, InternalDataplaneMainLoop, is an alias
                   in HealthTimeoutOverrides. Registered first, with the datastore
                   reporter, as readiness only, so `/readiness` is 503 until the dataplane
                   has been programmed once; the loop re-registers it with liveness.
    iface-monitor  the interface monitor (after every netlink poll)

The aggregator answers:

- `/liveness`: 200 when every liveness reporter has reported live within its timeout; 503
  otherwise, and `problems` in the JSON body names each failing reporter and why, e.g.
  `dataplane: no report for 31.2 s (timeout 30 s)`;
- `/readiness`: 200 when every readiness reporter last reported ready (the agent is in sync
  and the dataplane programmed; staleness does not matter here, only liveness times out);
  503 otherwise, with the same body.

Timeouts: each reporter's registered default, replaced by `timeout_overrides` (Felix's
HealthTimeoutOverrides, `name=duration`); a timeout of 0 means "never times out". Failing
liveness is logged once when the set of problems changes.

Invariants: a reporter that never reported is not ready, and not live once its timeout has
passed since it registered (a loop still starting is not a hung one); time comes from an
injectable clock so tests do not sleep. The HTTP server is an `agent.httpserver`
`BoundedHTTPServer` (connection cap and read timeout: HealthMaxConnections,
HealthReadTimeout).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from pyfelix.agent.httpserver import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT,
    BoundedHTTPServer,
)

log = logging.getLogger(__name__)

MAX_REPORT_INTERVAL = 10.0  # Felix's loops report every 10 s

# Felix's reporter names that mean the same loop here (for HealthTimeoutOverrides)
FELIX_ALIASES = {"InternalDataplaneMainLoop": "dataplane"}


def report_interval(timeout: float) -> float:
    """How often a reporter with this timeout reports: a third of it, at most 10 s."""
    if timeout <= 0:
        return MAX_REPORT_INTERVAL
    return min(MAX_REPORT_INTERVAL, timeout / 3)


@dataclass
class _Reporter:
    name: str
    reports_live: bool
    reports_ready: bool
    timeout: float
    live: bool = False
    ready: bool = False
    detail: str = ""
    last_report: float | None = None
    registered: float = 0.0
    base_timeout: float | None = None  # the loop's own timeout, before any override
    interval: float = MAX_REPORT_INTERVAL  # how often the loop reports (fixed at start)


class HealthReporter:
    """One registered loop's handle: `report()` from the loop's own thread every `interval`."""

    def __init__(self, aggregator: HealthAggregator, name: str, timeout: float) -> None:
        self._aggregator = aggregator
        self.name = name
        self.timeout = timeout
        self.interval = report_interval(timeout)

    def report(self, *, live: bool = True, ready: bool = True, detail: str = "") -> None:
        self._aggregator.report(self.name, live=live, ready=ready, detail=detail)


class HealthAggregator:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 timeout_overrides: Mapping[str, float] | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reporters: dict[str, _Reporter] = {}
        self._overrides = {FELIX_ALIASES.get(name, name): float(seconds)
                           for name, seconds in (timeout_overrides or {}).items()}
        self._logged_problems: tuple[str, ...] = ()

    def register(self, name: str, *, live: bool = True, ready: bool = True,
                 timeout: float = 30.0) -> HealthReporter:
        """Register `name`; its timeout is `timeout` unless HealthTimeoutOverrides names it."""
        effective = self._overrides.get(name, timeout)
        if effective != timeout:
            log.info("health reporter %s: timeout %g s (overridden from %g s)", name,
                     effective, timeout)
        with self._lock:
            self._reporters[name] = _Reporter(name, live, ready, effective,
                                              registered=self._clock(), base_timeout=timeout,
                                              interval=report_interval(effective))
        return HealthReporter(self, name, effective)

    def set_timeout_overrides(self, overrides: Mapping[str, float]) -> None:
        """Replace the overrides for reporters registered from now on (the agent learns the
        datastore's HealthTimeoutOverrides after its first reporter registered)."""
        self._overrides = {FELIX_ALIASES.get(name, name): float(seconds)
                           for name, seconds in overrides.items()}

    def apply_timeout_overrides(self, overrides: Mapping[str, float]) -> dict[str, float]:
        """HealthTimeoutOverrides changed while running (Felix applies it live): the new
        overrides, also to the reporters already registered (a reporter no longer named
        gets its own timeout back). A loop keeps the report interval it started with, so a
        timeout is never set below two of its intervals (0 still means never). Returns the
        timeouts that changed."""
        self.set_timeout_overrides(overrides)
        changed = {}
        with self._lock:
            for r in self._reporters.values():
                base = r.timeout if r.base_timeout is None else r.base_timeout
                wanted = self._overrides.get(r.name, base)
                if wanted > 0 and wanted < 2 * r.interval:
                    log.warning("HealthTimeoutOverrides: %s reports every %g s; timeout %g s "
                                "raised to %g s until the agent restarts", r.name, r.interval,
                                wanted, 2 * r.interval)
                    wanted = 2 * r.interval
                if wanted != r.timeout:
                    r.timeout = changed[r.name] = wanted
        return changed

    def unknown_overrides(self) -> list[str]:
        """Overridden names that no registered reporter has (typos, other agents' names)."""
        return sorted(set(self._overrides) - set(self._reporters))

    def report(self, name: str, *, live: bool = True, ready: bool, detail: str = "") -> None:
        with self._lock:
            reporter = self._reporters[name]
            reporter.live = live
            reporter.ready = ready
            reporter.detail = detail
            reporter.last_report = self._clock()

    # --- answers -------------------------------------------------------------------------

    def _evaluate(self) -> dict[str, dict[str, Any]]:
        """Per reporter: live, ready, timeout, age of the last report, and the reasons."""
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            reporters = list(self._reporters.values())
        for r in reporters:
            age = None if r.last_report is None else now - r.last_report
            live_problem = ready_problem = ""
            why = f" ({r.detail})" if r.detail else ""
            if age is None:
                # not ready until it reports; not live only once its timeout has passed
                # (a loop still starting is not a hung one)
                ready_problem = f"{r.name}: never reported"
                waited = now - r.registered
                if r.timeout > 0 and waited > r.timeout:
                    live_problem = (f"{r.name}: never reported in {waited:.1f} s "
                                    f"(timeout {r.timeout:g} s)")
            else:
                if r.reports_live:
                    if r.timeout > 0 and age > r.timeout:
                        live_problem = (f"{r.name}: no report for {age:.1f} s "
                                        f"(timeout {r.timeout:g} s)")
                    elif not r.live:
                        live_problem = f"{r.name}: reported not live{why}"
                if r.reports_ready and not r.ready:
                    ready_problem = f"{r.name}: reported not ready{why}"
            out[r.name] = {
                "live": not (r.reports_live and live_problem),
                "ready": not (r.reports_ready and ready_problem),
                "timeout": r.timeout,
                "last_report_age": None if age is None else round(age, 3),
                "detail": r.detail,
                "_live_problem": live_problem if r.reports_live else "",
                "_ready_problem": ready_problem if r.reports_ready else "",
            }
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        return {name: {k: v for k, v in state.items() if not k.startswith("_")}
                for name, state in self._evaluate().items()}

    def liveness_problems(self) -> list[str]:
        problems = [s["_live_problem"] for s in self._evaluate().values() if s["_live_problem"]]
        self._log_change(problems)
        return problems

    def readiness_problems(self) -> list[str]:
        states = self._evaluate()
        if not states:
            return ["no reporters registered"]
        return [s["_ready_problem"] for s in states.values() if s["_ready_problem"]]

    def is_live(self) -> bool:
        return not self.liveness_problems()

    def is_ready(self) -> bool:
        return not self.readiness_problems()

    def _log_change(self, problems: list[str]) -> None:
        # the problem text carries the age, which changes every time: compare the reporters
        key = tuple(sorted(p.split(":", 1)[0] for p in problems))
        with self._lock:
            changed, self._logged_problems = key != self._logged_problems, key
        if changed:
            if problems:
                log.warning("liveness failing: %s", "; ".join(problems))
            else:
                log.info("liveness restored")


class HealthServer:
    """Serves the aggregator on host:port in a daemon thread; `stop()` closes the socket.

    Bounded (`agent.httpserver`): at most `max_connections` at once, each cut off after
    `read_timeout` s without a complete request."""

    def __init__(self, aggregator: HealthAggregator, host: str, port: int, *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 read_timeout: float = DEFAULT_READ_TIMEOUT) -> None:
        agg = aggregator

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/liveness"):
                    problems = agg.liveness_problems()
                elif self.path.startswith("/readiness"):
                    problems = agg.readiness_problems()
                else:
                    self.send_error(404)
                    return
                ok = not problems
                body = json.dumps({"ok": ok, "problems": problems,
                                   "reporters": agg.summary()}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = BoundedHTTPServer("health", host, port, Handler,
                                         max_connections=max_connections,
                                         read_timeout=read_timeout)
        self.port = self._server.port

    @property
    def active_connections(self) -> int:
        return self._server.active_connections

    def start(self) -> None:
        self._server.serve_in_thread()

    def stop(self) -> None:
        self._server.stop()

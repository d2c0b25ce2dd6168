"""Health aggregation and the `/liveness` + `/readiness` HTTP endpoints (Felix's health.go).

Role: each long-running part of the agent (calc graph loop, dataplane loop, syncer) registers
a `HealthReporter` saying whether it reports liveness (with a timeout: it must report at least
that often) and/or readiness. The aggregator answers:

- `/liveness`: 200 when every liveness reporter has reported live within its timeout;
- `/readiness`: 200 when every readiness reporter last reported ready (the agent is in sync
  and the dataplane programmed); 503 otherwise, with a JSON body naming who is not.

Invariants: a reporter that never reported is neither live nor ready; time comes from an
injectable clock so tests do not sleep.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class _Reporter:
    name: str
    reports_live: bool
    reports_ready: bool
    timeout: float
    live: bool = False
    ready: bool = False
    last_report: float = float("-inf")


class HealthAggregator:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reporters: dict[str, _Reporter] = {}

    def register(self, name: str, *, live: bool = True, ready: bool = True,
                 timeout: float = 30.0) -> None:
        with self._lock:
            self._reporters[name] = _Reporter(name, live, ready, timeout)

    def report(self, name: str, *, live: bool = True, ready: bool) -> None:
        with self._lock:
            reporter = self._reporters[name]
            reporter.live = live
            reporter.ready = ready
            reporter.last_report = self._clock()

    def summary(self) -> dict[str, dict[str, bool]]:
        now = self._clock()
        with self._lock:
            return {
                r.name: {
                    "live": (not r.reports_live) or (r.live and now - r.last_report <= r.timeout),
                    "ready": (not r.reports_ready) or r.ready,
                }
                for r in self._reporters.values()
            }

    def is_live(self) -> bool:
        return all(s["live"] for s in self.summary().values())

    def is_ready(self) -> bool:
        summary = self.summary()
        return bool(summary) and all(s["ready"] for s in summary.values())


class HealthServer:
    """Serves the aggregator on host:port in a daemon thread; `stop()` closes the socket."""

    def __init__(self, aggregator: HealthAggregator, host: str, port: int) -> None:
        agg = aggregator

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/liveness"):
                    ok = agg.is_live()
                elif self.path.startswith("/readiness"):
                    ok = agg.is_ready()
                else:
                    self.send_error(404)
                    return
                body = json.dumps({"ok": ok, "reporters": agg.summary()}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

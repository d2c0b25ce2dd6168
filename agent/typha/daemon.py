"""`pyfelix typha`: the Typha process around `agent.typha.server.TyphaServer`.

Role: what a Typha container runs. Starts the server (one upstream syncer per syncer type,
built by the caller's `syncer_factory`: the CLI owns datastore parsing), serves Prometheus
metrics on the bounded server of `agent.metrics` when a port is given, stops on
SIGTERM/SIGINT. The CLI only parses and checks arguments and calls `run()`.

Errors at start-up (the datastore cannot be opened, TLS files unusable, the listen or
health address taken) raise `TyphaStartError` with the reason; the CLI prints it and exits 1.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from pyfelix.agent.typha.server import HealthListenError, ServerConfig, TyphaServer
from pyfelix.agent.typha.tls import TLSConfigError

log = logging.getLogger(__name__)


class TyphaStartError(RuntimeError):
    """Typha could not start (the message says why)."""


def run(config: ServerConfig, syncer_factory: Callable[[str], Any], *,
        start_errors: tuple[type[Exception], ...] = (),
        metrics_port: int = 0, metrics_host: str = "0.0.0.0",
        on_started: Callable[[str, int], None] | None = None) -> None:
    """Serve until a signal. `start_errors`: the caller's own error types that mean "could
    not start" (e.g. the datastore client's)."""
    from pyfelix.agent import metrics

    server = TyphaServer(syncer_factory, config)
    try:
        server.start()
    except (TLSConfigError, HealthListenError, *start_errors) as exc:
        raise TyphaStartError(str(exc)) from exc
    except OSError as exc:
        raise TyphaStartError(f"cannot listen on {config.host}:{config.port}: "
                              f"{exc.strerror or exc}") from exc
    metrics_server = metrics.serve_metrics(metrics_host, metrics_port) if metrics_port else None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if on_started is not None:
        on_started(*server.address)
    try:
        while not stop.wait(0.2):  # short: a signal handler sets `stop`
            pass
    finally:
        server.stop()
        if metrics_server is not None:
            metrics_server.stop()
        log.info("typha: stopped")

"""`pyfelix confd run`: the confd process around `confd.watcher.ConfdLoop`.

Role: what a confd container runs. Opens the datastore's syncer, serves Prometheus metrics
(the bounded server of `agent.metrics`, when a port is given), installs SIGTERM/SIGINT
handlers that stop the loop, and runs `ConfdLoop` until then. The CLI only parses
arguments and calls `run()`.

Errors: a datastore that cannot be opened raises `ConfdStartError` with the reason (the CLI
prints it and exits 1); everything after start-up is the loop's business (it never dies on
a bad render or a BIRD that refuses a reload: see confd.watcher).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyfelix.agent.datastore import DatastoreLocation


class ConfdStartError(RuntimeError):
    """confd could not start (the message says why)."""


def run(datastore: DatastoreLocation, hostname: str, *, interface_prefix: str, bird_socket: str,
        config_file: str, prometheus_port: int = 0) -> None:
    """Watch `datastore` and keep BIRD's config for `hostname` current until a signal."""
    from pyfelix.agent import metrics
    from pyfelix.confd.datastore import DatastoreUnavailable, open_syncer
    from pyfelix.confd.watcher import ConfdLoop, ConfdReconciler, run_until

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        syncer = open_syncer(datastore)
    except DatastoreUnavailable as exc:
        raise ConfdStartError(str(exc)) from exc
    server = metrics.serve_metrics("", prometheus_port) if prometheus_port else None
    reconciler = ConfdReconciler(hostname, config_file, bird_socket,
                                 interface_prefix=interface_prefix)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        run_until(ConfdLoop(syncer, reconciler), stop)
    finally:
        if server is not None:
            server.stop()

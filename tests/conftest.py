"""Suite-wide: agents the tests start log to stderr only (their harness captures it), never
to Felix's default log file (/var/log/calico/felix.log) or the machine's syslog.

Agent processes inherit FELIX_LOGFILEPATH=none and FELIX_LOGSEVERITYSYS=none (unless a test
sets them); agents run in-process with an environment of their own (agent.daemon.Agent with
AgentOptions.environ) get the same through `log_sinks`: a LogFilePath or LogSeveritySys
left at Felix's default is dropped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("FELIX_LOGFILEPATH", "none")
os.environ.setdefault("FELIX_LOGSEVERITYSYS", "none")


@pytest.fixture(autouse=True)
def _no_machine_log_sinks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import pyfelix.agent.daemon as daemon

    original = daemon.log_sinks

    def test_sinks(config):  # type: ignore[no-untyped-def]
        sinks = original(config)
        if config.source_of("LogFilePath") == "default":
            sinks = dataclasses.replace(sinks, file_path="")
        if config.source_of("LogSeveritySys") == "default":
            sinks = dataclasses.replace(sinks, sys_severity="")
        return sinks

    monkeypatch.setattr(daemon, "log_sinks", test_sinks)
    yield

"""Suite-wide: agents the tests start log to stderr only (their harness captures it), never
to Felix's default log file (/var/log/calico/felix.log) or the machine's syslog.

Agent processes inherit FELIX_LOGFILEPATH=none and FELIX_LOGSEVERITYSYS=none (unless a test
sets them); agents run in-process with an environment of their own (agent.daemon.Agent with
AgentOptions.environ) get the same through `log_sinks`: a LogFilePath or LogSeveritySys
left at Felix's default is dropped.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

os.environ.setdefault("FELIX_LOGFILEPATH", "none")
os.environ.setdefault("FELIX_LOGSEVERITYSYS", "none")
# BPF agents attach the connect-time load balancer to the machine's root cgroup v2 by
# default (as Felix does on a node); tests' agents never do: a test that exercises it gives
# the agent a cgroup of its own. The session ends with a check that nothing of ours is
# attached at the root (_no_ctlb_at_the_cgroup_root).
os.environ.setdefault("FELIX_BPFCONNECTTIMELOADBALANCING", "Disabled")
# BPF agents keep their build cache (agent.bpf.build_cache) in a directory of this session,
# never the machine's /var/cache/pyfelix: the session's first BPF agent compiles, the others
# load that build (verified again by the kernel). Removed when the session ends.
if "PYFELIX_BPF_CACHE_DIR" not in os.environ:
    os.environ["PYFELIX_BPF_CACHE_DIR"] = _SESSION_BPF_CACHE = tempfile.mkdtemp(
        prefix="pyfelix-bpf-cache-")
    atexit.register(shutil.rmtree, _SESSION_BPF_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _no_ctlb_at_the_cgroup_root() -> Iterator[None]:
    yield
    from pyfelix.agent.dataplane.managers.bpf_ctlb import (
        HOOKS,
        OUR_PREFIX,
        KernelCgroups,
        default_cgroup_root,
    )

    root = default_cgroup_root()
    if not root or os.geteuid() != 0:
        return
    shim = KernelCgroups()
    fd = shim.open_cgroup(root)
    found = []
    try:
        for attach_type in HOOKS.values():
            for prog_id, name in shim.attached(fd, int(attach_type)):
                if name.startswith(OUR_PREFIX):
                    shim.detach(fd, prog_id, int(attach_type))
                    found.append(f"{name} (id {prog_id})")
    finally:
        shim.close(fd)
    assert not found, f"programs of ours were attached at the machine's cgroup root {root} " \
                      f"(detached now): {found}"


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


# --- garbage-collector pauses -------------------------------------------------------------
# Lab tests probe from threads of this process and serve the pods' echo servers from another
# thread of it, with probe timeouts of about half a second. A full collection of the heap the
# suite has built by then (about 500 MB after two thirds of it) stops every thread for long
# enough that a burst of probes times out: the dataplane allowed them, the harness did not
# get to run. So before each test everything still alive is collected once and frozen
# (`gc.freeze`: moved out of the collector's view; reference counting still frees it), and
# a collection during a test scans only what that test allocated. The longest pauses of the
# session, with the test that was running, are printed at its end.

GC_PAUSE_REPORT_SECONDS = 0.05
_gc_started: list[float] = []
_gc_pauses: list[tuple[float, int, str]] = []
_current_test: list[str] = [""]


def _gc_timer(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[:] = [time.perf_counter()]
    elif _gc_started:
        pause = time.perf_counter() - _gc_started[0]
        if pause >= GC_PAUSE_REPORT_SECONDS and _current_test[0]:
            _gc_pauses.append((pause, info.get("generation", -1), _current_test[0]))


def pytest_configure(config: pytest.Config) -> None:
    gc.callbacks.append(_gc_timer)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current_test[0] = ""  # this collection runs between tests: not reported
    gc.collect()
    gc.freeze()
    _current_test[0] = item.nodeid


def pytest_unconfigure(config: pytest.Config) -> None:
    if _gc_timer in gc.callbacks:
        gc.callbacks.remove(_gc_timer)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _gc_pauses:
        return
    terminalreporter.write_line(
        f"garbage-collector pauses >= {GC_PAUSE_REPORT_SECONDS * 1000:.0f} ms: "
        f"{len(_gc_pauses)}; longest:")
    for pause, generation, test in sorted(_gc_pauses, reverse=True)[:5]:
        terminalreporter.write_line(f"  {pause * 1000:.0f} ms (generation {generation}) "
                                    f"in {test}")

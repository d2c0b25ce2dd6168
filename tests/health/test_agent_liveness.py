"""A real `Agent` (in-process, file datastore, a fake dataplane manager) whose dataplane loop
hangs: /liveness turns 503 within the reporter's timeout naming the dataplane and why, and
200 again once the loop moves. Readiness keeps its meaning (in sync and programmed).
"""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.agent.config import Config
from pyfelix.agent.daemon import Agent, AgentOptions
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.lab.ports import free_port

TIMEOUT = 1.0  # FELIX_HEALTHTIMEOUTOVERRIDES below


class StuckManager(ManagerBase):
    """apply() blocks on `release` while `armed` is set: a manager stuck in a syscall."""

    name = "stuck"
    policy_critical = False

    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.applies = 0

    def on_update(self, msg: object) -> None:
        return None

    def apply(self) -> None:
        self.applies += 1
        if self.armed.is_set():
            self.blocked.set()
            self.release.wait(30)


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except OSError:
        return 0, {}


def _wait_status(port: int, path: str, status: int, timeout: float) -> tuple[float, dict]:
    """Poll until `path` answers `status`; (seconds it took, body)."""
    started = time.monotonic()
    while True:
        code, body = _get(port, path)
        if code == status:
            return time.monotonic() - started, body
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{path} still {code} after {timeout} s: {body}")
        time.sleep(0.05)


@pytest.fixture
def restore_process_state() -> Iterator[None]:
    """The agent configures the root logger and freezes the GC once in sync: undo both."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        gc.unfreeze()


def test_a_hung_dataplane_loop_fails_liveness_then_recovers(
        tmp_path: Path, restore_process_state: None) -> None:
    datastore = tmp_path / "ds"
    datastore.mkdir()
    (datastore / "resources.yaml").write_text("")
    port = free_port()
    stuck = StuckManager()

    def managers(_config: Config) -> tuple[str, list]:
        return "fake", [stuck]

    location = DatastoreLocation.file(datastore)
    agent = Agent(AgentOptions(datastore=location, hostname="node1", environ={
        "FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.1",
        "FELIX_HEALTHPORT": str(port),
        "FELIX_HEALTHTIMEOUTOVERRIDES": f"dataplane={TIMEOUT:g}s",
        # the loop re-applies every 0.2 s even with nothing new (its resync)
        "FELIX_ROUTEREFRESHINTERVAL": "0.2s",
    }), managers_factory=managers, monitor_interfaces=False)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(agent.run()), daemon=True)
    thread.start()
    try:
        _wait_status(port, "/readiness", 200, 20)
        _wait_status(port, "/liveness", 200, 5)

        stuck.armed.set()
        assert stuck.blocked.wait(5), "the dataplane loop never applied again"
        took, body = _wait_status(port, "/liveness", 503, TIMEOUT + 2)
        assert took <= TIMEOUT + 0.5, f"liveness noticed the hang only after {took:.2f} s"
        [problem] = body["problems"]
        assert re.fullmatch(r"dataplane: no report for \d+\.\d s \(timeout 1 s\)", problem)
        assert body["reporters"]["dataplane"]["live"] is False
        assert body["reporters"]["calc-graph"]["live"] is True
        # readiness keeps its meaning: the node is still in sync and was programmed
        assert _get(port, "/readiness")[0] == 200

        stuck.armed.clear()
        stuck.release.set()
        _, body = _wait_status(port, "/liveness", 200, 2)
        assert body["problems"] == []
        applies = stuck.applies
        time.sleep(0.5)
        assert stuck.applies > applies, "the loop did not carry on after the hang"
    finally:
        stuck.release.set()
        agent.request_stop()
        thread.join(20)
    assert exit_codes == [0]

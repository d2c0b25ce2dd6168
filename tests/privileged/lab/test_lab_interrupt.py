"""`pyfelix lab run` interrupted (SIGINT, SIGTERM, SIGKILL) leaves nothing behind.

Each test runs the real CLI in a subprocess with `--hold`, so the lab is certainly up when the
signal arrives (or, for the build test, signals it as soon as it announces the build).
SIGINT/SIGTERM must tear down in-process; after SIGKILL nothing can, and the sweep must.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab import naming
from pyfelix.lab.netns import list_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.runstate import sweep_stale_runs
from pyfelix.lab.scenario import parse_scenario

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
SCENARIO = """\
name: interrupt-me
nodes: [node1, node2]
namespaces: [{name: x}]
pods:
  - {namespace: x, name: a, node: node1, ports: [{port: 80}]}
  - {namespace: x, name: b, node: node1, ports: [{port: 80}]}
  - {namespace: x, name: c, node: node2, ports: [{port: 53, protocol: UDP}]}
probes:
  - {from: x/a, to: x/b, port: 80}
  - {from: x/a, to: x/c, port: 53, protocol: UDP}
"""
RUN_LINE = re.compile(r"lab (pf[0-9a-f]{6}): (\w+)")
WAIT_SECONDS = 30.0


class LabProcess:
    """`pyfelix lab run` in a subprocess, with its stderr read line by line up to a deadline."""

    def __init__(self, scenario_file: Path, hold: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyfelix.cli.main", "lab", "run", str(scenario_file),
             "--no-agent", "--hold", str(hold), "--probe-timeout", "0.5"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.stderr: list[str] = []
        self.run_id: str | None = None

    def wait_for(self, phase: str) -> None:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.5)
            if not ready:
                continue
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr.append(line)
            match = RUN_LINE.search(line)
            if match:
                self.run_id = match.group(1)
                if match.group(2) == phase:
                    return
        pytest.fail(f"lab never reached {phase!r}; stderr so far:\n{''.join(self.stderr)}")

    def finish(self, timeout: float = WAIT_SECONDS) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.stderr) + err

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=WAIT_SECONDS)


def run_namespaces(run_id: str) -> list[str]:
    return [n for n in list_netns() if naming.parse_run_id(n) == run_id]


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "interrupt-me.yaml"
    path.write_text(SCENARIO)
    return path


@pytest.mark.parametrize(("signum", "phase"), [
    # SIGINT takes the same teardown path as SIGTERM (one handler): make test-matrix runs it
    pytest.param(signal.SIGINT, "holding", marks=pytest.mark.extended),
    (signal.SIGTERM, "holding"),
    (signal.SIGTERM, "building"),
])
def test_signalled_run_tears_itself_down(
    scenario_file: Path, root_guard: Any, signum: int, phase: str
) -> None:
    lab = LabProcess(scenario_file)
    try:
        lab.wait_for(phase)
        assert lab.run_id is not None
        if phase == "holding":
            assert len(run_namespaces(lab.run_id)) == 1 + 2 + 3
        lab.proc.send_signal(signum)
        code, stderr = lab.finish()
    finally:
        lab.kill_if_running()
    assert code == 128 + signum, stderr
    assert f"interrupted by {signal.Signals(signum).name}; torn down" in stderr
    assert "Traceback" not in stderr
    assert run_namespaces(lab.run_id) == []
    assert not naming.run_state_dir(lab.run_id).exists()
    root_guard.check()


def test_sweep_removes_what_a_sigkilled_run_left(scenario_file: Path, root_guard: Any) -> None:
    lab = LabProcess(scenario_file)
    try:
        lab.wait_for("holding")
        lab.proc.send_signal(signal.SIGKILL)
        code, _ = lab.finish()
    finally:
        lab.kill_if_running()
    assert code == -signal.SIGKILL
    run_id = lab.run_id
    assert run_id is not None
    left = run_namespaces(run_id)
    assert len(left) == 1 + 2 + 3  # nothing could tear down: the sweep has work to do
    assert naming.run_state_dir(run_id).is_dir()

    report = sweep_stale_runs()

    assert run_id in report.removed_runs
    assert set(left) <= set(report.removed_netns)
    assert run_namespaces(run_id) == []
    assert not naming.run_state_dir(run_id).exists()
    assert report.errors == []
    root_guard.check()


def test_sweep_leaves_a_live_run_alone(root_guard: Any) -> None:
    scenario = parse_scenario({"namespaces": [{"name": "x"}],
                               "pods": [{"namespace": "x", "name": "a", "ports": [{"port": 80}]},
                                        {"namespace": "x", "name": "b"}],
                               "probes": [{"from": "x/b", "to": "x/a", "port": 80}]})
    with LabRunner(scenario, probe_timeout=0.5) as lab:
        lab.build()
        before = run_namespaces(lab.run_id)
        report = sweep_stale_runs()
        assert lab.run_id in report.live_runs
        assert run_namespaces(lab.run_id) == before
        assert [r.result for r in lab.run_steps()] == ["allow"]
        assert lab.state.path.is_dir()
    assert run_namespaces(lab.run_id) == []
    root_guard.check()


# A lab process that starts a long-lived process in its node namespace (as the agents and BIRD
# will be started), says so, and waits to be killed.
LAB_WITH_NODE_PROCESS = """\
import subprocess, sys, time
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
scenario = parse_scenario({"namespaces": [{"name": "x"}],
                           "pods": [{"namespace": "x", "name": "a"}]})
with LabRunner(scenario) as lab:
    lab.build()
    child = subprocess.Popen(["ip", "netns", "exec", lab.topology.nodes["node1"].netns,
                              "sleep", "120"])
    print(lab.run_id, child.pid, flush=True)
    time.sleep(120)
"""


def test_sweep_kills_processes_left_in_a_stale_run(root_guard: Any) -> None:
    lab = subprocess.Popen([sys.executable, "-c", LAB_WITH_NODE_PROCESS], cwd=REPO,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert lab.stdout is not None
        run_id, pid_text = lab.stdout.readline().split()
        orphan = int(pid_text)
        deadline = time.monotonic() + WAIT_SECONDS
        while os.readlink(f"/proc/{orphan}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "ip netns exec never entered the namespace"
            time.sleep(0.02)
        lab.kill()
        lab.wait(timeout=WAIT_SECONDS)
        assert Path(f"/proc/{orphan}").exists()  # outlived the lab, still in its namespace

        report = sweep_stale_runs()

        assert orphan in report.killed_pids
        assert run_id in report.removed_runs
        assert run_namespaces(run_id) == []
        deadline = time.monotonic() + WAIT_SECONDS
        while _running(orphan):
            assert time.monotonic() < deadline, f"pid {orphan} survived the sweep"
            time.sleep(0.05)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    root_guard.check()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"

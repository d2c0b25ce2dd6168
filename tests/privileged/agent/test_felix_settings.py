"""Felix's settings, as an operator moving from Calico brings them, on a real agent process.

Every name of Felix's parameter table (agent.felix_params) set to Felix's default, from the
environment, from a config file and from a FelixConfiguration: the agent starts, programs
its dataplane, does not restart itself, and `pyfelix status` lists the not-implemented
parameters. Felix's sample environment starts the agent too. Two settings differ from
Felix's default on purpose: LogFilePath (a file of the test's, not the machine's
/var/log/calico/felix.log) and LogSyslogAddress (pyfelix's own: a unix datagram socket the
test binds, never the machine's syslog; LogSeveritySys stays at Felix's INFO).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyfelix.agent.config import NOT_IMPLEMENTED
from pyfelix.agent.felix_params import FELIX_PARAMS, FELIX_PARAMS_BY_KEY
from tests.privileged.agent.test_agent_process import (
    POLICY,
    REPO,
    in_ns,
    start_agent,
    wait_for,
)

pytestmark = pytest.mark.privileged

STAY_UP_S = 3.0  # after in-sync: long enough for a restart loop to show


@pytest.fixture(autouse=True)
def _no_suite_log_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py turns file and syslog logging off for every agent; here they come
    from the source under test (LogFilePath and LogSyslogAddress are the test's own)."""
    monkeypatch.delenv("FELIX_LOGSEVERITYSYS", raising=False)
    monkeypatch.delenv("FELIX_LOGFILEPATH", raising=False)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"pfset{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def felix_defaults(*, local: bool = True) -> dict[str, str]:
    """Felix's name -> Felix's default (names with no default are left unset, as an empty
    value is in Felix); `local=False` leaves out what a FelixConfiguration may not set."""
    return {p.name: p.default for p in FELIX_PARAMS if p.default and (local or not p.local)}


def expected_not_implemented(*, local: bool = True) -> set[str]:
    return {name for name in NOT_IMPLEMENTED
            if name in felix_defaults(local=local)}


def run_and_check(netns_name: str, tmp_path: Path, env: dict[str, str],
                  config_file: Path | None, expected: set[str]) -> dict[str, Any]:
    datastore = tmp_path / "ds"
    syslog_path = tmp_path / "syslog.sock"
    syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    syslog.bind(str(syslog_path))
    syslog.settimeout(5)
    status_path = tmp_path / "status.json"
    env = {**env, "FELIX_LOGFILEPATH": str(tmp_path / "log" / "felix.log"),
           "FELIX_LOGSYSLOGADDRESS": str(syslog_path), "FELIX_STATUSFILE": str(status_path)}
    agent = start_agent(netns_name, datastore, env, tmp_path / "agent.log",
                        config_file=config_file)
    try:
        def in_sync() -> bool:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            try:
                status = json.loads(status_path.read_text())
            except (OSError, ValueError):
                return False
            return bool(status["dataplane_in_sync"] and status["calc_in_sync"])

        wait_for(in_sync, 60, "the agent in sync")
        time.sleep(STAY_UP_S)
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
        assert "cali-tw-cali0123456789a" in in_ns(netns_name, "iptables-save", "-t",
                                                  "filter").stdout
        shown = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "status", "--status-file",
                                str(status_path), "-o", "json"], cwd=REPO,
                               capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        listed = json.loads(shown.stdout)["agent"]["not_implemented"]
        assert set(listed.split(",")) == expected
        table = subprocess.run([sys.executable, "-m", "pyfelix.cli.main", "status", "--status-file",
                                str(status_path)], cwd=REPO, capture_output=True, text=True,
                               timeout=30).stdout
        assert "not_implemented" in table and all(name in table for name in expected)
        log = (tmp_path / "log" / "felix.log").read_text()
        for name in expected:  # one warning each, naming it
            assert log.count(f"Felix parameter {name} ") == 1, name
        assert "restarts with it" not in log
        assert syslog.recv(65536).startswith(b"<")  # LogSeveritySys INFO reaches syslog
        return json.loads(status_path.read_text())
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(timeout=15)
        syslog.close()


def _datastore(tmp_path: Path, *extra: dict[str, Any]) -> None:
    datastore = tmp_path / "ds"
    datastore.mkdir()
    (datastore / "resources.yaml").write_text(POLICY + "".join(
        "---\n" + yaml.safe_dump(doc) for doc in extra))


def test_every_felix_name_at_its_default_from_env(netns: str, tmp_path: Path) -> None:
    _datastore(tmp_path)
    env = {f"FELIX_{name.upper()}": value for name, value in felix_defaults().items()}
    run_and_check(netns, tmp_path, env, None, expected_not_implemented())


def test_every_felix_name_at_its_default_from_a_config_file(netns: str, tmp_path: Path) -> None:
    _datastore(tmp_path)
    conf = tmp_path / "felix.cfg"
    conf.write_text("[global]\n" + "".join(f"{name} = {value}\n"
                                          for name, value in felix_defaults().items()))
    run_and_check(netns, tmp_path, {}, conf, expected_not_implemented())


def test_every_felix_name_at_its_default_from_a_felixconfiguration(
        netns: str, tmp_path: Path) -> None:
    spec = {name[0].lower() + name[1:]: value
            for name, value in felix_defaults(local=False).items()}
    spec["logFilePath"] = str(tmp_path / "log" / "felix.log")  # the datastore wins over env
    _datastore(tmp_path, {"apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
                          "metadata": {"name": "default"}, "spec": spec})
    assert FELIX_PARAMS_BY_KEY["datastoretype"].local
    run_and_check(netns, tmp_path, {}, None, expected_not_implemented(local=False))


def test_felix_sample_environment_starts_the_agent(netns: str, tmp_path: Path) -> None:
    _datastore(tmp_path)
    env = {"FELIX_IPV6SUPPORT": "false", "FELIX_IPINIPMTU": "1440", "FELIX_ETCDENDPOINTS": "",
           "FELIX_ETCDADDR": "127.0.0.1:2379", "FELIX_DEFAULTENDPOINTTOHOSTACTION": "ACCEPT",
           "FELIX_LOGSEVERITYSCREEN": "info", "FELIX_HEALTHENABLED": "true",
           "FELIX_IPINIPENABLED": "false", "FELIX_BPFENABLED": "false",
           "FELIX_POLICYSYNCPATHPREFIX": "/var/run/nodeagent"}
    run_and_check(netns, tmp_path, env, None,
                  {"PolicySyncPathPrefix"})

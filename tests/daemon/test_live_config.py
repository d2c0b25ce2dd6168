"""Felix's live parameters applied by the agent without a restart (Agent._on_datastore_config
-> apply_live), and restart parameters making it stop for a restart.

Live here: LogSeverityScreen / LogSeverityFile / LogSeveritySys (the sinks' levels change),
HealthTimeoutOverrides (the registered reporters' timeouts change). DefaultEndpointToHostAction,
the failsafe ports and BPFEnforceRPF are applied by the dataplane managers from the same
ConfigUpdate (tests/dataplane/test_dp_host_endpoints.py, test_dp_iptables_render.py,
tests/privileged/bpf/test_priv_bpf_policy.py).
"""

from __future__ import annotations

import logging
import logging.handlers
import socket
from pathlib import Path

import pytest

from pyfelix.agent.config import load_config
from pyfelix.agent.daemon import Agent, AgentOptions
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.health import HealthAggregator
from pyfelix.agent.logs import configure_logging


@pytest.fixture
def agent(tmp_path: Path):
    syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    syslog.bind(str(tmp_path / "syslog.sock"))
    environ = {"FELIX_LOGFILEPATH": str(tmp_path / "felix.log"),
               "FELIX_LOGSEVERITYSYS": "Error",
               "FELIX_LOGSYSLOGADDRESS": str(tmp_path / "syslog.sock")}
    agent = Agent(AgentOptions(datastore=DatastoreLocation.file(tmp_path), hostname="node1",
                               environ=environ))
    agent.config = load_config(environ=environ)
    health = HealthAggregator()
    health.register("dataplane", timeout=90.0)
    health.register("calc-graph", timeout=60.0)
    agent._health = health
    from pyfelix.agent.daemon import log_sinks

    configure_logging(log_sinks(agent.config))
    yield agent
    configure_logging("Info")
    syslog.close()


def _levels() -> dict[str, int]:
    out = {}
    for handler in logging.getLogger().handlers:
        if not getattr(handler, "_pyfelix_sink", False):
            continue  # pytest's own capture handlers
        if isinstance(handler, logging.handlers.SysLogHandler):
            out["sys"] = handler.level
        elif isinstance(handler, logging.handlers.RotatingFileHandler):
            out["file"] = handler.level
        elif isinstance(handler, logging.StreamHandler):
            out["screen"] = handler.level
    return out


@pytest.mark.parametrize(("spec_key", "sink"), [("logSeverityScreen", "screen"),
                                                ("logSeverityFile", "file"),
                                                ("logSeveritySys", "sys")])
def test_log_severities_apply_live(agent: Agent, spec_key: str, sink: str) -> None:
    before = _levels()
    assert before[sink] != logging.DEBUG
    agent._on_datastore_config({spec_key: "Debug"})
    assert agent._restart_reason is None and not agent._stop.is_set()
    after = _levels()
    assert after[sink] == logging.DEBUG
    assert {k: v for k, v in after.items() if k != sink} == \
        {k: v for k, v in before.items() if k != sink}
    assert agent.config is not None and agent.config.source_of(spec_key) == "datastore:default"


def test_log_severity_none_turns_the_sink_off_live(agent: Agent) -> None:
    agent._on_datastore_config({"logSeveritySys": "none"})
    assert "sys" not in _levels() and not agent._stop.is_set()


def test_health_timeout_overrides_apply_live(agent: Agent) -> None:
    assert agent._health is not None
    agent._on_datastore_config({"healthTimeoutOverrides":
                                '[{"name": "dataplane", "timeout": "3m"}]'})
    assert not agent._stop.is_set()
    summary = agent._health.summary()
    assert summary["dataplane"]["timeout"] == 180.0 and summary["calc-graph"]["timeout"] == 60.0
    # removed again: the loop's own timeout comes back
    agent._on_datastore_config({})
    assert agent._health.summary()["dataplane"]["timeout"] == 90.0


def test_too_short_override_is_raised_to_two_report_intervals(agent: Agent) -> None:
    assert agent._health is not None
    agent._on_datastore_config({"healthTimeoutOverrides": "dataplane=1s"})
    assert agent._health.summary()["dataplane"]["timeout"] == 20.0  # reports every 10 s


def test_felix_live_not_implemented_parameters_do_not_restart(agent: Agent) -> None:
    agent._on_datastore_config({"clusterGUID": "abc", "clusterType": "k8s,bgp",
                                "calicoVersion": "v3.30"})
    assert not agent._stop.is_set()
    assert agent.config is not None and agent.config.get("ClusterGUID") == "abc"


def test_restart_parameter_stops_the_agent_for_a_restart(agent: Agent) -> None:
    agent._on_datastore_config({"logSeverityScreen": "Debug", "iptablesRefreshInterval": "60"})
    assert agent._stop.is_set()
    assert agent._restart_reason == "configuration changed: IptablesRefreshInterval"


def test_bad_value_at_runtime_is_counted_and_the_rest_applies(agent: Agent) -> None:
    agent._on_datastore_config({"logSeverityScreen": "Debug", "ipipMTU": "huge"})
    assert not agent._stop.is_set()
    assert _levels()["screen"] == logging.DEBUG

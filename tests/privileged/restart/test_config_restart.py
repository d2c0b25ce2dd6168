"""Felix's restart rule, for real: a FelixConfiguration change to a restart parameter makes
the agent exit 0 and its supervisor (here the test) starts it again, while an established
TCP connection through the node keeps working; a live parameter's change is applied
without a restart.

The lab of bench.restart (pods x/a -> x/b:80 allowed) in BPF mode; a HeldFlow from
x/a to x/b:80 exchanges a message every 20 ms for the whole test.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from pyfelix.bench.restart import SCENARIO, HeldFlow, PinKeepingAgents, _wait_for
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.scenario import parse_scenario
from tests.privileged.lab.conftest import RootGuard

pytestmark = pytest.mark.privileged


@pytest.fixture
def root_guard() -> RootGuard:
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, BPF)")
    return RootGuard()


def felix_configuration(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
            "metadata": {"name": "default"}, "spec": spec}


def test_restart_parameter_in_felixconfiguration_restarts_with_flow_kept(
        root_guard: RootGuard) -> None:
    scenario = parse_scenario(SCENARIO, source="<config restart test>")
    agents = PinKeepingAgents("bpf")
    first = scenario.steps[0]
    with LabRunner(scenario, agents=agents, program_routes=False, probe_timeout=1.5,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        lab.build()
        lab.start_agents()
        lab.apply_resources(first.apply)
        lab.wait_in_sync()
        server = scenario.pod("x/b")
        flow = HeldFlow(lab.topology.pods["x/a"].netns, (str(server.ip), 80)).start()
        try:
            _wait_for(lambda: flow.echoed >= 10 or bool(flow.failures), 10.0)
            process = agents.processes["agent:node1"]

            # 1. a live parameter: applied, no restart
            lab.apply_resources([felix_configuration({"logSeverityScreen": "Debug"})])
            _wait_for(lambda: "LogSeverityScreen changed" in agents.log_text("node1"), 20.0)
            assert process.poll() is None

            # 2. a restart parameter (implemented) and a not-implemented one Felix restarts on
            lab.apply_resources([felix_configuration({
                "logSeverityScreen": "Debug", "routeRefreshInterval": "45s",
                "wireguardMTU": 1400})])
            assert process.wait(timeout=30) == 0  # a clean exit for the supervisor
            log = agents.log_text("node1")
            assert "configuration changed: RouteRefreshInterval, WireguardMTU; exiting" in log
            down_at = time.monotonic()
            agents.restart("node1")  # the supervisor's part
            lab.wait_in_sync()
            restarted = time.monotonic() - down_at
            echoed_before = flow.echoed
            _wait_for(lambda: flow.echoed >= echoed_before + 10 or bool(flow.failures), 10.0)
            status = json.loads(agents.status_paths["node1"].read_text())
            assert status["not_implemented"] == "WireguardMTU"
            assert agents.processes["agent:node1"].poll() is None  # no restart loop
        finally:
            flow.stop()
        assert flow.failures == [], flow.failures
        assert restarted > 0
    root_guard.check()


def cluster_information(ready: bool) -> dict[str, Any]:
    return {"apiVersion": "projectcalico.org/v3", "kind": "ClusterInformation",
            "metadata": {"name": "default"},
            "spec": {"datastoreReady": ready, "clusterGUID": "0f3c0ffee"}}


def test_datastore_not_ready_pauses_dataplane_updates(root_guard: RootGuard) -> None:
    """ClusterInformation datastoreReady false: a policy deleted meanwhile stays programmed
    (port 9000 still admitted), the agent keeps running; true again: the deletion lands."""
    scenario = parse_scenario(SCENARIO, source="<datastore ready test>")
    agents = PinKeepingAgents("bpf")
    first, second = scenario.steps
    with LabRunner(scenario, agents=agents, program_routes=False, probe_timeout=1.5,
                   handle_signals=threading.current_thread() is threading.main_thread(),
                   ) as lab:
        lab.build()
        lab.start_agents()
        lab.apply_resources([*first.apply, cluster_information(True)])
        lab.wait_in_sync()
        assert [r.result for r in lab.run_probes(first.probes)] == ["allow", "allow"]
        lab.apply_resources([cluster_information(False)])
        _wait_for(lambda: "dataplane updates paused" in agents.log_text("node1"), 20.0)
        lab.delete_resources(second.delete)
        time.sleep(2.0)  # several loop rounds: nothing may be written
        assert [r.result for r in lab.run_probes(second.probes, 1)] == ["allow", "allow"]
        assert agents.processes["agent:node1"].poll() is None
        lab.apply_resources([cluster_information(True)])
        _wait_for(lambda: "dataplane updates resume" in agents.log_text("node1"), 20.0)
        lab.wait_in_sync()
        deadline = time.monotonic() + 20
        results: list[str] = []
        while time.monotonic() < deadline:
            results = [r.result for r in lab.run_probes(second.probes, 1)]
            if results == ["allow", "deny"]:
                break
        assert results == ["allow", "deny"]
        assert agents.processes["agent:node1"].poll() is None  # paused, not restarted
    root_guard.check()

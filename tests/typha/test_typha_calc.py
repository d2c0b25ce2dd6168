"""The calc pipeline fed through Typha computes what it computes from the datastore itself:
`pyfelix calc`'s summary over a TyphaSyncer equals the summary over the file datastore,
before and after a Typha restart during which resources were deleted and changed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from typha_testlib import CALICO, FileStore, gnp, ippool, wep

from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane
from pyfelix.agent.calc.pipeline import CalcPipeline
from pyfelix.agent.calc.snapshot import compute
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.syncer.api import ResourceKey

NODE = "node1"


def _policy(name: str, selector: str, source: str) -> dict[str, Any]:
    doc = gnp(name, selector)
    doc["spec"]["ingress"] = [{"action": "Allow", "source": {"selector": source}}]
    return doc


def _profile(name: str) -> dict[str, Any]:
    return {"apiVersion": CALICO, "kind": "Profile", "metadata": {"name": name},
            "spec": {"ingress": [{"action": "Allow"}], "egress": [{"action": "Allow"}]}}


def _seed(store: FileStore) -> None:
    for i in range(6):
        doc = wep(f"pod{i}", "shop", node=NODE if i < 4 else "node2", ip=f"10.65.0.{i + 1}",
                  labels={"role": "db" if i % 2 else "web"})
        doc["spec"]["profiles"] = ["open"]
        store.put(doc)
    store.put(_profile("open"), ippool("pool", "10.65.0.0/16"),
              _policy("db-from-web", "role == 'db'", "role == 'web'"),
              _policy("web-from-all", "role == 'web'", "all()"))


def _wait_same(pipeline: CalcPipeline, state: ExpectedDataplane, store: FileStore,
               timeout: float = 15.0) -> dict[str, Any]:
    expected = compute(DatastoreLocation.file(store.root), NODE).summary
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pipeline.in_sync.is_set() and pipeline.idle():
            try:
                if state.summary() == expected:
                    return expected
            except RuntimeError:  # read while the pipeline thread was writing: try again
                pass
        time.sleep(0.05)
    raise AssertionError(f"calc over Typha never matched calc over the datastore:\n"
                         f"{state.summary()}\n!=\n{expected}")


@pytest.fixture
def calc_over(start_client):
    pipelines: list[CalcPipeline] = []

    def start(address: tuple[str, int], **options: Any) -> tuple[CalcPipeline, ExpectedDataplane]:
        state = ExpectedDataplane(strict=False)
        pipeline = CalcPipeline(NODE, state)
        pipeline.start()
        pipelines.append(pipeline)
        start_client(address, recorder=pipeline, **options)
        return pipeline, state

    yield start
    for pipeline in pipelines:
        pipeline.stop()


def test_calc_through_typha_matches_the_datastore(store: FileStore, start_server,
                                                   calc_over) -> None:
    _seed(store)
    server = start_server()
    pipeline, state = calc_over(server.address, min_attempts=50, retry_max=0.2)
    summary = _wait_same(pipeline, state, store)
    assert summary["endpoints"] and summary["ipsets"]  # a real computation, not empties

    port = server.address[1]
    server.stop()
    store.delete(ResourceKey("WorkloadEndpoint", "shop", "pod1"),
                 ResourceKey("GlobalNetworkPolicy", "", "web-from-all"))
    store.put(_policy("db-from-db", "role == 'db'", "role == 'db'"))
    start_server(port=port)
    after = _wait_same(pipeline, state, store)
    assert after != summary

"""agent-memory's pieces that need no lab: the remote pods it writes are valid Pods that
become remote WorkloadEndpoints, a file of them fits the input limits, and the slope."""

from __future__ import annotations

import json

import pytest

from pyfelix.agent.conversion.k8s import to_calico
from pyfelix.agent.inputs.limits import LIMITS
from pyfelix.agent.model import WorkloadEndpoint, parse_resource
from pyfelix.bench.agent_memory import (
    PODS_PER_FILE,
    cluster_documents,
    remote_pod,
    slope,
)


def test_remote_pods_become_remote_workload_endpoints():
    for index in (0, 1, 29_999):
        (endpoint,) = to_calico(parse_resource(remote_pod(index))).values()
        assert isinstance(endpoint, WorkloadEndpoint)
        assert endpoint.node.startswith("remote-")
        assert endpoint.ip_networks == (remote_pod(index)["status"]["podIP"] + "/32",)
    addresses = {remote_pod(i)["status"]["podIP"] for i in range(30_000)}
    assert len(addresses) == 30_000


def test_a_file_of_remote_pods_fits_the_document_limit():
    items = [remote_pod(i) for i in range(PODS_PER_FILE)]
    size = len(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert size < LIMITS.max_document_bytes / 2


def test_cluster_documents_parse():
    for doc in cluster_documents():
        parse_resource(doc)


def test_slope_is_least_squares():
    assert slope({0: 100.0, 10: 150.0, 20: 200.0}) == pytest.approx(5.0)
    assert slope({0: 0.0, 10: 12.0, 20: 18.0}) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        slope({5: 1.0})

"""The Kubernetes datastore gives the same `pyfelix calc` result as the file datastore for
the same cluster (tests/fakes_kube/calc_scenario.py). No kube-apiserver can be installed
on the test machines: the cluster lives in the in-process fake API server of
tests/fakes_kube, which serves it over the real list/watch protocol.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pyfelix.agent.calc.snapshot import compute
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.syncer.kube import KubeSyncer
from pyfelix.agent.syncer.kube_api import KubeAPI
from pyfelix.agent.syncer.kube_resources import to_crd_object
from tests.fakes_kube.calc_scenario import (
    HOSTNAME,
    PODS,
    SCENARIO_YAML,
    calc_summary,
    write_file_datastore,
)
from tests.fakes_kube.server import FakeKubeAPIServer


def test_same_calc_output_as_the_file_datastore(fake_kube: FakeKubeAPIServer,
                                                kube_api: KubeAPI, tmp_path: Path) -> None:
    resources = write_file_datastore(tmp_path)
    expected = compute(DatastoreLocation.file(resources), HOSTNAME).summary
    assert expected["endpoints"] and expected["ipsets"]  # a scenario with substance

    for doc in [*yaml.safe_load_all(SCENARIO_YAML), *PODS]:
        if doc["apiVersion"] == "projectcalico.org/v3":
            doc = to_crd_object(doc)
        fake_kube.cluster.put_object(doc)
    assert calc_summary(KubeSyncer(kube_api)) == expected

"""Resources applied to a REAL etcd give the same `pyfelix calc` result as the file
datastore holding the same resources (tests/fakes_kube/calc_scenario.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyfelix.agent.calc.snapshot import compute
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.syncer.etcd import EtcdSyncer
from pyfelix.agent.syncer.etcd_store import EtcdDatastore
from pyfelix.agent.syncer.file import load_path
from pyfelix.agent.validator import validate_document
from tests.fakes_kube.calc_scenario import HOSTNAME, calc_summary, write_file_datastore
from tests.privileged.etcd.etcd_server import EtcdServer

pytestmark = pytest.mark.privileged


def test_same_calc_output_as_the_file_datastore(etcd: EtcdServer, tmp_path: Path) -> None:
    resources = write_file_datastore(tmp_path)
    expected = compute(DatastoreLocation.file(resources), HOSTNAME).summary
    assert expected["endpoints"] and expected["ipsets"]  # a scenario with substance

    # As `pyfelix apply -f DIR --datastore etcd3://...` does: read, validate, write.
    updates, errors = load_path(str(resources))
    assert errors == []
    store = EtcdDatastore(etcd.writer_config(), validate=validate_document)
    store.apply([u.value or {} for u in updates], sources=[u.source for u in updates])
    assert calc_summary(EtcdSyncer(etcd.config())) == expected

"""The issue's acceptance through the CLI, against a REAL etcd: `pyfelix apply` rejects an
invalid document with its field path and writes nothing; resources applied with
`pyfelix apply` give the same `pyfelix calc -o json` output as the file datastore; `get`
and `delete` work on etcd.

These go through the real wiring: `agent.datastore.open_datastore` / `make_syncer`
send `etcd3://` URLs to `agent.syncer.etcd_store` / `agent.syncer.etcd`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyfelix.cli.main import cli
from tests.fakes_kube.calc_scenario import HOSTNAME, write_file_datastore
from tests.privileged.etcd.etcd_server import EtcdServer
from tests.privileged.etcd.etcd_testlib import etcd_contents

pytestmark = pytest.mark.privileged


_INVALID = """\
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: fine}
spec: {selector: all()}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: broken}
spec: {selector: "app =="}
"""


def test_apply_get_delete_and_calc_match_the_file_datastore(
        etcd: EtcdServer, tmp_path: Path) -> None:
    url = f"etcd3://{etcd.endpoint}"
    runner = CliRunner()
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(_INVALID)
    result = runner.invoke(cli, ["apply", "-f", str(invalid), "--datastore", url])
    assert result.exit_code != 0
    assert "nothing was written" in result.output
    assert "GlobalNetworkPolicy(broken)" in result.output and "spec.selector" in result.output
    assert etcd_contents(etcd.writer_config()) == {}

    resources = write_file_datastore(tmp_path)
    result = runner.invoke(cli, ["apply", "-f", str(resources), "--datastore", url])
    assert result.exit_code == 0, result.output
    assert "Pod(shop/web-1) created" in result.output

    from_file = runner.invoke(cli, ["calc", "--datastore", str(resources), "--hostname",
                                    HOSTNAME, "-o", "json"])
    from_etcd = runner.invoke(cli, ["calc", "--datastore", url, "--hostname", HOSTNAME,
                                    "-o", "json"])
    assert from_file.exit_code == 0 and from_etcd.exit_code == 0, from_etcd.output
    assert json.loads(from_etcd.output) == json.loads(from_file.output)
    assert json.loads(from_file.output)["endpoints"]

    result = runner.invoke(cli, ["get", "globalnetworkpolicy", "allow-admin", "-o", "json",
                                 "--datastore", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spec"]["order"] == 10
    result = runner.invoke(cli, ["delete", "globalnetworkpolicy", "allow-admin",
                                 "--datastore", url])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["get", "globalnetworkpolicy", "allow-admin",
                                 "--datastore", url])
    assert result.exit_code != 0 and "not found" in result.output

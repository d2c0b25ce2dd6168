"""The BGP view (validated resources, problems), `birdc show protocols` parsing, and the
`pyfelix confd` CLI."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner
from confd_fakes import delete, doc_node, doc_peer, doc_pool, upd

from pyfelix.agent.syncer.api import RawUpdate, ResourceKey
from pyfelix.cli.main import cli
from pyfelix.confd.bgp_view import BGPView
from pyfelix.confd.bird import parse_show_protocols

REPO = Path(__file__).resolve().parents[2]


def test_view_keeps_bgp_kinds_and_ignores_others() -> None:
    view = BGPView()
    other = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet",
             "metadata": {"name": "x"}, "spec": {"nets": ["10.0.0.0/8"]}}
    assert view.apply(upd(doc_node("node1", "198.18.0.1/15")))
    assert not view.apply(upd(other))
    assert not view.apply(upd(doc_node("node1", "198.18.0.1/15")))  # same again
    assert list(view.snapshot().nodes) == ["node1"]


def test_invalid_update_removes_the_old_version_and_is_listed_until_fixed() -> None:
    view = BGPView()
    good = doc_peer("tor", peerIP="198.19.0.1", asNumber=65100)
    bad = doc_peer("tor", peerIP="198.19.0.1")  # asNumber missing
    view.apply(upd(good))
    assert view.apply(upd(bad))
    assert view.snapshot().peers == {}
    key = ResourceKey("BGPPeer", "", "tor")
    assert "spec.asNumber" in view.problems()[key]
    assert view.apply(upd(good))
    assert view.problems() == {} and list(view.snapshot().peers) == ["tor"]
    view.apply(upd(bad))
    assert view.apply(delete(bad))
    assert view.problems() == {} and view.snapshot().peers == {}


def test_non_mapping_document_is_a_problem_not_a_crash() -> None:
    view = BGPView()
    key = ResourceKey("IPPool", "", "p")
    assert view.apply(RawUpdate(key, {"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
                                      "metadata": {"name": "p"}, "spec": "oops"}))
    assert "IPPool(p)" in view.problems()[key]
    assert view.apply(upd(doc_pool("p", "10.65.0.0/16")))


def test_parse_show_protocols() -> None:
    text = """BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     07:49:02.768
pyfelix_kernel Kernel     master4    up     07:49:02.768
Mesh_198_18_0_2 BGP        ---        up     07:49:04.314  Established
Node_198_19_0_1 BGP  ---  start  2024-01-02 07:49:04  Active        Socket: Connection refused
"""
    states = {p.name: p for p in parse_show_protocols(text)}
    assert sorted(states) == ["Mesh_198_18_0_2", "Node_198_19_0_1", "device1", "pyfelix_kernel"]
    assert states["Mesh_198_18_0_2"].established
    assert not states["Node_198_19_0_1"].established
    assert states["Node_198_19_0_1"].info.startswith("Active")
    assert not states["pyfelix_kernel"].established


def test_cli_render_prints_the_golden_config(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(cli, ["confd", "render", "--datastore",
                                      "tests/confd/cases/mesh", "--hostname", "node2"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (REPO / "tests/confd/golden/mesh/node2.conf").read_text()


def test_cli_render_check_and_warnings(tmp_path: Path) -> None:
    docs = [doc_node("n1", "198.18.0.1/15"), doc_peer("bad", peerIP="198.19.0.1")]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump_all(docs))
    result = CliRunner().invoke(cli, ["confd", "render", "--datastore", str(tmp_path),
                                      "--hostname", "n1", "--check"])
    assert result.exit_code == 0, result.output
    assert "router id 198.18.0.1;" in result.stdout
    assert "BGPPeer(bad): spec.asNumber" in result.stderr


def test_cli_render_unknown_node_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc_node("n1", "198.18.0.1/15")))
    result = CliRunner().invoke(cli, ["confd", "render", "--datastore", str(tmp_path),
                                      "--hostname", "n9"])
    assert result.exit_code != 0
    assert "Node(n9): not in the datastore" in result.output


def test_cli_missing_datastore_path_and_missing_options(tmp_path: Path) -> None:
    runner = CliRunner(env={"NODENAME": None, "PYFELIX_DATASTORE": None})
    result = runner.invoke(cli, ["confd", "render", "--datastore", str(tmp_path / "none"),
                                 "--hostname", "n1"])
    assert result.exit_code != 0 and "does not exist" in result.output
    result = runner.invoke(cli, ["confd", "--hostname", "n1"])
    assert result.exit_code != 0 and "--datastore is required" in result.output
    result = runner.invoke(cli, ["confd", "run", "--datastore", str(tmp_path)])
    assert result.exit_code != 0 and "--hostname is required" in result.output

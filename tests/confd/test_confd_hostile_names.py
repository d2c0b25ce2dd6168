"""Names with a trailing newline never reach bird.conf.

`pyfelix apply` used to create a BGPPeer named `peer1\\n` and a Node `node7\\n` (their names
passed `^...$` regexes checked with `re.match`); every node's bird.conf then carried the
newline inside a comment and `confd render --check` failed on every node. Now `apply`
refuses them, and a datastore that holds them anyway (written by hand) renders a config
BIRD accepts, with the resources listed as skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from confd_fakes import doc_node, doc_peer

from pyfelix.agent.syncer.api import RawUpdate, key_of
from pyfelix.cli.main import cli
from pyfelix.confd.bgp_config import ConfdError, compute_bird_config
from pyfelix.confd.bgp_view import state_from_updates

HOSTILE = [doc_node("node7\n", "198.18.0.7/15"),
           doc_peer("peer1\n", peerIP="198.19.0.1", asNumber=64513)]


def test_apply_refuses_names_with_a_trailing_newline(tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump_all(HOSTILE))
    store = tmp_path / "store"
    result = CliRunner().invoke(cli, ["apply", "-f", str(source), "--datastore", str(store)])
    assert result.exit_code == 1, result.output
    assert "BGPPeer(peer1\\n): metadata.name" in result.output
    assert "Node(node7\\n): metadata.name" in result.output
    assert not store.exists() or not any(p.is_file() and p.suffix == ".yaml"
                                         for p in store.rglob("*"))


def test_render_check_passes_with_such_names_in_the_datastore(tmp_path: Path) -> None:
    docs = [doc_node("n1", "198.18.0.1/15"), *HOSTILE]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump_all(docs))
    result = CliRunner().invoke(cli, ["confd", "render", "--datastore", str(tmp_path),
                                      "--hostname", "n1", "--check"])
    assert result.exit_code == 0, result.output
    assert "peer1" not in result.stdout.replace("peer1\\n", "")  # only as an escaped note
    assert "198.19.0.1" not in result.stdout  # the peer is skipped, not half-rendered
    assert "BGPPeer(peer1\\n): metadata.name" in result.stderr


@pytest.mark.parametrize("prefix", ["cali\n", "cali ", "", "x" * 15, "ca/li"])
def test_interface_prefix_is_checked_whole(prefix: str) -> None:
    node = doc_node("n1", "198.18.0.1/15")
    state, _ = state_from_updates([RawUpdate(key_of(node), node)])
    compute_bird_config(state, "n1", interface_prefix="cali")
    with pytest.raises(ConfdError, match="interface prefix"):
        compute_bird_config(state, "n1", interface_prefix=prefix)

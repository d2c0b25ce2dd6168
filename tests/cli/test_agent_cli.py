"""`pyfelix agent` rejects a bad --datastore with one clear line before it touches anything."""

from __future__ import annotations

from click.testing import CliRunner

from pyfelix.cli.main import cli


def test_unknown_datastore_scheme_is_a_clear_error() -> None:
    result = CliRunner().invoke(cli, ["agent", "--datastore", "etcd4://x", "--hostname", "n"])
    assert result.exit_code == 2
    assert "unknown scheme 'etcd4'" in result.output
    assert "Traceback" not in result.output

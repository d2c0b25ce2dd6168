"""`pyfelix bpf` without a kernel: every map has a dump command, --help has examples, a
missing pin directory is one clear error, and tables are aligned with nested values as JSON.
(Dumps of real pinned maps: tests/privileged/bpf/test_priv_bpf_dataplane.py.)"""

from __future__ import annotations

from click.testing import CliRunner

from pyfelix.agent.bpf.maps import BY_NAME
from pyfelix.cli.commands.bpf import table
from pyfelix.cli.main import cli


def test_help_lists_every_map_with_examples():
    out = CliRunner().invoke(cli, ["bpf", "--help"])
    assert out.exit_code == 0
    for name in BY_NAME:
        assert name in out.output
    assert "Examples:" in out.output and "pyfelix bpf endpoints dump" in out.output


def test_every_map_says_what_it_holds():
    from pyfelix.agent.bpf.maps import BY_NAME
    from pyfelix.cli.commands.bpf import MAP_HELP

    assert set(BY_NAME) - {"rules"} <= set(MAP_HELP)
    assert all(len(text) > 20 for text in MAP_HELP.values())


def test_every_map_has_a_dump_command_with_pin_dir_and_json():
    for name in BY_NAME:
        out = CliRunner().invoke(cli, ["bpf", name, "dump", "--help"])
        assert out.exit_code == 0, out.output
        assert "--pin-dir" in out.output and "json" in out.output


def test_missing_pins_are_one_clear_error(tmp_path):
    out = CliRunner().invoke(cli, ["bpf", "ipsets", "dump", "--pin-dir", str(tmp_path / "no")])
    assert out.exit_code == 1
    assert "not on a bpf filesystem" in out.output and "FELIX_BPFPINDIR" in out.output


def test_pin_dir_comes_from_the_environment(tmp_path):
    out = CliRunner().invoke(cli, ["bpf", "endpoints", "dump"],
                             env={"FELIX_BPFPINDIR": str(tmp_path / "env-dir")})
    assert out.exit_code == 1 and "env-dir" in out.output


def test_unknown_map_is_a_usage_error():
    out = CliRunner().invoke(cli, ["bpf", "nosuchmap", "dump"])
    assert out.exit_code == 2 and "nosuchmap" in out.output


def test_table_aligns_columns_and_prints_nested_values_as_json():
    text = table([{"ifindex": 3, "ingress": {"start": 0, "len": 2}},
                  {"ifindex": 12, "ingress": {"start": 2, "len": 1}, "extra": [1, 2]}])
    lines = text.splitlines()
    assert lines[0].split() == ["IFINDEX", "INGRESS", "EXTRA"]
    assert lines[1].split() == ["3", '{"len":2,"start":0}']
    assert lines[2].split() == ["12", '{"len":1,"start":2}', "[1,2]"]
    assert lines[1].index("{") == lines[2].index("{")  # aligned
    assert table([]) == "(no entries)"


def test_summary_has_help_and_names_a_missing_pin_dir(tmp_path):
    out = CliRunner().invoke(cli, ["bpf", "summary", "--help"])
    assert out.exit_code == 0 and "pyfelix bpf summary" in out.output
    out = CliRunner().invoke(cli, ["bpf", "summary", "--pin-dir", str(tmp_path / "none")])
    assert out.exit_code == 1 and "none" in out.output and "FELIX_BPFPINDIR" in out.output


def test_summary_table_marks_figures_that_do_not_apply():
    from pyfelix.cli.commands.bpf import _summary_cells

    counters = {"map": "rule_counters", "type": "percpu_array", "max_entries": 16,
                "entries": None, "fill_pct": None}
    assert _summary_cells(counters)["entries"] == "-" == _summary_cells(counters)["fill_pct"]
    trie = {"map": "ipsets", "type": "lpm_trie", "max_entries": 4, "entries": 1,
            "fill_pct": 25.0}
    assert _summary_cells(trie) == trie
    missing = {"map": "ids", "error": "not readable: ENOENT"}
    assert _summary_cells(missing) == missing

"""Hostile documents in the file datastore and in `pyfelix apply`: each is rejected ALONE.

Before the input limits (agent.inputs, README "Input limits"):
- `apply` took a policy with a 2.6 MB selector (5.4 s and 584 MB in the CLI, and again in
  every agent);
- a 200,000-deep JSON document crashed `apply` with RecursionError and, in a file datastore
  beside valid resources, `pyfelix calc` (and the file syncer);
- a key given twice in a mapping was silently accepted (`action: Deny` then
  `action: Allow`: Allow won);
- YAML aliases were expanded without bound (the "billion laughs" shape);
- a 5,000-digit integer or an impossible date raised ValueError out of the parser.
Now each such document is reported (file, document, line, resource, field, limit), counted,
and skipped; every other document loads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from click.testing import CliRunner
from prometheus_client import REGISTRY
from syncer_testlib import gnp, gnp_key, write, yaml_docs

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.file import load_path, parse_text
from pyfelix.cli.main import cli

DEEP = 200_000


def run(*args: str) -> tuple[int, str, str, BaseException | None]:
    result = CliRunner().invoke(cli, list(args))
    exception = None if isinstance(result.exception, SystemExit) else result.exception
    return result.exit_code, result.stdout, result.stderr, exception


def deep_json(name: str, depth: int = DEEP) -> str:
    return (f'{{"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet", '
            f'"metadata": {{"name": "{name}"}}, "spec": {{"nets": '
            + "[" * depth + "]" * depth + "}}")


def parse_errors() -> float:
    return REGISTRY.get_sample_value("pyfelix_datastore_parse_errors_total",
                                     {"backend": "file"}) or 0.0


DUPLICATE_ACTION = """\
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata:
  name: dup
spec:
  selector: all()
  ingress:
  - action: Deny
    action: Allow
"""

# 9 levels of 9 aliases: 9**9 (387 million) strings once expanded.
BILLION_LAUGHS = "\n".join(
    ["apiVersion: projectcalico.org/v3", "kind: GlobalNetworkSet",
     "metadata: {name: laughs}", "x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, 9)]
    + ["spec: {nets: *x8}"]) + "\n"

# The same through merge keys, which PyYAML copies eagerly while constructing.
MERGE_LAUGHS = "\n".join(
    ["apiVersion: projectcalico.org/v3", "kind: GlobalNetworkSet",
     "metadata: {name: merges}", "m0: &m0 {a: 1, b: 2}"]
    + [f"m{i}: &m{i} {{<<: [" + ", ".join([f"*m{i - 1}"] * 8) + "]}" for i in range(1, 12)]
    + ["spec: *m11"]) + "\n"

RECURSIVE = """\
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {name: ouroboros}
spec: &loop {nets: [*loop]}
"""


def test_apply_rejects_a_2_6_mb_selector_before_parsing_it(tmp_path: Path) -> None:
    selector = " || ".join(f"k{i} == 'v{i}'" for i in range(118_000))
    assert 2_500_000 < len(selector) < 2_700_000
    source = tmp_path / "big.json"
    source.write_text(json.dumps(gnp("big", selector)))
    started = time.monotonic()
    code, _, err, exception = run("apply", "-f", str(source), "--datastore",
                                  str(tmp_path / "store"))
    elapsed = time.monotonic() - started
    assert exception is None and code == 1
    assert "GlobalNetworkPolicy(big): spec.selector" in err
    assert "max_selector_length (16384)" in err
    assert not (tmp_path / "store").exists()
    assert elapsed < 3.0, elapsed  # was 5.4 s of parsing (and 584 MB)


def test_apply_reports_a_200000_deep_json_document(tmp_path: Path) -> None:
    source = tmp_path / "deep.json"
    source.write_text(deep_json("deep"))
    code, _, err, exception = run("apply", "-f", str(source), "--datastore",
                                  str(tmp_path / "store"))
    assert exception is None, repr(exception)  # was RecursionError
    assert code == 1
    assert "GlobalNetworkSet(deep): spec.nets" in err
    assert "max_nesting_depth (100)" in err


def test_calc_carries_on_beside_a_200000_deep_document(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write(store / "good.yaml", yaml_docs(gnp("good")))
    write(store / "deep.json", deep_json("deep-json"))
    # Nested deeper than the limit but within what YAML's parser takes (1,000 levels).
    write(store / "deep.yaml", yaml_docs(gnp("before")) + "---\n"
          + "kind: GlobalNetworkSet\nmetadata: {name: deep-yaml}\nspec: {nets: "
          + "[" * 900 + "]" * 900 + "}\n---\n" + yaml_docs(gnp("after")))
    code, _, err, exception = run("calc", "--datastore", str(store), "--hostname", "n1",
                                  "-o", "json")
    assert exception is None, repr(exception)  # was RecursionError
    assert code == 0
    assert f"{store / 'deep.json'}#1" in err and "max_nesting_depth" in err
    assert f"{store / 'deep.yaml'}#2" in err

    updates, errors = load_path(str(store))
    assert {u.key for u in updates} == {gnp_key("good"), gnp_key("before"), gnp_key("after")}
    assert [e.source for e in errors] == [f"{store / 'deep.json'}#1",
                                          f"{store / 'deep.yaml'}#2"]


def test_duplicate_keys_reject_their_document_in_yaml_and_json(tmp_path: Path) -> None:
    parsed = parse_text("p.yaml", yaml_docs(gnp("first")) + "---\n" + DUPLICATE_ACTION
                        + "---\n" + yaml_docs(gnp("last")))
    assert [d.key for d in parsed.docs] == [gnp_key("first"), gnp_key("last")]
    [error] = parsed.errors
    assert error.source == "p.yaml#2"
    assert "GlobalNetworkPolicy(dup): spec.ingress[0].action" in error.message
    assert "more than once" in error.message

    text = ('{"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy", '
            '"metadata": {"name": "dup-json"}, "spec": {"selector": "all()", "ingress": '
            '[{"action": "Deny", "action": "Allow"}]}}\n' + json.dumps(gnp("ok")))
    parsed = parse_text("p.json", text)
    assert [d.key for d in parsed.docs] == [gnp_key("ok")]
    assert "GlobalNetworkPolicy(dup-json): spec.ingress[0].action" in parsed.errors[0].message

    # A key a `<<` merge brings in may be overridden: that is YAML, not a duplicate.
    merged = parse_text("m.yaml", "base: &base {selector: all(), order: 5}\n"
                                  "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\n"
                                  "metadata: {name: merged}\nspec: {<<: *base, order: 7}\n")
    assert merged.errors == () and merged.docs[0].value["spec"] == {"selector": "all()",
                                                                    "order": 7}


def test_yaml_alias_bombs_are_rejected_before_anything_expands_them(tmp_path: Path) -> None:
    text = "---\n".join([yaml_docs(gnp("a")), BILLION_LAUGHS, MERGE_LAUGHS, RECURSIVE,
                         yaml_docs(gnp("b"))])
    started = time.monotonic()
    parsed = parse_text("bombs.yaml", text)
    assert time.monotonic() - started < 2.0
    assert [d.key for d in parsed.docs] == [gnp_key("a"), gnp_key("b")]
    messages = [e.message for e in parsed.errors]
    assert [e.source for e in parsed.errors] == ["bombs.yaml#2", "bombs.yaml#3",
                                                 "bombs.yaml#4"]
    assert "GlobalNetworkSet(laughs)" in messages[0] and "aliases expanded" in messages[0]
    assert "GlobalNetworkSet(merges)" in messages[1]
    assert "GlobalNetworkSet(ouroboros): spec.nets[0]" in messages[2]
    assert "recursive" in messages[2]

    # A few honest aliases are fine.
    honest = parse_text("ok.yaml", "common: &sel all()\napiVersion: projectcalico.org/v3\n"
                                   "kind: GlobalNetworkPolicy\nmetadata: {name: honest}\n"
                                   "spec: {selector: *sel}\n")
    assert honest.errors == () and honest.docs[0].value["spec"]["selector"] == "all()"


def test_an_oversized_document_is_skipped_and_the_rest_of_its_file_loads() -> None:
    big = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSet",
           "metadata": {"name": "huge", "annotations": {"blob": "x" * (3 * 1024 * 1024)}},
           "spec": {"nets": []}}
    text = yaml_docs(gnp("one"), big, gnp("two"))
    parsed = parse_text("big.yaml", text)
    assert [d.key for d in parsed.docs] == [gnp_key("one"), gnp_key("two")]
    [error] = parsed.errors
    line = text.splitlines().index("---") + 2  # the first line after the `---`
    assert error.source == "big.yaml#2" and f"(line {line})" in error.message
    assert "GlobalNetworkSet(huge)" in error.message
    assert "max_document_bytes (3145728)" in error.message


def test_huge_integers_and_impossible_dates_reject_only_their_document() -> None:
    text = (yaml_docs(gnp("fine")) + "---\napiVersion: projectcalico.org/v3\n"
            "kind: GlobalNetworkPolicy\nmetadata: {name: digits}\nspec: {order: "
            + "9" * 5000 + "}\n---\napiVersion: v1\nkind: Namespace\n"
            "metadata: {name: dated, creationTimestamp: 2001-02-30}\n")
    parsed = parse_text("n.yaml", text)
    assert [d.key for d in parsed.docs] == [gnp_key("fine")]
    assert "GlobalNetworkPolicy(digits): spec.order" in parsed.errors[0].message
    assert "max_integer_digits" in parsed.errors[0].message
    assert "Namespace(dated): metadata.creationTimestamp" in parsed.errors[1].message

    parsed = parse_text("n.json", '{"kind": "Namespace", "metadata": {"name": "n"}, '
                                  '"x": ' + "7" * 5000 + "}")
    assert parsed.docs == () and "max_integer_digits" in parsed.errors[0].message


def test_file_syncer_reports_counts_and_carries_on(tmp_path: Path, start_syncer) -> None:
    write(tmp_path / "good.yaml", yaml_docs(gnp("good")))
    write(tmp_path / "deep.json", deep_json("deep"))
    write(tmp_path / "bombs.yaml", BILLION_LAUGHS)
    write(tmp_path / "dup.yaml", DUPLICATE_ACTION)
    before = parse_errors()
    _, recorder = start_syncer(tmp_path)
    recorder.wait_in_sync()
    assert set(recorder.state) == {gnp_key("good")}
    assert sorted(e.source for e in recorder.errors) == sorted(
        f"{tmp_path / name}#1" for name in ("deep.json", "bombs.yaml", "dup.yaml"))
    assert parse_errors() - before == 3

    # Fixed, the resource arrives like any other.
    write(tmp_path / "dup.yaml", DUPLICATE_ACTION.replace("    action: Allow\n", ""))
    recorder.wait_for(lambda r: gnp_key("dup") in r.state, "the fixed policy")
    assert recorder.state[gnp_key("dup")]["spec"]["ingress"] == [{"action": "Deny"}]


def test_apply_refuses_to_edit_a_file_holding_a_rejected_document(tmp_path: Path) -> None:
    store = tmp_path / "store.yaml"
    store.write_text(yaml_docs(gnp("kept")) + "---\n" + DUPLICATE_ACTION)
    source = tmp_path / "new.yaml"
    source.write_text(yaml_docs(gnp("new")))
    code, _, err, exception = run("apply", "-f", str(source), "--datastore", str(store))
    assert exception is None and code == 1
    assert "cannot edit" in err and "spec.ingress[0].action" in err
    assert "new" not in {d["metadata"]["name"] for d in yaml.safe_load_all(
        store.read_text().replace("    action: Allow\n", "")) if d}


def test_list_documents_are_one_document_for_the_limits() -> None:
    listing = {"apiVersion": "v1", "kind": "List",
               "items": [gnp(f"p{i}") for i in range(3)]}
    parsed = parse_text("l.yaml", yaml_docs(listing))
    assert parsed.errors == () and len(parsed.docs) == 3
    assert {d.key for d in parsed.docs} == {ResourceKey("GlobalNetworkPolicy", "", f"p{i}")
                                            for i in range(3)}

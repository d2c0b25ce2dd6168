"""Writes to the file datastore (FileDatastore), checked by the files' resulting state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from syncer_testlib import Recorder, gnp, gnp_key, netpol, write, yaml_docs

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.client import DatastoreClientError, InvalidResources, ResourceNotFound
from pyfelix.agent.syncer.file import FileSyncer, load_path
from pyfelix.agent.syncer.file_store import FileDatastore


def state(path: Path) -> dict[ResourceKey, dict]:
    updates, errors = load_path(str(path))
    assert errors == []
    return {u.key: u.value for u in updates}


def visible_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not p.name.startswith("."))


def test_new_resources_get_one_file_each(tmp_path: Path) -> None:
    store = FileDatastore(tmp_path / "store")
    results = store.apply([gnp("g"), netpol("n", "shop")])
    assert [(r.key, r.action) for r in results] == [
        (gnp_key("g"), "created"), (ResourceKey("NetworkPolicy", "shop", "n"), "created")]
    assert visible_files(tmp_path / "store") == ["globalnetworkpolicy/g.yaml",
                                                 "networkpolicy/shop/n.yaml"]
    assert state(tmp_path / "store") == {gnp_key("g"): gnp("g"),
                                         ResourceKey("NetworkPolicy", "shop", "n"):
                                         netpol("n", "shop")}
    assert [(r.key, r.action) for r in store.apply([gnp("g")])] == [(gnp_key("g"), "unchanged")]


def test_replace_inside_multi_document_file_keeps_other_documents_text(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    original_tail = "# keep this comment\n" + yaml_docs(gnp("c"))
    write(path, "# header comment\n" + yaml_docs(gnp("a"), gnp("b")) + "---\n" + original_tail)
    store = FileDatastore(tmp_path)
    results = store.apply([gnp("b", "changed == 'yes'")])
    assert [r.action for r in results] == ["configured"]
    text = path.read_text()
    assert text.startswith("# header comment\n")
    assert text.endswith(original_tail)
    assert state(tmp_path) == {gnp_key("a"): gnp("a"), gnp_key("b"): gnp("b", "changed == 'yes'"),
                               gnp_key("c"): gnp("c")}
    assert visible_files(tmp_path) == ["policies.yaml"]


def test_delete_from_multi_document_file_and_whole_file(tmp_path: Path) -> None:
    write(tmp_path / "multi.yaml", yaml_docs(gnp("a"), gnp("b"), gnp("c")))
    write(tmp_path / "x" / "only.yaml", yaml_docs(gnp("only")))
    store = FileDatastore(tmp_path)
    store.delete(gnp_key("a"))
    store.delete(gnp_key("c"))
    assert state(tmp_path) == {gnp_key("b"): gnp("b"), gnp_key("only"): gnp("only")}
    store.delete(gnp_key("only"))
    assert visible_files(tmp_path) == ["multi.yaml"]
    assert not (tmp_path / "x").exists()  # emptied directory pruned
    with pytest.raises(ResourceNotFound, match=r"GlobalNetworkPolicy\(only\) not found"):
        store.delete(gnp_key("only"))


def test_duplicates_are_collapsed_onto_the_winning_definition(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("dup", "a == 'a'"), gnp("keep")))
    write(tmp_path / "b.yaml", yaml_docs(gnp("dup", "b == 'b'")))
    FileDatastore(tmp_path).apply([gnp("dup", "new == 'new'")])
    assert state(tmp_path) == {gnp_key("dup"): gnp("dup", "new == 'new'"),
                               gnp_key("keep"): gnp("keep")}
    assert "dup" in (tmp_path / "b.yaml").read_text()
    assert "dup" not in (tmp_path / "a.yaml").read_text()


def test_list_items_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    write(path, yaml_docs({"apiVersion": "v1", "kind": "List", "items": [gnp("in-list")]}))
    before = path.read_text()
    store = FileDatastore(tmp_path)
    with pytest.raises(DatastoreClientError, match=r"inside a List document .*list.yaml#1"):
        store.apply([gnp("brand-new"), gnp("in-list", "x == 'y'")])
    with pytest.raises(DatastoreClientError, match="inside a List"):
        store.delete(gnp_key("in-list"))
    assert path.read_text() == before
    assert visible_files(tmp_path) == ["list.yaml"]


def test_invalid_input_writes_nothing_and_names_every_problem(tmp_path: Path) -> None:
    store = FileDatastore(tmp_path)
    bad_api = dict(gnp("bad-api"), apiVersion="v1")
    no_name = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
               "metadata": {}}
    unknown_kind = {"apiVersion": "projectcalico.org/v3", "kind": "Frobnicator",
                    "metadata": {"name": "f"}}
    slash = gnp("a/b")
    with pytest.raises(InvalidResources) as info:
        store.apply([gnp("fine"), bad_api, no_name, unknown_kind, slash, gnp("fine")],
                    sources=["in.yaml#1", "in.yaml#2", "in.yaml#3", "in.yaml#4", "in.yaml#5",
                             "in.yaml#6"])
    problems = info.value.problems
    assert len(problems) == 5
    assert problems[0].startswith("in.yaml#2: GlobalNetworkPolicy(bad-api): field 'apiVersion'")
    assert problems[1].startswith("in.yaml#3:") and "metadata.name" in problems[1]
    assert problems[2].startswith("in.yaml#4:") and "Frobnicator" in problems[2]
    assert problems[3].startswith("in.yaml#5:") and "file name" in problems[3]
    assert problems[4].startswith("in.yaml#6:") and "twice" in problems[4]
    assert visible_files(tmp_path) == []


def test_validate_hook_is_injectable(tmp_path: Path) -> None:
    def validate(doc: dict) -> None:
        if doc["spec"].get("selector") == "bad":
            raise ValueError("GlobalNetworkPolicy: field 'spec.selector' is invalid")

    store = FileDatastore(tmp_path, validate=validate)
    with pytest.raises(InvalidResources, match=r"spec\.selector"):
        store.apply([gnp("x", "bad")])
    store.apply([gnp("x", "good")])
    assert state(tmp_path) == {gnp_key("x"): gnp("x", "good")}


def test_single_file_datastore_append_replace_delete(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    store = FileDatastore(path)
    store.apply([gnp("one")])
    store.apply([gnp("two")])
    store.apply([gnp("one", "v == '2'")])
    assert state(path) == {gnp_key("one"): gnp("one", "v == '2'"), gnp_key("two"): gnp("two")}
    store.delete(gnp_key("one"))
    store.delete(gnp_key("two"))
    assert not path.exists()
    assert sorted(os.listdir(tmp_path)) == [".cluster.yaml.lock"]


def test_json_file_holding_one_resource_is_rewritten_as_json(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write(path, json.dumps(gnp("j")))
    FileDatastore(tmp_path).apply([gnp("j", "json == 'yes'")])
    assert json.loads(path.read_text()) == gnp("j", "json == 'yes'")
    write(tmp_path / "two.json", json.dumps(gnp("k")) + json.dumps(gnp("l")))
    with pytest.raises(DatastoreClientError, match="several JSON values"):
        FileDatastore(tmp_path).delete(gnp_key("k"))


def test_unparsable_file_is_never_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "globalnetworkpolicy" / "g.yaml"
    write(target, "kind: [broken\n")
    with pytest.raises(DatastoreClientError, match="does not parse"):
        FileDatastore(tmp_path).apply([gnp("g")])
    assert target.read_text() == "kind: [broken\n"


def test_get_filters_kind_name_namespace(tmp_path: Path) -> None:
    store = FileDatastore(tmp_path)
    store.apply([netpol("a", "ns1"), netpol("b", "ns2"), netpol("a", "ns2"), gnp("a")])
    assert [d["metadata"]["namespace"] for d in store.get("NetworkPolicy", "a")] == ["ns1", "ns2"]
    assert store.get("NetworkPolicy", namespace="ns2") == [netpol("a", "ns2"), netpol("b", "ns2")]
    assert store.get("GlobalNetworkPolicy") == [gnp("a")]
    assert store.get("NetworkSet") == []
    with pytest.raises(DatastoreClientError, match="does not exist"):
        FileDatastore(tmp_path / "missing").get("NetworkPolicy")


def test_a_running_syncer_sees_exactly_the_applied_changes(tmp_path: Path) -> None:
    write(tmp_path / "multi.yaml", yaml_docs(gnp("a"), gnp("b")))
    syncer = FileSyncer(tmp_path, debounce=0.05)
    rec = Recorder()
    syncer.start(rec)
    try:
        rec.wait_in_sync()
        store = FileDatastore(tmp_path)
        store.apply([gnp("b", "v == '2'"), gnp("c")])
        rec.wait_for(lambda r: gnp_key("c") in r.state
                     and r.state[gnp_key("b")] == gnp("b", "v == '2'"), "applied")
        store.delete(gnp_key("a"))
        rec.wait_for(lambda r: gnp_key("a") not in r.state, "deleted")
        flat = [(u.key.name, u.value is None) for u in rec.updates()]
        # the initial a, b; then b and c; then a's delete: no flaps, no temp files seen
        assert sorted(flat[:2]) == [("a", False), ("b", False)]
        assert sorted(flat[2:4]) == [("b", False), ("c", False)]
        assert flat[4:] == [("a", True)]
        assert rec.errors == []
    finally:
        syncer.stop()

"""One-shot loading of the file datastore (`load_path`) and the merge index, by state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from syncer_testlib import gnp, gnp_key, netpol, write, yaml_docs

from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.file import ResourceIndex, load_path, load_text, parse_text


def keys_of(updates: list) -> list[ResourceKey]:
    return [u.key for u in updates]


def test_directory_with_one_malformed_file_loads_every_good_resource_and_one_error(
        tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", yaml_docs(gnp("a1"), gnp("a2")))
    write(tmp_path / "b.yaml", yaml_docs(netpol("web", "shop")))
    write(tmp_path / "nested" / "c.yml", yaml_docs(gnp("c1")))
    write(tmp_path / "nested" / "d.json", json.dumps(gnp("d1")))
    broken = tmp_path / "nested" / "broken.yaml"
    write(broken, yaml_docs(gnp("ok-before")) + "---\nkind: GlobalNetworkPolicy\n"
          "metadata:\n  name: [unclosed\n")

    updates, errors = load_path(str(tmp_path))

    assert sorted(keys_of(updates)) == sorted([
        gnp_key("a1"), gnp_key("a2"), gnp_key("c1"), gnp_key("d1"),
        ResourceKey("NetworkPolicy", "shop", "web"),
    ])
    assert len(errors) == 1
    error = errors[0]
    assert error.source == f"{broken}#2"
    assert str(broken) in str(error)
    assert "document 2" in error.message and "invalid YAML" in error.message
    # the unclosed flow sequence opens on line 10 (6 lines of doc 1, `---`, then 3 lines)
    assert "started at line 10" in error.message


def test_values_and_sources_name_file_and_document(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", yaml_docs(gnp("first"), gnp("second", "role == 'x'")))
    updates, errors = load_path(str(tmp_path))
    assert errors == []
    by_key = {u.key: u for u in updates}
    assert by_key[gnp_key("first")].source == f"{tmp_path}/p.yaml#1"
    assert by_key[gnp_key("second")].source == f"{tmp_path}/p.yaml#2"
    assert by_key[gnp_key("second")].value == gnp("second", "role == 'x'")


def test_list_documents_as_kubectl_and_calicoctl_print_them(tmp_path: Path) -> None:
    write(tmp_path / "list.yaml", yaml_docs(
        {"apiVersion": "v1", "kind": "List", "items": [gnp("from-list"), netpol("np", "ns1")]},
        {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkSetList",
         "items": [{"metadata": {"name": "set1"}, "spec": {"nets": ["10.0.0.0/8"]}}]},
    ))
    updates, errors = load_path(str(tmp_path))
    assert errors == []
    by_key = {u.key: u for u in updates}
    assert set(by_key) == {gnp_key("from-list"), ResourceKey("NetworkPolicy", "ns1", "np"),
                           ResourceKey("GlobalNetworkSet", "", "set1")}
    assert by_key[ResourceKey("NetworkPolicy", "ns1", "np")].source.endswith("list.yaml#1.items[1]")
    net_set = by_key[ResourceKey("GlobalNetworkSet", "", "set1")].value
    assert net_set is not None
    assert net_set["kind"] == "GlobalNetworkSet"
    assert net_set["apiVersion"] == "projectcalico.org/v3"


def test_unkeyable_document_is_reported_and_skipped_rest_of_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    text = yaml_docs(gnp("good1"), {"kind": "GlobalNetworkPolicy", "metadata": {}},
                     gnp("good2"), ["not", "a", "mapping"])
    write(path, text)
    second_doc_line = text.splitlines().index("---") + 2
    updates, errors = load_path(str(tmp_path))
    assert keys_of(updates) == [gnp_key("good1"), gnp_key("good2")]
    assert [e.source for e in errors] == [f"{path}#2", f"{path}#4"]
    assert "metadata.name" in errors[0].message and f"(line {second_doc_line})" in errors[0].message
    assert "not a mapping" in errors[1].message


def test_unkeyable_list_item_names_document_and_item(tmp_path: Path) -> None:
    path = tmp_path / "l.yaml"
    write(path, yaml_docs({"kind": "List", "items": [gnp("ok"), {"kind": "Pod"}]}))
    updates, errors = load_path(str(path))
    assert keys_of(updates) == [gnp_key("ok")]
    assert len(errors) == 1 and errors[0].source == f"{path}#1.items[1]"
    assert "document 1, items[1]" in errors[0].message


def test_hidden_files_hidden_directories_and_editor_temporaries_are_ignored(
        tmp_path: Path) -> None:
    write(tmp_path / "real.yaml", yaml_docs(gnp("real")))
    for name in (".hidden.yaml", "real.yaml~", "#real.yaml#", ".real.yaml.swp", "notes.txt",
                 ".git/config.yaml", ".#lock.yaml"):
        write(tmp_path / name, yaml_docs(gnp("ignored-" + name.replace("/", "-"))))
    updates, errors = load_path(str(tmp_path))
    assert keys_of(updates) == [gnp_key("real")]
    assert errors == []


def test_single_file_datastore_reads_any_name(tmp_path: Path) -> None:
    path = tmp_path / "resources.txt"
    write(path, yaml_docs(gnp("x")))
    updates, errors = load_path(str(path))
    assert keys_of(updates) == [gnp_key("x")] and errors == []


def test_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_path(str(tmp_path / "nope"))


def test_duplicate_key_last_in_sorted_path_order_wins_with_one_warning(tmp_path: Path) -> None:
    write(tmp_path / "b.yaml", yaml_docs(gnp("dup", "b == 'b'")))
    write(tmp_path / "a" / "z.yaml", yaml_docs(gnp("dup", "a/z == 'a/z'")))
    write(tmp_path / "c.yaml", yaml_docs(gnp("dup", "c == 'c'"), gnp("other")))
    updates, errors = load_path(str(tmp_path))
    by_key = {u.key: u for u in updates}
    assert by_key[gnp_key("dup")].value == gnp("dup", "c == 'c'")
    assert len(errors) == 1
    assert errors[0].source == f"{tmp_path}/c.yaml#1"
    assert f"{tmp_path}/a/z.yaml#1" in errors[0].message
    assert f"{tmp_path}/b.yaml#1" in errors[0].message


def test_json_concatenated_values_and_json_errors(tmp_path: Path) -> None:
    good = tmp_path / "two.json"
    write(good, json.dumps(gnp("j1")) + "\n" + json.dumps(gnp("j2")))
    bad = tmp_path / "bad.json"
    write(bad, json.dumps(gnp("j3")) + '\n{"kind": ')
    updates, errors = load_path(str(tmp_path))
    assert keys_of(updates) == [gnp_key("j1"), gnp_key("j2")]
    assert [e.source for e in errors] == [f"{bad}#2"]
    assert "invalid JSON" in errors[0].message and "line 2" in errors[0].message


def test_not_utf8_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "latin1.yaml").write_bytes(b"kind: GlobalNetworkPolicy\nmetadata: {name: \xe9}\n")
    write(tmp_path / "ok.yaml", yaml_docs(gnp("ok")))
    updates, errors = load_path(str(tmp_path))
    assert keys_of(updates) == [gnp_key("ok")]
    assert len(errors) == 1 and "UTF-8" in errors[0].message


def test_empty_documents_and_empty_files_are_fine(tmp_path: Path) -> None:
    write(tmp_path / "empty.yaml", "")
    write(tmp_path / "comments.yaml", "# nothing here\n---\n---\n")
    write(tmp_path / "x.yaml", "---\n" + yaml_docs(gnp("x")) + "---\n")
    updates, errors = load_path(str(tmp_path))
    assert keys_of(updates) == [gnp_key("x")] and errors == []


def test_load_text_labels_sources() -> None:
    updates, errors = load_text("<stdin>", yaml_docs(gnp("s")))
    assert [u.source for u in updates] == ["<stdin>#1"] and errors == []


def test_kubernetes_network_policy_is_keyed_apart_from_calico_one() -> None:
    k8s = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "np"}}
    parsed = parse_text("x.yaml", yaml_docs(k8s, netpol("np", "default")))
    assert [d.key.kind for d in parsed.docs] == ["KubernetesNetworkPolicy", "NetworkPolicy"]


# ---- the merge index: what gets emitted as files change ----


def docs_of(path: str, *resources: dict) -> tuple:
    return parse_text(path, yaml_docs(*resources)).docs


def test_index_sends_only_differences() -> None:
    index = ResourceIndex()
    updates, _ = index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p"), gnp("q"))})
    assert keys_of(updates) == [gnp_key("p"), gnp_key("q")]
    # q changed, p did not
    updates, _ = index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p"), gnp("q", "x == 'y'"))})
    assert [(u.key, u.value) for u in updates] == [(gnp_key("q"), gnp("q", "x == 'y'"))]
    # q removed from the file
    updates, _ = index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p"))})
    assert [(u.key, u.value) for u in updates] == [(gnp_key("q"), None)]


def test_index_move_between_files_in_one_batch_sends_nothing() -> None:
    index = ResourceIndex()
    index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p"))})
    updates, warnings = index.apply({"d/a.yaml": None,
                                     "d/b.yaml": docs_of("d/b.yaml", gnp("p"))})
    assert updates == [] and warnings == []
    assert index.current()[gnp_key("p")].source == "d/b.yaml#1"
    # later removal of the new home deletes it, with the new source
    updates, _ = index.apply({"d/b.yaml": None})
    assert [(u.key, u.value, u.source) for u in updates] == [(gnp_key("p"), None, "d/b.yaml#1")]


def test_index_duplicate_removed_falls_back_and_warns_once() -> None:
    index = ResourceIndex()
    _, warnings = index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p", "a == 'a'")),
                               "d/b.yaml": docs_of("d/b.yaml", gnp("p", "b == 'b'"))})
    assert len(warnings) == 1
    assert index.current()[gnp_key("p")].value == gnp("p", "b == 'b'")
    # an unrelated change of a.yaml's other content does not repeat the warning
    _, warnings = index.apply({"d/a.yaml": docs_of("d/a.yaml", gnp("p", "a == 'a'"), gnp("r"))})
    assert warnings == []
    updates, warnings = index.apply({"d/b.yaml": None})
    assert [(u.key, u.value) for u in updates] == [(gnp_key("p"), gnp("p", "a == 'a'"))]
    assert warnings == []

"""`pyfelix apply/delete/get` against a file datastore, through click's CliRunner, and the
client factories (URL forms, kinds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from syncer_testlib import gnp, gnp_key, netpol, write, yaml_docs

from pyfelix.agent.datastore import (
    DatastoreLocation,
    make_syncer,
    open_datastore,
    parse_datastore_url,
)
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.client import DatastoreClientError, DatastoreURLError, resolve_kind
from pyfelix.agent.syncer.file import FileSyncer, load_path
from pyfelix.cli.main import cli


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def keys(path: Path) -> set[ResourceKey]:
    return {u.key for u in load_path(str(path))[0]}


def test_apply_get_delete_round_trip(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write(tmp_path / "in" / "a.yaml", yaml_docs(gnp("deny-all"), netpol("web", "shop")))
    write(tmp_path / "in" / "b.yaml", yaml_docs(netpol("db", "default")))

    code, out, err = run("apply", "-f", str(tmp_path / "in"), "--datastore", str(store))
    assert code == 0, err
    assert out.splitlines() == ["GlobalNetworkPolicy(deny-all) created",
                                "NetworkPolicy(default/db) created",
                                "NetworkPolicy(shop/web) created"]
    assert keys(store) == {gnp_key("deny-all"), ResourceKey("NetworkPolicy", "shop", "web"),
                           ResourceKey("NetworkPolicy", "default", "db")}

    code, out, _ = run("get", "GlobalNetworkPolicies", "--datastore", str(store))
    assert (code, out.split()) == (0, ["NAME", "deny-all"])
    code, out, _ = run("get", "networkpolicy", "--datastore", str(store))
    assert out.split() == ["NAMESPACE", "NAME", "default", "db"]  # default namespace only
    code, out, _ = run("get", "NetworkPolicies", "-A", "--datastore", str(store))
    assert out.split() == ["NAMESPACE", "NAME", "default", "db", "shop", "web"]

    code, out, _ = run("get", "networkpolicy", "web", "-n", "shop", "-o", "yaml",
                       "--datastore", str(store))
    assert code == 0 and yaml.safe_load(out) == netpol("web", "shop")
    code, out, _ = run("get", "networkpolicies", "-A", "-o", "json", "--datastore", str(store))
    listing = json.loads(out)
    assert listing["kind"] == "NetworkPolicyList"
    assert [i["metadata"]["name"] for i in listing["items"]] == ["db", "web"]

    # get -o yaml output is accepted back by apply, unchanged
    exported = tmp_path / "export.yaml"
    exported.write_text(run("get", "networkpolicies", "-A", "-o", "yaml",
                            "--datastore", str(store))[1])
    code, out, _ = run("apply", "-f", str(exported), "--datastore", str(store))
    assert code == 0 and out.count("unchanged") == 2

    code, out, _ = run("delete", "globalnetworkpolicy", "deny-all", "--datastore", str(store))
    assert (code, out.strip()) == (0, "GlobalNetworkPolicy(deny-all) deleted")
    code, out, _ = run("delete", "-f", str(tmp_path / "in" / "b.yaml"), "--datastore", str(store))
    assert code == 0
    assert keys(store) == {ResourceKey("NetworkPolicy", "shop", "web")}


def test_apply_from_stdin_to_a_single_file_datastore(tmp_path: Path) -> None:
    store = tmp_path / "cluster.yaml"
    code, _, err = run("apply", "-f", "-", "--datastore", str(store),
                       stdin=yaml_docs(gnp("a"), gnp("b")))
    assert code == 0, err
    assert keys(store) == {gnp_key("a"), gnp_key("b")}


def test_apply_refuses_whole_input_if_one_document_is_bad(tmp_path: Path) -> None:
    store = tmp_path / "store"
    bad = tmp_path / "in.yaml"
    write(bad, yaml_docs(gnp("good")) + "---\nkind: GlobalNetworkPolicy\nmetadata: {}\n")
    code, _, err = run("apply", "-f", str(bad), "--datastore", str(store))
    assert code != 0
    assert f"{bad}#2" in err and "metadata.name" in err and "nothing was written" in err
    assert not store.exists()

    write(bad, yaml_docs(gnp("good"), dict(gnp("wrong-api"), apiVersion="v1")))
    code, _, err = run("apply", "-f", str(bad), "--datastore", str(store))
    assert code != 0 and f"{bad}#2" in err and "apiVersion" in err
    assert not store.exists() or keys(store) == set()


def test_get_and_delete_errors_are_clear(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write(store / "a.yaml", yaml_docs(gnp("a")))
    code, _, err = run("get", "gnp", "--datastore", str(store))
    assert code != 0 and "unknown resource kind 'gnp'" in err
    code, _, err = run("get", "globalnetworkpolicy", "zzz", "--datastore", str(store))
    assert code != 0 and "'zzz' not found" in err
    code, _, err = run("get", "globalnetworkpolicy", "-n", "x", "--datastore", str(store))
    assert code != 0 and "not namespaced" in err
    code, _, err = run("delete", "globalnetworkpolicy", "zzz", "--datastore", str(store))
    assert code != 0 and "not found" in err and "nothing was deleted" in err
    code, out, _ = run("delete", "globalnetworkpolicy", "zzz", "--skip-not-exists",
                       "--datastore", str(store))
    assert code == 0 and "skipped" in out
    code, _, err = run("get", "pods", "--datastore", "typha://127.0.0.1:5473")
    assert code != 0 and "Typha only fans out the datastore's watch (read-only)" in err
    code, _, err = run("get", "pods", "--datastore", str(tmp_path / "missing"))
    assert code != 0 and "does not exist" in err
    assert keys(store) == {gnp_key("a")}


def test_get_warns_about_broken_files_but_shows_the_rest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write(store / "a.yaml", yaml_docs(gnp("a")))
    write(store / "broken.yaml", "kind: [\n")
    code, out, err = run("get", "globalnetworkpolicies", "--datastore", str(store))
    assert code == 0 and out.split() == ["NAME", "a"]
    assert f"warning: {store}/broken.yaml#1" in err


# ---- the factories ----


def test_datastore_url_forms() -> None:
    assert parse_datastore_url("./resources").path == "./resources"
    assert parse_datastore_url("file:///tmp/x.yaml").path == "/tmp/x.yaml"
    etcd = parse_datastore_url("etcd3://10.0.0.1:2379,10.0.0.2:2379")
    assert (etcd.backend, etcd.endpoints) == ("etcd3", ("10.0.0.1:2379", "10.0.0.2:2379"))
    assert parse_datastore_url("kubernetes").backend == "kubernetes"
    assert parse_datastore_url("typha://h:5473").endpoints == ("h:5473",)
    for bad in ("", "etcd3://", "etcd3://host", "etcd3://host:99999", "mysql://x:1"):
        with pytest.raises(DatastoreURLError):
            parse_datastore_url(bad)


def test_factories_pick_the_backend(tmp_path: Path) -> None:
    syncer = make_syncer(DatastoreLocation.file(tmp_path), poll_interval=0.1)
    assert isinstance(syncer, FileSyncer)
    store = open_datastore(DatastoreLocation.file(tmp_path))
    assert store.description == f"file datastore {tmp_path}"
    from pyfelix.agent.syncer.etcd import EtcdSyncer
    from pyfelix.agent.typha.client import TyphaSyncer

    assert isinstance(make_syncer(parse_datastore_url("etcd3://127.0.0.1:2379")), EtcdSyncer)
    typha = parse_datastore_url("typha://127.0.0.1:5473")
    assert isinstance(make_syncer(typha, syncer_type="bgp"), TyphaSyncer)
    with pytest.raises(DatastoreURLError, match="read-only"):
        open_datastore(parse_datastore_url("typha://127.0.0.1:5473"))


def test_kinds_resolve_from_singular_or_plural_any_case() -> None:
    assert resolve_kind("GlobalNetworkPolicies").kind == "GlobalNetworkPolicy"
    assert resolve_kind("ippool").kind == "IPPool"
    assert resolve_kind("networkpolicies").kind == "NetworkPolicy"
    assert resolve_kind("KubernetesNetworkPolicy").document_kind == "NetworkPolicy"
    assert resolve_kind("bgppeers").namespaced is False
    with pytest.raises(DatastoreClientError):
        resolve_kind("gnp")

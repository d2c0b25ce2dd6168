"""`pyfelix calc` on YAML file datastores, through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from calc_testlib import (
    ALLOW,
    global_netset,
    gnp,
    hep,
    k8s_np,
    named,
    namespace,
    np,
    pod,
    profile,
    sel,
    wep,
)
from click.testing import CliRunner

from pyfelix.cli.main import cli

DOCS = [
    profile("open", ingress=[ALLOW], egress=[ALLOW]),
    wep("prod", "db1", "node1", "10.65.0.1", labels={"role": "db"}, profiles=["open"]),
    wep("prod", "web1", "node2", "10.65.1.1", labels={"role": "web"},
        ports=[("http", 8080)]),
    gnp("allow-web", "role == 'db'", order=10, ingress=[
        {"action": "Allow", "protocol": "TCP",
         "source": {"selector": "role == 'web'"}, "destination": {"ports": [5432]}}]),
    np("prod", "to-web", "all()", egress=[
        {"action": "Allow", "protocol": "TCP", "destination": {"ports": ["http"]}}]),
    global_netset("outside", ["198.51.100.0/24"], {"zone": "outside"}),
    gnp("deny-outside", "all()", order=1, egress=[
        {"action": "Deny", "destination": {"selector": "zone == 'outside'"}}]),
]

EXPECTED = {
    "endpoints": {
        "prod/db1": {"ingress": ["allow-web"], "egress": ["deny-outside", "prod/to-web"],
                     "profiles": ["open"]},
    },
    "ipsets": sorted([
        {"id": sel("role == 'web'"), "members": ["10.65.1.1/32"]},
        {"id": named("all()", "tcp", "http"), "members": ["10.65.1.1/32,tcp:8080"]},
        {"id": sel("zone == 'outside'"), "members": ["198.51.100.0/24"]},
    ], key=lambda s: s["id"]),
}


def _write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "resources.yaml").write_text(yaml.safe_dump_all(docs))
    return path


def _calc(datastore: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["calc", "--datastore", str(datastore),
                                    "--hostname", "node1", *args])


def test_json_output_matches_the_contract(tmp_path: Path) -> None:
    result = _calc(_write(tmp_path / "ds", DOCS), "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == EXPECTED
    assert result.stderr == ""


def test_json_output_is_deterministic(tmp_path: Path) -> None:
    first = _calc(_write(tmp_path / "a", DOCS), "-o", "json").stdout
    second = _calc(_write(tmp_path / "b", list(reversed(DOCS))), "-o", "json").stdout
    assert first == second


def test_invalid_resources_warn_and_change_nothing_else(tmp_path: Path) -> None:
    bad = [
        gnp("broken-selector", "role == "),
        {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
         "metadata": {"name": "bad-port"},
         "spec": {"selector": "all()", "ingress": [
             {"action": "Allow", "protocol": "TCP", "destination": {"ports": [70000]}}]}},
    ]
    ds = _write(tmp_path / "ds", DOCS)
    (ds / "zz-bad.yaml").write_text(yaml.safe_dump_all(bad))
    result = _calc(ds, "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == EXPECTED
    assert "GlobalNetworkPolicy(broken-selector): spec.selector" in result.stderr
    assert "GlobalNetworkPolicy(bad-port): spec.ingress[0].destination.ports[0]" in result.stderr


def test_unparsable_file_is_a_warning(tmp_path: Path) -> None:
    ds = _write(tmp_path / "ds", DOCS)
    (ds / "broken.yaml").write_text("kind: [unclosed\n")
    result = _calc(ds, "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == EXPECTED
    assert "broken.yaml" in result.stderr


def test_table_output(tmp_path: Path) -> None:
    result = _calc(_write(tmp_path / "ds", DOCS))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ENDPOINT", "INGRESS", "EGRESS", "PROFILES"]
    assert lines[1].split() == ["prod/db1", "allow-web", "deny-outside,prod/to-web", "open"]
    assert any(line.startswith(sel("zone == 'outside'")) for line in lines)


def test_kubernetes_resources(tmp_path: Path) -> None:
    docs = [
        namespace("shop", team="a"),
        pod("shop", "front", "node1", "10.65.0.5", labels={"app": "front"}),
        pod("shop", "back", "node2", "10.65.1.5", labels={"app": "back"},
            ports=[("api", 9000)]),
        k8s_np("shop", "front-out", {"app": "front"}, egress=[
            {"to": [{"podSelector": {"matchLabels": {"app": "back"}}}],
             "ports": [{"port": "api"}]}]),
    ]
    result = _calc(_write(tmp_path / "ds", docs), "-o", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    # without policyTypes Kubernetes gives Ingress always (and Egress: it has egress rules)
    assert out["endpoints"] == {"shop/front": {
        "ingress": ["shop/knp.default.front-out"], "egress": ["shop/knp.default.front-out"],
        "profiles": ["kns.shop", "ksa.shop.default"]}}
    back = ("projectcalico.org/namespace == 'shop' && projectcalico.org/orchestrator == 'k8s'"
            " && app == 'back'")
    assert out["ipsets"] == [
        {"id": named(back, "tcp", "api"), "members": ["10.65.1.5/32,tcp:9000"]}]


def test_host_endpoints_listed_separately(tmp_path: Path) -> None:
    docs = [hep("node1-eth0", "node1", "eth0", ["198.18.0.1"], labels={"host": "x"}),
            gnp("hosts", "has(host)", ingress=[ALLOW])]
    result = _calc(_write(tmp_path / "ds", docs), "-o", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["endpoints"] == {}
    assert out["host_endpoints"] == {
        "node1-eth0": {"ingress": ["hosts"], "egress": [], "profiles": []}}


def test_missing_datastore_is_an_error(tmp_path: Path) -> None:
    result = _calc(tmp_path / "nothing-here")
    assert result.exit_code != 0
    assert "not found" in result.stderr


def test_hostname_is_required(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["calc", "--datastore", str(tmp_path)], env={
        "FELIX_FELIXHOSTNAME": ""})
    assert result.exit_code == 2

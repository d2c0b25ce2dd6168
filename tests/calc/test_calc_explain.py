"""`pyfelix explain`'s calc-graph reasoning on YAML file datastores (no kernel): which tier,
policy and rule decide, the IP sets looked up (selectors shown), the iptables chain names,
and the CLI's JSON contract. The BPF half is tested in tests/privileged/conformance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from calc_testlib import ALLOW, gnp, np, profile, wep
from click.testing import CliRunner

from pyfelix.agent.calc.explain import ExplainError, compute_model
from pyfelix.agent.datastore import parse_datastore_url
from pyfelix.cli.commands.explain import explain_flow, make_flow
from pyfelix.cli.main import cli

DOCS = [
    profile("open", ingress=[ALLOW], egress=[ALLOW]),
    wep("prod", "db1", "node1", "10.65.0.1", labels={"role": "db"}, profiles=["open"]),
    wep("prod", "web1", "node1", "10.65.0.2", labels={"role": "web"}, profiles=["open"]),
    wep("prod", "other", "node2", "10.65.1.1", labels={"role": "other"}, profiles=["open"]),
    gnp("allow-web", "role == 'db'", order=10, ingress=[
        {"action": "Allow", "protocol": "TCP",
         "source": {"selector": "role == 'web'"}, "destination": {"ports": [5432]}}]),
    np("prod", "deny-other", "role == 'db'", order=20, ingress=[
        {"action": "Deny", "protocol": "TCP", "source": {"selector": "role == 'other'"}}]),
]


@pytest.fixture()
def datastore(tmp_path: Path) -> Path:
    (tmp_path / "resources.yaml").write_text(yaml.safe_dump_all(DOCS))
    return tmp_path


def _explain(datastore: Path, src: str, dst: str, protocol: str = "TCP", port: int = 5432
             ) -> dict[str, Any]:
    model = compute_model(parse_datastore_url(str(datastore)), "node1")
    s, _ = model.resolve(src)
    d, _ = model.resolve(dst)
    return explain_flow(model, make_flow(s, d, protocol, port), dataplane="iptables")


def test_the_allowing_rule_is_named_with_its_selector(datastore: Path) -> None:
    out = _explain(datastore, "prod/web1", "prod/db1")
    assert (out["verdict"], out["tier"], out["policy"], out["rule"]) == (
        "allow", "default", "allow-web", 0)
    ingress = out["directions"][-1]
    assert ingress["direction"] == "ingress" and ingress["endpoint"] == "prod/db1"
    assert "selector(role == \"web\")" in out["rule_text"] or "role == 'web'" in out["rule_text"]
    lookups = [lk for s in ingress["steps"] for lk in s["ip_sets"]]
    assert lookups and lookups[0]["address"] == "10.65.0.2" and lookups[0]["member"]
    assert ingress["chains"][0] == "cali-tw-" + ingress["interface"]
    assert all(c.startswith(("cali-tw-", "cali-pi-", "cali-pri-")) for c in ingress["chains"])
    # the source's egress (also on node1) is allowed by its profile
    egress = out["directions"][0]
    assert (egress["direction"], egress["verdict"], egress["decided_by"]) == (
        "egress", "allow", "rule")
    assert egress["policy"] == "open" and egress["tier"] is None


def test_a_deny_rule_and_the_end_of_tier_deny(datastore: Path) -> None:
    out = _explain(datastore, "prod/other", "prod/db1")
    assert (out["verdict"], out["policy"], out["rule"], out["direction"]) == (
        "deny", "prod/deny-other", 0, "ingress")
    steps = out["directions"][-1]["steps"]
    assert [(s["policy"], s["matched"]) for s in steps] == [
        ("allow-web", False), ("prod/deny-other", True)]
    assert "not selected" in steps[0]["why"]
    out = _explain(datastore, "prod/web1", "prod/db1", port=80)
    assert (out["verdict"], out["decided_by"], out["tier"], out["policy"]) == (
        "deny", "tier-end", "default", None)
    assert "port 80" in out["directions"][-1]["steps"][0]["why"]


def test_only_local_endpoints_are_judged_and_unknown_pods_are_errors(datastore: Path) -> None:
    out = _explain(datastore, "prod/db1", "10.65.1.1", port=22)
    assert [d["direction"] for d in out["directions"]] == ["egress"]
    assert out["destination"] == "prod/other"
    with pytest.raises(ExplainError, match="no workload endpoint"):
        _explain(datastore, "prod/nope", "prod/db1")


def test_cli_json_has_verdict_policy_tier_rule(datastore: Path) -> None:
    result = CliRunner().invoke(cli, [
        "explain", "--datastore", str(datastore), "--hostname", "node1", "--dataplane",
        "iptables", "--from", "prod/other", "--to", "prod/db1", "--port", "5432", "-o", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {k: out[k] for k in ("verdict", "policy", "tier", "rule")} == {
        "verdict": "deny", "policy": "prod/deny-other", "tier": "default", "rule": 0}
    text = CliRunner().invoke(cli, [
        "explain", "--datastore", str(datastore), "--hostname", "node1", "--dataplane",
        "iptables", "--from", "prod/web1", "--to", "prod/db1", "--port", "5432"])
    assert text.exit_code == 0, text.output
    assert "ALLOW by policy default/allow-web rule 0" in text.stdout

"""Scenario parsing: the example scenarios, defaults, and errors that name the field path."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from pyfelix.lab.demo import DEMO_SCENARIO, connectivity_matrix, matrix_probes, with_matrix_probes
from pyfelix.lab.probe import ProbeResult
from pyfelix.lab.scenario import (
    ResourceRef,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

SCENARIOS = Path(__file__).parent / "scenarios"


def problems_of(data: Any) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, source="test.yaml")
    assert "test.yaml" in str(info.value)
    return info.value.problems


def minimal(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "namespaces": [{"name": "x"}],
        "pods": [
            {"namespace": "x", "name": "a", "ports": [{"port": 80}]},
            {"namespace": "x", "name": "b", "ports": [{"port": 81, "protocol": "UDP",
                                                        "name": "dns"}]},
        ],
    }
    data.update(overrides)
    return data


# --- the published examples ---------------------------------------------------------------


def test_calico_example_parses_with_defaults() -> None:
    scenario = load_scenario(SCENARIOS / "calico-gnp-order.yaml")
    assert scenario.name == "calico-gnp-order"
    assert scenario.nodes == ("node1",)
    assert [p.key for p in scenario.pods] == ["prod/api", "prod/client", "prod/scanner"]
    assert {p.node for p in scenario.pods} == {"node1"}
    assert [str(p.ip) for p in scenario.pods] == ["10.65.0.1", "10.65.0.2", "10.65.0.3"]
    assert [r["metadata"]["name"] for r in scenario.resources] == ["deny-scanner", "allow-https"]
    assert len(scenario.steps) == 1
    step = scenario.steps[0]
    assert step.apply == scenario.resources
    assert [(p.source, p.target, p.port, p.expect) for p in step.probes] == [
        ("prod/client", "prod/api", 443, "allow"),
        ("prod/client", "prod/api", 9000, "deny"),
        ("prod/scanner", "prod/api", 443, "deny"),
        ("prod/api", "prod/client", 80, "allow"),
    ]
    assert step.probes[0].target_ip == scenario.pod("prod/api").ip


def test_k8s_example_keeps_named_ports_and_namespace_labels() -> None:
    scenario = load_scenario(SCENARIOS / "k8s-allow-from-namespace.yaml")
    assert {ns.name: ns.labels for ns in scenario.namespaces} == {
        "web": {"team": "web"}, "db": {"team": "db"}, "other": {"team": "other"},
    }
    postgres = scenario.pod("db/postgres")
    assert [(p.port, p.protocol, p.name) for p in postgres.ports] == [(5432, "TCP", "pg")]
    assert scenario.resources[0]["spec"]["ingress"][0]["ports"] == [{"port": "pg",
                                                                     "protocol": "TCP"}]


# --- defaults -----------------------------------------------------------------------------


def test_ip_allocation_skips_explicit_addresses_and_keeps_pod_order() -> None:
    data = minimal(pods=[
        {"namespace": "x", "name": "a"},
        {"namespace": "x", "name": "b", "ip": "10.65.0.1"},
        {"namespace": "x", "name": "c"},
    ])
    scenario = parse_scenario(data)
    assert [str(p.ip) for p in scenario.pods] == ["10.65.0.2", "10.65.0.1", "10.65.0.3"]


def test_pod_node_defaults_to_first_node_and_protocols_to_tcp() -> None:
    data = minimal(nodes=["n2", "n1"], pods=[
        {"namespace": "x", "name": "a", "ports": [{"port": 80}]},
        {"namespace": "x", "name": "b", "node": "n1", "ports": [{"port": 53, "protocol": "udp"}]},
    ])
    scenario = parse_scenario(data)
    assert [p.node for p in scenario.pods] == ["n2", "n1"]
    assert [p.ports[0].protocol for p in scenario.pods] == ["TCP", "UDP"]
    assert scenario.pods_on("n1") == (scenario.pods[1],)


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "my-lab.yaml"
    path.write_text("namespaces: [{name: x}]\npods: [{namespace: x, name: a}]\n")
    assert load_scenario(path).name == "my-lab"


def test_probe_to_named_port_and_to_bare_ip() -> None:
    data = minimal(probes=[
        {"from": "x/a", "to": "x/b", "port": "dns", "protocol": "UDP"},
        {"from": "x/a", "to": "10.65.9.9", "port": 80},
    ])
    probes = parse_scenario(data).probes
    assert (probes[0].port, probes[0].protocol, probes[0].target) == (81, "UDP", "x/b")
    assert (probes[1].target, probes[1].target_ip) == (
        "10.65.9.9", ipaddress.IPv4Address("10.65.9.9"))


def test_probes_from_external_and_nodes_to_node_addresses() -> None:
    data = minimal(nodes=["node1", "node2"], probes=[
        {"from": "external", "to": "node/node2", "port": 30080},
        {"from": "node/node1", "to": "x/b", "port": 81, "protocol": "UDP"},
    ])
    probes = parse_scenario(data).probes
    assert (probes[0].source, probes[0].target, probes[0].target_ip) == (
        "external", "node/node2", ipaddress.IPv4Address("198.18.0.2"))
    assert probes[1].source == "node/node1"
    problems = problems_of(minimal(probes=[{"from": "node/nope", "to": "node/node9",
                                            "port": 1}]))
    assert any("probes[0].from" in p and "node/NAME" in p for p in problems), problems
    assert any("probes[0].to" in p and "node/node9" in p for p in problems), problems


def test_steps_with_apply_delete_and_probes() -> None:
    policy = {"apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
              "metadata": {"name": "p", "namespace": "x"}, "spec": {}}
    data = minimal(steps=[
        {"apply": [policy], "probes": [{"from": "x/a", "to": "x/b", "port": 81,
                                        "protocol": "UDP", "expect": "deny"}]},
        {"delete": [{"kind": "NetworkPolicy", "namespace": "x", "name": "p"}],
         "probes": [{"from": "x/a", "to": "x/b", "port": 81, "protocol": "UDP"}]},
    ])
    scenario = parse_scenario(data)
    assert scenario.resources == ()
    assert [s.apply for s in scenario.steps] == [(policy,), ()]
    assert scenario.steps[1].delete == (ResourceRef("NetworkPolicy", "p", "x"),)
    assert [p.expect for p in scenario.probes] == ["deny", None]


# --- errors ---------------------------------------------------------------------------------


def test_missing_pod_namespace_names_the_path() -> None:
    data = minimal()
    data["pods"].append({"name": "c"})
    assert problems_of(data) == ["pods[2].namespace: missing"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(probe=[]), "probe: unknown field"),
        (lambda d: d["pods"][0].update(nmae="z"), "pods[0].nmae: unknown field"),
        (lambda d: d["pods"][0].update(namespace="y"), "pods[0].namespace: 'y' is not declared"),
        (lambda d: d["pods"][0].update(node="node9"), "pods[0].node: 'node9' is not one of"),
        (lambda d: d["pods"][0].update(name="Bad_Name"), "pods[0].name: 'Bad_Name' is not a"),
        (lambda d: d["pods"][0].update(ip="10.65.0.300"), "pods[0].ip: '10.65.0.300' is not"),
        (lambda d: d["pods"][0].update(ip="fe80::1"), "pods[0].ip: fe80::1 is not a unicast"),
        (lambda d: d["pods"][0].update(ip="198.18.0.1"), "pods[0].ip: 198.18.0.1 is reserved"),
        (lambda d: d["pods"][0].update(ip="169.254.1.1"), "pods[0].ip: 169.254.1.1 is reserved"),
        (lambda d: d["pods"][0].update(labels={"v": 1}), "pods[0].labels.v: value must be a"),
        (lambda d: d["pods"][0].update(labels=["a"]), "pods[0].labels: must be a mapping"),
        (lambda d: d["pods"][0].update(ports=[{"port": 0}]), "pods[0].ports[0].port: must be"),
        (lambda d: d["pods"][0].update(ports=[{"port": 80, "protocol": "SCTP"}]),
         "pods[0].ports[0].protocol: 'SCTP' is not one of"),
        (lambda d: d["pods"][0].update(ports=[{"port": 80}, {"port": 80}]),
         "pods[0].ports[1]: duplicate port 80/TCP"),
        (lambda d: d["pods"][0].update(ports=[{"port": 80, "name": "way-too-long-port-name"}]),
         "pods[0].ports[0].name: 'way-too-long-port-name' is not a port name"),
        (lambda d: d["pods"].append(dict(d["pods"][0])), "pods[2]: duplicate pod 'x/a'"),
        (lambda d: d.update(nodes=[]), "nodes: must list at least one node"),
        (lambda d: d.update(nodes=["n1", "n1"]), "nodes[1]: duplicate node 'n1'"),
        (lambda d: d.update(namespaces=[{"name": "x"}, {"name": "x"}]),
         "namespaces[1].name: duplicate namespace 'x'"),
        (lambda d: d.update(pods={"a": 1}), "pods: must be a list, got mapping"),
        (lambda d: d.update(resources=[{"metadata": {"name": "p"}}]), "resources[0].kind: missing"),
        (lambda d: d.update(resources=[{"kind": "GlobalNetworkPolicy", "metadata": {}}]),
         "resources[0].metadata.name: missing (kind GlobalNetworkPolicy)"),
        (lambda d: d.update(resources=["text"]), "resources[0]: must be a mapping, got string"),
        (lambda d: d.update(probes=[{"from": "x/zz", "to": "x/b", "port": 81}]),
         "probes[0].from: 'x/zz' is not a pod"),
        (lambda d: d.update(probes=[{"from": "x/a", "port": 81}]), "probes[0].to: missing"),
        (lambda d: d.update(probes=[{"from": "x/a", "to": "nowhere", "port": 81}]),
         "probes[0].to: 'nowhere' is neither a pod"),
        (lambda d: d.update(probes=[{"from": "x/a", "to": "x/b", "port": 70000}]),
         "probes[0].port: must be a port number"),
        (lambda d: d.update(probes=[{"from": "x/a", "to": "x/b", "port": "http"}]),
         "probes[0].port: pod x/b has no TCP port named 'http'"),
        (lambda d: d.update(probes=[{"from": "x/a", "to": "10.0.0.1", "port": "http"}]),
         "probes[0].port: named port 'http' needs a pod target"),
        (lambda d: d.update(probes=[{"from": "x/a", "to": "x/b", "port": 81, "expect": False}]),
         "probes[0].expect: False is not one of ['allow', 'deny']"),
        (lambda d: d.update(steps=[{}]), "steps[0]: needs at least one of apply, delete, probes"),
        (lambda d: d.update(steps=[{"delete": [{"name": "p"}]}]),
         "steps[0].delete[0].kind: missing"),
        (lambda d: d.update(steps=[{"probes": []}], probes=[]),
         "steps: use either steps or top-level resources+probes"),
    ],
)
def test_malformed_field_is_reported_with_its_path(mutate: Any, expected: str) -> None:
    data = minimal()
    mutate(data)
    problems = problems_of(data)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    data = minimal()
    data["pods"][0]["ip"] = "nope"
    data["pods"][1]["ports"] = [{"port": "x"}]
    data["probes"] = [{"from": "x/b"}]
    problems = problems_of(data)
    assert [p.split(":")[0] for p in problems] == [
        "pods[0].ip", "pods[1].ports[0].port", "probes[0].to", "probes[0].port"]


def test_duplicate_explicit_ip_names_the_first_owner() -> None:
    data = minimal()
    data["pods"][0]["ip"] = data["pods"][1]["ip"] = "10.65.1.1"
    assert problems_of(data) == ["pods[1].ip: 10.65.1.1 is already used by pods[0]"]


def test_top_level_must_be_a_mapping() -> None:
    assert problems_of(["a"]) == ["(top level): must be a mapping, got list"]
    assert problems_of(None) == ["(top level): must be a mapping, got nothing"]


def test_yaml_syntax_and_missing_file_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("pods: [\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml") as info:
        load_scenario(broken)
    assert info.value.problems[0].startswith("not valid YAML")
    with pytest.raises(ScenarioError, match="cannot read file"):
        load_scenario(tmp_path / "absent.yaml")


# --- the demo -------------------------------------------------------------------------------


def test_demo_scenario_probes_every_port_of_every_other_pod() -> None:
    scenario = load_scenario(DEMO_SCENARIO)
    probes = matrix_probes(scenario)
    ports_total = sum(len(p.ports) for p in scenario.pods)
    expected = sum(ports_total - len(p.ports) for p in scenario.pods)
    assert len(probes) == expected
    assert all(p.source != p.target for p in probes)
    assert len(scenario.nodes) == 2
    demo = with_matrix_probes(scenario)
    assert demo.steps[0].apply == scenario.resources
    results = [ProbeResult(p, 0, "allow", "echoed", 0.0) for p in demo.probes]
    matrix = connectivity_matrix(results)
    assert set(matrix) == {p.key for p in scenario.pods}
    assert matrix["other/intruder"]["db/postgres:5432/TCP"] == "allow"


def test_floating_ips_are_parsed_apart_from_the_pod_ip_and_annotated() -> None:
    from pyfelix.lab.datastore import FLOATING_IPS_ANNOTATION, topology_documents
    from pyfelix.lab.topology import plan_topology

    data = minimal(pods=[{"namespace": "x", "name": "a", "floatingIPs": ["10.65.200.1"]},
                         {"namespace": "x", "name": "b"}])
    scenario = parse_scenario(data)
    a, b = scenario.pods
    assert str(a.ip) == "10.65.0.1" and a.floating_ips == (ipaddress.ip_address("10.65.200.1"),)
    assert str(b.ip) == "10.65.0.2" and b.floating_ips == ()
    docs = topology_documents(scenario, plan_topology("pf000000", scenario))
    pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
    assert pods["a"]["metadata"]["annotations"][FLOATING_IPS_ANNOTATION] == '["10.65.200.1"]'
    assert FLOATING_IPS_ANNOTATION not in pods["b"]["metadata"]["annotations"]
    assert problems_of(minimal(pods=[{"namespace": "x", "name": "a",
                                      "floatingIPs": ["nope"]}])) == [
        "pods[0].floatingIPs[0]: 'nope' is not an IP address"]


def test_first_step_pools_and_felix_configuration_are_topology_documents() -> None:
    from pyfelix.lab.datastore import topology_documents
    from pyfelix.lab.topology import plan_topology

    pool = {"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
            "metadata": {"name": "vx"}, "spec": {"cidr": "10.65.0.0/16", "vxlanMode": "Always"}}
    felix = {"apiVersion": "projectcalico.org/v3", "kind": "FelixConfiguration",
             "metadata": {"name": "default"}, "spec": {"floatingIPs": "Enabled"}}
    policy = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
              "metadata": {"name": "p"}, "spec": {"selector": "all()"}}
    scenario = parse_scenario(minimal(resources=[pool, felix, policy]))
    kinds = [d["kind"] for d in topology_documents(scenario, plan_topology("pf000000",
                                                                           scenario))]
    assert kinds.count("IPPool") == 1 and kinds.count("FelixConfiguration") == 1
    assert "GlobalNetworkPolicy" not in kinds

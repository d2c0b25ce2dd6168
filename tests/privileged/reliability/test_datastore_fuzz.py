"""A stream of fuzzed resources into the file datastore of a RUNNING agent.

The agent enforces a witness (conformance case k8s-union-two-policies: x/a admits x/b on
TCP 80 and namespace z on TCP 81, from two policies). Then:

1. Unparseable inputs (YAML syntax error, bytes that are not UTF-8, a document without kind,
   one without metadata.name, a bare scalar): each is counted once in
   `pyfelix_datastore_parse_errors_total`, the agent keeps running.
2. Hypothesis draws batches of INVALID documents: every kind the suite uses (Kubernetes and
   Calico policies, tiers, network sets, service accounts, pods) with one mutation each
   (unknown fields, wrong types, bad selectors, actions, protocols, ports, CIDRs, names,
   apiVersions, kinds, or a random value at a random place). Each has a fresh name; a draw
   the agent's validator would accept is discarded, so every document written must be
   rejected. After each batch: the agent is alive, `pyfelix_validation_errors_total` rose by
   exactly the batch size, and every document's name is on an "Invalid resource" log line.
3. The witness is then checked on the whole 9x8x3 matrix (the valid state, enforced exactly,
   with all the rejected documents present), one witness policy is overwritten by an invalid
   version (= deleted: only the other policy's matrix must hold), and restored.

Figures printed: bad inputs tried, rejections counted, agent restarts (0).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyfelix.agent.validator import validate_document
from pyfelix.lab.conformance import ALL_CASES, CASES_BY_NAME
from pyfelix.lab.conformance.case import Case
from pyfelix.lab.conformance.resources import k8s_rule, knp, labels, peer, port
from pyfelix.lab.conformance.world import TCP_80
from tests.privileged.reliability.harness import (
    AgentUnderTest,
    ConformanceLab,
    conformance_lab,
    describe,
    wait_for,
)

pytestmark = pytest.mark.privileged
WITNESS = CASES_BY_NAME["k8s-union-two-policies"]
WITNESS_ONLY_B = Case(
    "witness-without-z-on-81", "only b-on-80 is valid",
    resources=(knp("b-on-80", "x", labels(pod="a"), ingress=[k8s_rule(
        [peer(pods=labels(pod="b"))], [port(80)])]),),
    ingress=lambda s, d, c: d.key != "x/a" or (s.key == "x/b" and c == TCP_80))
VALIDATION_ERRORS = "pyfelix_validation_errors_total"
PARSE_ERRORS = "pyfelix_datastore_parse_errors_total"
EXAMPLES = 40
COUNT_TIMEOUT_S = 20.0

# Every document the conformance cases apply, plus a Pod: the shapes the agent really sees.
SEEDS: list[dict[str, Any]] = [copy.deepcopy(doc) for case in ALL_CASES
                               for doc in case.resources] + [{
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "seed", "namespace": "x", "labels": {"pod": "seed"}},
    "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": [
        {"containerPort": 80, "protocol": "TCP", "name": "serve-80-tcp"}]}]},
    "status": {"podIP": "10.65.9.9", "podIPs": [{"ip": "10.65.9.9"}]}}]

PARSE_JUNK: dict[str, bytes] = {
    "junk-syntax.yaml": b"apiVersion: v1\nkind: [unclosed\n",
    "junk-not-utf8.yaml": b"kind: GlobalNetworkSet\nmetadata: {name: \xff\xfe}\n",
    "junk-no-kind.yaml": b"apiVersion: projectcalico.org/v3\nmetadata: {name: nokind}\n",
    "junk-no-name.yaml": b"apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\n"
                         b"metadata: {labels: {a: b}}\n",
    "junk-scalar.yaml": b"just a scalar\n",
}

_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_characters="\x7f"),
                max_size=12)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-70000, 70000) | _text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children,
                                                                       max_size=3),
    max_leaves=6)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a document (dict keys and list indexes), except what keys it
    (kind, metadata, metadata.name, metadata.namespace): a document that cannot be keyed is
    a parse error, which part 1 covers."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            if (*prefix, key) not in (("metadata",), ("metadata", "name"),
                                       ("metadata", "namespace"), ("kind",)):
                found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value


def _spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.setdefault("spec", {}) if isinstance(doc.get("spec", {}), dict) else {}


def _first_rule(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = _spec(doc)
    for direction in ("ingress", "egress"):
        rules = spec.get(direction)
        if isinstance(rules, list) and rules and isinstance(rules[0], dict):
            return rules[0]
    return None


def _mutations() -> dict[str, Callable[[dict[str, Any], Any], None]]:
    def unknown_field(doc: dict[str, Any], draw: Any) -> None:
        _spec(doc)["fuzz" + draw(st.sampled_from(["Field", "Extra", "Tpyo"]))] = draw(
            _json_values)

    def bad_selector(doc: dict[str, Any], draw: Any) -> None:
        key = "podSelector" if doc["kind"] == "NetworkPolicy" and "podSelector" in _spec(doc) \
            else "selector"
        value: Any = draw(_text) + " &&"  # a dangling operator never parses
        if key == "podSelector":
            value = {"matchExpressions": [{"key": draw(_text), "operator": "Sometimes"}]}
        _spec(doc)[key] = value

    def wrong_type(doc: dict[str, Any], draw: Any) -> None:
        field = draw(st.sampled_from(["order", "types", "ingress", "egress", "nets",
                                      "policyTypes", "containers"]))
        _spec(doc)[field] = draw(st.sampled_from([{"not": "a list"}, "many", [[1]], -1.5e9]))

    def bad_rule(doc: dict[str, Any], draw: Any) -> None:
        rule = _first_rule(doc)
        if rule is None:
            _spec(doc)["ingress"] = [{"action": "Maybe"}]
            return
        choice = draw(st.sampled_from(["action", "protocol", "port", "cidr"]))
        if choice == "action":
            rule["action"] = draw(st.sampled_from(["Maybe", "allow!", ""]))
        elif choice == "protocol":
            rule["protocol"] = draw(st.sampled_from(["TCPX", 0, 300, "ICMPv7"]))
        elif choice == "port":
            rule["protocol"] = "TCP"
            rule.setdefault("destination", {})["ports"] = [draw(st.sampled_from(
                [0, 65536, 70000, "81:80", "-1", "http!"]))]
        else:
            rule.setdefault("source", {})["nets"] = [draw(st.sampled_from(
                ["10.0.0.300/33", "not-a-cidr", "10.65.0.0/99", "::g/64"]))]

    def bad_name(doc: dict[str, Any], draw: Any) -> None:
        doc["metadata"]["name"] = doc["metadata"]["name"].upper() + draw(
            st.sampled_from(["!", " x", "_", ".."]))

    def bad_api_version(doc: dict[str, Any], draw: Any) -> None:
        doc["apiVersion"] = draw(st.sampled_from(["projectcalico.org/v9", "v2", "", "x/y"]))

    def unknown_kind(doc: dict[str, Any], draw: Any) -> None:
        doc["kind"] = draw(st.sampled_from(["NetworkPolicyy", "Gadget", "GlobalNetworkSets"]))

    def random_value(doc: dict[str, Any], draw: Any) -> None:
        paths = _paths(doc)
        _set(doc, draw(st.sampled_from(paths)), draw(_json_values))

    return {f.__name__: f for f in (unknown_field, bad_selector, wrong_type, bad_rule, bad_name,
                                    bad_api_version, unknown_kind, random_value)}


MUTATIONS = _mutations()
_names = itertools.count(1)


@st.composite
def invalid_documents(draw: Any) -> tuple[str, dict[str, Any]]:
    doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    doc["metadata"]["name"] = f"fuzz-{next(_names)}"
    mutation = draw(st.sampled_from(sorted(MUTATIONS)))
    MUTATIONS[mutation](doc, draw)
    try:
        validate_document(doc)
    except Exception:  # ValidationError, or anything else the model raises: rejected
        return mutation, doc
    assume(False)  # the mutation happened to keep it valid: not an invalid input
    raise AssertionError("unreachable")


def _counter(agent: AgentUnderTest, name: str) -> float:
    return sum(v for k, v in agent.metrics().items() if k.split("{")[0] == name)


def _write_doc(lab: ConformanceLab, doc: dict[str, Any]) -> None:
    name = str(doc["metadata"]["name"])
    file_name = "fuzz-" + "".join(c if c.isalnum() or c in "-." else "_" for c in name)
    lab.write_raw(file_name + ".yaml", yaml.safe_dump(doc, allow_unicode=True).encode())


@pytest.mark.timeout(600)
def test_fuzzed_resources_are_rejected_counted_and_change_nothing(
        root_guard: Any, capsys: pytest.CaptureFixture[str]) -> None:
    agent = AgentUnderTest()
    tried = {"parse": 0, "invalid": 0}
    by_mutation: dict[str, int] = {}
    with conformance_lab(agent) as lab:
        lab.enter(WITNESS)
        assert not (bad := lab.mismatches(WITNESS)), describe(bad)

        parse_before = _counter(agent, PARSE_ERRORS)
        for file_name, content in PARSE_JUNK.items():
            lab.write_raw(file_name, content)
        tried["parse"] = len(PARSE_JUNK)
        wait_for(lambda: _counter(agent, PARSE_ERRORS) - parse_before >= len(PARSE_JUNK),
                 COUNT_TIMEOUT_S, "every unparseable file counted")
        assert _counter(agent, PARSE_ERRORS) - parse_before == len(PARSE_JUNK)  # once each
        assert agent.exit_code() is None

        validation_before = _counter(agent, VALIDATION_ERRORS)

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.function_scoped_fixture])
        @given(batch=st.lists(invalid_documents(), min_size=1, max_size=4))
        def feed(batch: list[tuple[str, dict[str, Any]]]) -> None:
            expected = _counter(agent, VALIDATION_ERRORS) + len(batch)
            for mutation, doc in batch:
                _write_doc(lab, doc)
                by_mutation[mutation] = by_mutation.get(mutation, 0) + 1
            tried["invalid"] += len(batch)
            wait_for(lambda: _counter(agent, VALIDATION_ERRORS) >= expected, COUNT_TIMEOUT_S,
                     f"{len(batch)} more validation errors")
            assert _counter(agent, VALIDATION_ERRORS) == expected  # exactly one each
            assert agent.exit_code() is None
            log_lines = [line for line in agent.log_text().splitlines()
                         if "Invalid resource" in line]
            for _, doc in batch:
                name = str(doc["metadata"]["name"])
                assert any(name in line for line in log_lines), f"no log line names {name}"

        feed()
        rejected = _counter(agent, VALIDATION_ERRORS) - validation_before
        assert rejected == tried["invalid"]
        assert "Internal error validating" not in agent.log_text()
        lab.runner.wait_in_sync()
        assert not (bad := lab.mismatches(WITNESS)), describe(bad)

        # a valid policy overwritten by an invalid version counts as deleted
        broken = copy.deepcopy(next(d for d in WITNESS.resources
                                    if d["metadata"]["name"] == "z-on-81"))
        broken["spec"]["ingress"][0]["ports"] = [{"port": 70000, "protocol": "TCP"}]
        lab.runner.apply_resources([broken])
        wait_for(lambda: _counter(agent, VALIDATION_ERRORS) - validation_before
                 >= rejected + 1, COUNT_TIMEOUT_S, "the overwrite's validation error")
        lab.runner.wait_in_sync()
        assert not (bad := lab.mismatches(WITNESS_ONLY_B)), describe(bad)
        lab.current.pop(("NetworkPolicy", "x", "z-on-81"), None)  # re-applied below
        lab.enter(WITNESS)
        assert not (bad := lab.mismatches(WITNESS)), describe(bad)
        assert agent.exit_code() is None and agent.starts == 1
        with capsys.disabled():
            print(f"\ndatastore fuzz: {tried['parse'] + tried['invalid'] + 1} bad inputs "
                  f"tried ({tried['parse']} unparseable, {tried['invalid']} invalid documents "
                  f"by mutation {json.dumps(dict(sorted(by_mutation.items())))}, 1 overwrite "
                  f"of a live policy); {rejected + 1:g} validation errors and "
                  f"{len(PARSE_JUNK)} parse errors counted; agent restarts: 0; witness "
                  f"matrix exact before, during and after")
    root_guard.check()

"""Property: on any mutation of a valid document, parse_resource returns a resource or raises
ValidationError - nothing else - and whatever parses also converts and yields valid selectors.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfelix.agent import selector
from pyfelix.agent.conversion import to_calico
from pyfelix.agent.model import (
    NetworkPolicy,
    Profile,
    Resource,
    ValidationError,
    entity_selector,
    parse_resource,
    policy_selector,
)
from tests.model.examples import documents

EXAMPLES = documents()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "²", "٣", "1e3", "TCP", "80:79", "0:0", "10.0.0.1", "10.0.0.0/33",
                     "::", "fd00::1/200", "all()", "global()", "a == 'b'", "has(", "http",
                     "Allow", "Ingress", "-", "k8s", "a.b", "1.2", "[::1]:179", "kns.x"]),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=10), st.integers(0, 3)), inner,
                        max_size=4),
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside `node` that can be replaced or deleted."""
    found: list[tuple[Any, ...]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append((*prefix, key))
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.append((*prefix, i))
            found.extend(_paths(value, (*prefix, i)))
    return found


def _containers(node: Any) -> list[Any]:
    out = [node] if isinstance(node, dict | list) else []
    if isinstance(node, dict):
        for value in node.values():
            out.extend(_containers(value))
    elif isinstance(node, list):
        for value in node:
            out.extend(_containers(value))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    node = doc
    for step in path[:-1]:
        node = node[step]
    return node


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    doc = draw(st.sampled_from(EXAMPLES))
    import copy

    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        action = draw(st.sampled_from(["replace", "delete", "add", "wrap", "whole"]))
        if action == "whole":
            return draw(junk)
        if action == "add":
            container = draw(st.sampled_from(_containers(doc)))
            value = draw(junk)
            if isinstance(container, dict):
                container[draw(st.sampled_from(["extra", "spec", "ports", "selector", 7]))] = value
            else:
                container.append(value)
            continue
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        if action == "delete":
            del parent[path[-1]]
        elif action == "wrap":
            parent[path[-1]] = [parent[path[-1]]]
        else:
            parent[path[-1]] = draw(junk)
    return doc


def _check_converted(resource: Resource) -> None:
    for converted in to_calico(resource).values():
        if isinstance(converted, NetworkPolicy):
            selector.parse(policy_selector(converted))
        if isinstance(converted, NetworkPolicy | Profile):
            namespace = "" if getattr(converted, "is_global", True) else converted.key.namespace
            for rule in converted.ingress + converted.egress:
                for entity in (rule.source, rule.destination):
                    selector.parse(entity_selector(entity, namespace))
                    selector.parse(entity.not_selector)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_parse_resource_raises_only_validation_errors(doc: Any) -> None:
    try:
        resource = parse_resource(doc)
    except ValidationError as exc:
        assert exc.resource and str(exc).startswith(exc.resource)
        return
    assert isinstance(resource, Resource)
    hash(resource)
    _check_converted(resource)


def test_every_unmutated_example_converts_with_valid_selectors() -> None:
    for doc in documents():
        _check_converted(parse_resource(doc))

"""Property: whatever the sequence of raw updates, applying the validator's output gives
exactly the Calico view of the current raw documents - nothing stale, nothing missing.

Expected view (reference): for every raw key whose latest document is valid, its
conversion (`to_calico`); when two raw keys produce the same Calico key, the one updated
most recently wins. Invalid and deleted documents contribute nothing.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyfelix.agent.conversion import to_calico
from pyfelix.agent.model import Resource, ValidationError, parse_resource
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey, key_of
from pyfelix.agent.validator import Validator
from tests.model.examples import by_kind


def _variant(kind: str, change: Any = None, name: str | None = None) -> dict[str, Any]:
    doc = by_kind(kind, name)
    if change is not None:
        change(doc)
    return doc


def _pod_variants() -> list[dict[str, Any]]:
    return [
        _variant("Pod"),
        _variant("Pod", lambda d: d["spec"].update(nodeName="node2")),
        _variant("Pod", lambda d: d["spec"].update(hostNetwork=True)),
        _variant("Pod", lambda d: d["status"].update(podIPs=None, podIP=None)),
        _variant("Pod", lambda d: d["status"].update(phase="Failed")),
        _variant("Pod", lambda d: d["status"].update(podIPs=[{"ip": "bogus"}])),
        _variant("Pod", lambda d: d["metadata"]["labels"].update(app="api-v2")),
    ]


def _colliding_wep() -> dict[str, Any]:
    # A Calico WorkloadEndpoint with the name the pod's endpoint gets on node1.
    doc = by_kind("WorkloadEndpoint")
    doc["metadata"]["name"] = "node1-k8s-api--7d9f8--abcde-eth0"
    return doc


VARIANTS: dict[ResourceKey, list[dict[str, Any] | None]] = {}
for doc in [
    *_pod_variants(),
    _variant("Namespace"),
    _variant("Namespace", lambda d: d["metadata"]["labels"].update(env="staging")),
    _variant("Namespace", lambda d: d["metadata"]["labels"].update(env="not valid")),
    _variant("KubernetesNetworkPolicy"),
    _variant("KubernetesNetworkPolicy", lambda d: d["spec"].update(policyTypes=["Bogus"])),
    _variant("GlobalNetworkPolicy", name="host-protect"),
    _variant("GlobalNetworkPolicy", lambda d: d["spec"].update(order="high"), "host-protect"),
    _colliding_wep(),
    _variant("Node", name="node2"),
]:
    VARIANTS.setdefault(key_of(doc), []).append(doc)
for choices in VARIANTS.values():
    choices.append(None)  # a delete
KEYS = sorted(VARIANTS)

steps = st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 10)), min_size=1,
                 max_size=25)


def _expected(current: dict[ResourceKey, dict[str, Any]],
              last_write: dict[ResourceKey, int]) -> dict[ResourceKey, Resource]:
    expected: dict[ResourceKey, tuple[int, Resource]] = {}
    for raw_key, doc in current.items():
        try:
            converted = to_calico(parse_resource(doc))
        except ValidationError:
            continue
        for out_key, value in converted.items():
            if out_key not in expected or expected[out_key][0] < last_write[raw_key]:
                expected[out_key] = (last_write[raw_key], value)
    return {k: v for k, (_, v) in expected.items()}


@settings(max_examples=300, deadline=None)
@given(steps)
def test_applied_output_equals_conversion_of_current_documents(
        sequence: list[tuple[ResourceKey, int]]) -> None:
    validator = Validator()
    applied: dict[ResourceKey, Resource] = {}
    current: dict[ResourceKey, dict[str, Any]] = {}
    last_write: dict[ResourceKey, int] = {}
    for step, (raw_key, index) in enumerate(sequence):
        choices = VARIANTS[raw_key]
        doc = choices[index % len(choices)]
        if doc is None:
            current.pop(raw_key, None)
        else:
            current[raw_key] = copy.deepcopy(doc)
            last_write[raw_key] = step
        update = RawUpdate(raw_key, copy.deepcopy(doc) if doc is not None else None, f"s{step}")
        for out in validator.on_updates([update]):
            if out.value is None:
                applied.pop(out.key, None)
            else:
                applied[out.key] = out.value
        assert applied == _expected(current, last_write)

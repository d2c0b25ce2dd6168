"""Selectors as the calc graph uses them: one selector per policy and per rule side.

Role: a thin layer over `agent.model.policy_selectors`, which reproduces libcalico-go's
rewriting of Calico's v3 selector fields (namespaced policies limited to their namespace,
`namespaceSelector` over the inherited `pcns.*` labels, service accounts over
`projectcalico.org/serviceaccount` / `pcsa.*`) into single selectors over endpoint labels.
Keeping that logic in one place means the conversion, the CLI and the calc graph cannot
drift apart. This module adds what only the calc graph needs:
- `applies_to(policy)`: the policy's selector as a parsed `Selector` (for the index);
- `rule_side_selectors(entity, namespace)`: (positive, negative) selector texts of one
  rule side, with Felix's combineMatchesIfPossible: a `notSelector` is folded into the
  positive selector when there is one (`(pos) && !(neg)`), which saves an IP set and is
  exact because such a rule can only match known endpoints anyway. Without a positive
  selector the `notSelector` stays separate and is used as written (never namespaced, as
  in Calico).

Easy to get wrong: "" means "no constraint" (no IP set at all), whereas `parse("")` means
`all()`; test for "" before parsing.
"""

from __future__ import annotations

from pyfelix.agent.model import NetworkPolicy
from pyfelix.agent.model.labels import (
    LABEL_NAMESPACE,
    LABEL_ORCHESTRATOR,
    LABEL_SERVICE_ACCOUNT,
    NAMESPACE_LABEL_PREFIX,
    NAMESPACE_PROFILE_PREFIX,
    SERVICE_ACCOUNT_LABEL_PREFIX,
    SERVICE_ACCOUNT_PROFILE_PREFIX,
)
from pyfelix.agent.model.policy_selectors import entity_selector, policy_selector
from pyfelix.agent.model.rules import EntityRule
from pyfelix.agent.selector import Selector, parse

ALL = "all()"

__all__ = [
    "ALL",
    "LABEL_NAMESPACE",
    "LABEL_ORCHESTRATOR",
    "LABEL_SERVICE_ACCOUNT",
    "NAMESPACE_LABEL_PREFIX",
    "NAMESPACE_PROFILE_PREFIX",
    "SERVICE_ACCOUNT_LABEL_PREFIX",
    "SERVICE_ACCOUNT_PROFILE_PREFIX",
    "applies_to",
    "rule_side_selectors",
]


def applies_to(policy: NetworkPolicy) -> Selector:
    """Which endpoints `policy` applies to."""
    return parse(policy_selector(policy))


def rule_side_selectors(entity: EntityRule, namespace: str) -> tuple[str, str]:
    """(positive, negative) selector texts of a rule side; "" means no constraint.

    `namespace` is the policy's namespace ("" for global policies and profiles).
    """
    positive = entity_selector(entity, namespace)
    negative = entity.not_selector
    if positive and negative:
        return f"({positive}) && !({negative})", ""
    return positive, negative

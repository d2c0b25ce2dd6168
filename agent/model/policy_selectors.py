"""What a policy and its rules select, in Calico's semantics, as one selector text each.

Role: Calico stores selectors as users wrote them (v3 API) and turns them, before Felix sees
them, into single selectors over endpoint labels (libcalico-go's update processors). This
module does the same so the calc graph only ever evaluates plain selectors against an
endpoint's labels merged with its profiles' labelsToApply (`inherited_labels`).

Inputs: model objects (`NetworkPolicy`, `EntityRule`). Outputs: canonical selector text
(`agent.selector` syntax; "" means "no selector constraint").

Semantics (Calico's):
- a namespaced NetworkPolicy applies to `projectcalico.org/namespace == '<ns>' && (selector)`;
  a GlobalNetworkPolicy to `selector && <namespaceSelector over pcns.-prefixed labels>`;
  a serviceAccountSelector adds `pcsa.`-prefixed service-account labels;
- in a rule's source/destination, `namespaceSelector` is evaluated over the namespace labels
  every pod inherits from its `kns.<ns>` profile (`pcns.<key>`), `all()` meaning "any
  namespaced endpoint" (`has(projectcalico.org/namespace)`) and `global()` "no namespace";
- in a namespaced policy a rule entity without namespaceSelector is limited to the policy's
  own namespace as soon as it uses selector, notSelector or serviceAccounts;
- serviceAccounts: `names` -> `projectcalico.org/serviceaccount in {..}`, `selector` over
  `pcsa.`-prefixed labels; both given: both must hold.
- notSelector is NOT folded in: it stays a separate negative match (`EntityRule.not_selector`).

Easy to get wrong: prefixing must rewrite the label KEYS of the parsed tree, never the text
(a value may contain anything), and `all()` becomes `has(projectcalico.org/namespace)` only
inside a namespace selector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from pyfelix.agent.model.labels import (
    LABEL_NAMESPACE,
    LABEL_SERVICE_ACCOUNT,
    NAMESPACE_LABEL_PREFIX,
    SERVICE_ACCOUNT_LABEL_PREFIX,
)
from pyfelix.agent.model.rules import EntityRule, ServiceAccountMatch
from pyfelix.agent.selector import parse
from pyfelix.agent.selector.canonical import normalise, render
from pyfelix.agent.selector.nodes import All, And, Compare, Has, InSet, Node, Not, Op, Or

if TYPE_CHECKING:
    from pyfelix.agent.model.resources import NetworkPolicy


def prefix_keys(node: Node, prefix: str) -> Node:
    """`node` with every label key it reads prefixed by `prefix` (functions unchanged)."""
    match node:
        case Has() | Compare() | InSet():
            return replace(node, key=prefix + node.key)
        case Not(operand):
            return Not(prefix_keys(operand, prefix))
        case And(operands):
            return And(tuple(prefix_keys(o, prefix) for o in operands))
        case Or(operands):
            return Or(tuple(prefix_keys(o, prefix) for o in operands))
        case _:
            return node


def _replace_all(node: Node, replacement: Node) -> Node:
    match node:
        case All():
            return replacement
        case Not(operand):
            return Not(_replace_all(operand, replacement))
        case And(operands):
            return And(tuple(_replace_all(o, replacement) for o in operands))
        case Or(operands):
            return Or(tuple(_replace_all(o, replacement) for o in operands))
        case _:
            return node


def _tree(text: str) -> Node:
    return parse(text).root


def namespace_selector_tree(text: str) -> Node:
    """A namespaceSelector as a selector over endpoint labels (`pcns.` keys)."""
    prefixed = prefix_keys(_tree(text), NAMESPACE_LABEL_PREFIX)
    # Global() already means "no projectcalico.org/namespace label" in agent.selector.
    return _replace_all(prefixed, Has(LABEL_NAMESPACE))


def service_account_tree(match: ServiceAccountMatch) -> Node | None:
    parts: list[Node] = []
    if match.selector:
        parts.append(prefix_keys(_tree(match.selector), SERVICE_ACCOUNT_LABEL_PREFIX))
    if match.names:
        parts.append(InSet(LABEL_SERVICE_ACCOUNT, frozenset(match.names)))
    return _and(parts) if parts else None


def _and(parts: list[Node]) -> Node:
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _text(node: Node | None) -> str:
    return "" if node is None else render(normalise(node))


def in_namespace(namespace: str) -> Node:
    return Compare(LABEL_NAMESPACE, Op.EQ, namespace)


def entity_selector(entity: EntityRule, policy_namespace: str = "") -> str:
    """The positive selector of a rule's source/destination (libcalico-go semantics).

    `policy_namespace` is "" for global policies and profiles.
    """
    namespace_part: Node | None = None
    if entity.namespace_selector:
        namespace_part = namespace_selector_tree(entity.namespace_selector)
    elif policy_namespace:
        namespace_part = in_namespace(policy_namespace)
    parts: list[Node] = []
    if entity.service_accounts is not None:
        sa = service_account_tree(entity.service_accounts)
        if sa is not None:
            parts.append(sa)
    if entity.selector:
        parts.append(_tree(entity.selector))
    selector = _and(parts) if parts else None
    uses_selectors = bool(parts or entity.not_selector or entity.namespace_selector)
    if namespace_part is not None and uses_selectors:
        selector = namespace_part if selector is None else And((namespace_part, selector))
    return _text(selector)


def policy_selector(policy: NetworkPolicy) -> str:
    """Which endpoints `policy` applies to, as one selector text (never "": `all()` at least)."""
    parts: list[Node] = [_tree(policy.selector or "all()")]
    if not policy.is_global:
        parts.insert(0, in_namespace(policy.key.namespace))
    elif policy.namespace_selector:
        parts.append(namespace_selector_tree(policy.namespace_selector))
    if policy.service_account_selector:
        sa = service_account_tree(ServiceAccountMatch(selector=policy.service_account_selector))
        if sa is not None:
            parts.append(sa)
    return _text(_and(parts))


def inherited_labels(own: Mapping[str, str],
                     parents: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """An endpoint's labels for selector evaluation: its own, then each profile's
    labelsToApply in profile order; the endpoint's own labels and earlier profiles win."""
    merged: dict[str, str] = {}
    for labels in parents:
        for key, value in labels.items():
            merged.setdefault(key, value)
    merged.update(own)
    return merged


__all__ = [
    "entity_selector",
    "inherited_labels",
    "namespace_selector_tree",
    "policy_selector",
    "prefix_keys",
]

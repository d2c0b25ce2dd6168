"""Label keys and name prefixes that Calico gives a meaning to.

Role: one place for the strings that the Kubernetes conversion writes and the selector
semantics (`agent.model.policy_selectors`) read, so the two cannot drift apart.

- Every namespaced endpoint and network set carries `projectcalico.org/namespace`; pods
  also `projectcalico.org/orchestrator: k8s` and `projectcalico.org/serviceaccount`.
- A namespace's labels reach its pods through the `kns.<ns>` profile's labelsToApply as
  `pcns.<key>`, plus `pcns.projectcalico.org/name: <ns>`; a service account's through
  `ksa.<ns>.<sa>` as `pcsa.<key>` plus `pcsa.projectcalico.org/name: <sa>`.
"""

from __future__ import annotations

LABEL_NAMESPACE = "projectcalico.org/namespace"
LABEL_ORCHESTRATOR = "projectcalico.org/orchestrator"
LABEL_SERVICE_ACCOUNT = "projectcalico.org/serviceaccount"
LABEL_NAME = "projectcalico.org/name"

NAMESPACE_LABEL_PREFIX = "pcns."
SERVICE_ACCOUNT_LABEL_PREFIX = "pcsa."

NAMESPACE_PROFILE_PREFIX = "kns."
SERVICE_ACCOUNT_PROFILE_PREFIX = "ksa."
K8S_POLICY_PREFIX = "knp.default."

ORCHESTRATOR_K8S = "k8s"

# Calico's default tier and its fixed order (Tier "default" must have exactly this order).
DEFAULT_TIER = "default"
DEFAULT_TIER_ORDER = 1_000_000.0

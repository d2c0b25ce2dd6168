"""ProfileDecoder: profile labels for label inheritance, and the namespaces / service accounts
that Kubernetes-derived profiles stand for.

Role (Felix's ProfileDecoder plus the profile-labels feed of its label indexes): for every
Profile update it
- tells its label listeners `on_profile_labels(name, labels | None)` with the profile's
  `labelsToApply` (None when the profile is gone or applies no labels); endpoints and
  network sets that list the profile inherit these labels (the ActiveRulesCalculator's and
  the IPSetMemberIndex's label indexes listen);
- decodes `kns.<namespace>` and `ksa.<namespace>.<serviceaccount>` names (the profiles the
  Kubernetes conversion makes) into namespace / service-account label maps with the
  `pcns.` / `pcsa.` prefixes removed, for debug dumps and `pyfelix calc`.

Invariants: listeners see a `None` for every profile whose labels they were given, when it
goes; the decoded maps contain exactly the current kns./ksa. profiles.
"""

from __future__ import annotations

from typing import Protocol

from pyfelix.agent.calc.dispatcher import KIND_PROFILE, CalcUpdate, Dispatcher
from pyfelix.agent.calc.selectors import (
    NAMESPACE_LABEL_PREFIX,
    NAMESPACE_PROFILE_PREFIX,
    SERVICE_ACCOUNT_LABEL_PREFIX,
    SERVICE_ACCOUNT_PROFILE_PREFIX,
)


class ProfileLabelListener(Protocol):
    def on_profile_labels(self, name: str, labels: dict[str, str] | None) -> None: ...


class ProfileDecoder:
    def __init__(self, listeners: list[ProfileLabelListener]) -> None:
        self._listeners = listeners
        self._labels: dict[str, dict[str, str]] = {}
        self._namespaces: dict[str, dict[str, str]] = {}
        self._service_accounts: dict[tuple[str, str], dict[str, str]] = {}

    def register_with(self, dispatcher: Dispatcher) -> None:
        dispatcher.register(KIND_PROFILE, self.on_update)

    def on_update(self, update: CalcUpdate) -> None:
        name = update.key.name
        labels = dict(update.value.labels_to_apply) if update.value is not None else {}
        self._decode(name, labels if update.value is not None else None)
        if labels:
            if self._labels.get(name) == labels:
                return
            self._labels[name] = labels
            self._notify(name, labels)
        elif self._labels.pop(name, None) is not None:
            self._notify(name, None)

    def namespaces(self) -> dict[str, dict[str, str]]:
        """Namespace -> its labels, from the `kns.<ns>` profiles."""
        return {ns: dict(labels) for ns, labels in sorted(self._namespaces.items())}

    def service_accounts(self) -> dict[tuple[str, str], dict[str, str]]:
        """(namespace, service account) -> its labels, from the `ksa.<ns>.<sa>` profiles."""
        return {k: dict(v) for k, v in sorted(self._service_accounts.items())}

    def _notify(self, name: str, labels: dict[str, str] | None) -> None:
        for listener in self._listeners:
            listener.on_profile_labels(name, labels)

    def _decode(self, name: str, labels: dict[str, str] | None) -> None:
        if name.startswith(NAMESPACE_PROFILE_PREFIX):
            namespace = name[len(NAMESPACE_PROFILE_PREFIX):]
            if labels is None:
                self._namespaces.pop(namespace, None)
            else:
                self._namespaces[namespace] = _strip(labels, NAMESPACE_LABEL_PREFIX)
        elif name.startswith(SERVICE_ACCOUNT_PROFILE_PREFIX):
            namespace, dot, account = name[len(SERVICE_ACCOUNT_PROFILE_PREFIX):].partition(".")
            if not dot:
                return
            if labels is None:
                self._service_accounts.pop((namespace, account), None)
            else:
                self._service_accounts[(namespace, account)] = _strip(
                    labels, SERVICE_ACCOUNT_LABEL_PREFIX)


def _strip(labels: dict[str, str], prefix: str) -> dict[str, str]:
    return {k[len(prefix):]: v for k, v in labels.items() if k.startswith(prefix)}

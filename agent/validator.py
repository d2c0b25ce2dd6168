"""The validator stage: raw syncer updates -> typed, validated Calico model updates.

Role: sits between the syncer and the calc graph (docs/ARCHITECTURE.md sections 1 and 3). For each
`RawUpdate` it parses the document (`agent.model.parse_resource`), converts Kubernetes kinds
into Calico's model (`agent.conversion.to_calico`) and emits `ValidatedUpdate`s keyed by the
CALICO key (Pod -> WorkloadEndpoint, Namespace/ServiceAccount -> Profile `kns.`/`ksa.`,
Kubernetes NetworkPolicy -> NetworkPolicy `knp.default.`). Kubernetes v1 Nodes pass through
as model Nodes; every other Calico kind maps to itself.

Inputs: `on_updates([RawUpdate])`, in datastore order. Output: `[ValidatedUpdate]`, where
`value is None` means delete.

Invariants:
- an invalid document becomes a DELETE of what its key produced before (and of its natural
  Calico key), so a resource that turned invalid is removed, never left stale; the reason
  is logged (naming resource and field) and counted in `pyfelix_validation_errors_total`;
- documents reach it decoded by `agent.inputs` (size, depth, members, aliases, duplicate
  keys already bounded); the per-kind limits (rules per policy, selector length and text)
  are the model's, so they count here as validation errors;
- the stage remembers what each raw key converted to, so a Pod delete deletes its
  WorkloadEndpoint, and a Pod that loses its IP, finishes or turns host-networked deletes
  it too; a pod rescheduled to another node deletes the old endpoint name;
- two raw keys producing the same Calico key (a Calico WorkloadEndpoint and a Pod that
  converts to the same name, say): the most recent writer's value is emitted, and when it
  goes away the other one's value comes back (a warning is logged);
- kinds only confd reads (Secrets: BGP passwords) are dropped unparsed: the agent never
  holds a secret;
- one thread: `on_updates` is not re-entrant and not thread-safe (the pipeline calls it
  from one thread).

Easy to get wrong: a Pod's Calico key depends on its node, so it cannot be derived from the
raw key; an invalid Pod never seen valid has nothing to delete.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from pyfelix.agent.conversion import DEFAULT_INTERFACE_PREFIX, natural_output_key, to_calico
from pyfelix.agent.conversion.k8s import workload_interface_name
from pyfelix.agent.kinds import FELIX_KINDS
from pyfelix.agent.model import KNOWN_KINDS, Resource, ValidationError, parse_resource
from pyfelix.agent.syncer.api import RawUpdate, ResourceKey

log = logging.getLogger(__name__)

VALIDATION_ERRORS = Counter(
    "pyfelix_validation_errors_total",
    "Number of datastore documents the validator rejected (invalid fields, unknown kinds, "
    "bad selectors); each one was treated as a delete of its resource.",
    ["kind"],
)


@dataclass(frozen=True)
class ValidatedUpdate:
    """A typed update for the calc graph: `value` None means the key was deleted."""

    key: ResourceKey
    value: Resource | None
    source: str = ""


def _kind_label(kind: str) -> str:
    """Metric label for a kind; unknown kinds share one label (bounded cardinality)."""
    return kind if kind in KNOWN_KINDS else "unknown"


def validate_document(doc: Any, *, interface_prefix: str = DEFAULT_INTERFACE_PREFIX
                      ) -> Resource:
    """Parse and validate one document as `pyfelix apply` needs it; raises ValidationError.

    Kubernetes kinds are also converted, so anything the agent would reject is rejected.
    """
    resource = parse_resource(doc)
    to_calico(resource, interface_prefix=interface_prefix)
    return resource


class Validator:
    """Stateful raw -> validated translation (see module docstring)."""

    def __init__(self, *, interface_prefix: str = DEFAULT_INTERFACE_PREFIX) -> None:
        workload_interface_name("ns", "pod", interface_prefix)  # ValueError if unusable
        self._interface_prefix = interface_prefix
        # raw key -> the Calico objects it currently produces
        self._outputs: dict[ResourceKey, dict[ResourceKey, Resource]] = {}
        # Calico key -> raw keys producing it, oldest first (the last one wins)
        self._owners: dict[ResourceKey, list[ResourceKey]] = {}
        # raw keys whose latest document was invalid -> the reason
        self.errors: dict[ResourceKey, str] = {}

    # --- public ---------------------------------------------------------------------------

    def on_updates(self, updates: Iterable[RawUpdate]) -> list[ValidatedUpdate]:
        out: list[ValidatedUpdate] = []
        for update in updates:
            out.extend(self._on_update(update))
        return out

    def outputs_of(self, raw_key: ResourceKey) -> dict[ResourceKey, Resource]:
        """What `raw_key` currently converts to (a copy; empty when nothing)."""
        return dict(self._outputs.get(raw_key, {}))

    # --- one update -----------------------------------------------------------------------

    def _on_update(self, update: RawUpdate) -> list[ValidatedUpdate]:
        raw_key = update.key
        if raw_key.kind not in FELIX_KINDS and raw_key.kind in KNOWN_KINDS:
            return []  # confd's kinds (Secrets): the agent neither parses nor keeps them
        new_outputs: dict[ResourceKey, Resource] = {}
        if update.value is None:
            self.errors.pop(raw_key, None)
        else:
            reason = None
            try:
                new_outputs = self._convert(update)
            except ValidationError as exc:
                reason = str(exc)
                log.warning("Invalid resource %s (from %s): %s; treating it as deleted",
                            raw_key, update.source or "?", exc)
            except Exception as exc:  # the stage is the safety boundary: never crash
                reason = f"{raw_key}: internal error while validating: {exc!r}"
                log.error("Internal error validating %s (from %s); treating it as deleted",
                          raw_key, update.source or "?", exc_info=True)
            if reason is None:
                self.errors.pop(raw_key, None)
            else:
                VALIDATION_ERRORS.labels(kind=_kind_label(raw_key.kind)).inc()
                self.errors[raw_key] = reason
        emitted = self._replace_outputs(raw_key, new_outputs, update.source)
        if not new_outputs:
            natural = natural_output_key(raw_key)
            if (natural is not None and natural not in self._owners
                    and all(u.key != natural for u in emitted)):
                emitted.append(ValidatedUpdate(natural, None, update.source))
        return emitted

    def _convert(self, update: RawUpdate) -> dict[ResourceKey, Resource]:
        resource = parse_resource(update.value)
        if resource.key != update.key:
            raise ValidationError(str(update.key), "metadata",
                                  f"document is keyed {resource.key}, not {update.key}")
        return to_calico(resource, interface_prefix=self._interface_prefix)

    def _replace_outputs(self, raw_key: ResourceKey, new: dict[ResourceKey, Resource],
                         source: str) -> list[ValidatedUpdate]:
        old = self._outputs.pop(raw_key, {})
        if new:
            self._outputs[raw_key] = new
        for out_key in old.keys() - new.keys():
            owners = self._owners[out_key]
            owners.remove(raw_key)
            if not owners:
                del self._owners[out_key]
        for out_key in new:
            owners = self._owners.setdefault(out_key, [])
            if raw_key in owners:
                owners.remove(raw_key)
            elif owners:
                log.warning("%s and %s both produce %s; using %s (the most recent)",
                            owners[-1], raw_key, out_key, raw_key)
            owners.append(raw_key)
        emitted = []
        for out_key in [*new, *(k for k in old if k not in new)]:
            owners = self._owners.get(out_key)
            value = self._outputs[owners[-1]][out_key] if owners else None
            emitted.append(ValidatedUpdate(out_key, value, source))
        return emitted

"""The input limits (README "Input limits") and the errors every input check raises.

Role: the named bounds on what pyfelix accepts from a datastore or from `pyfelix apply`,
so one hostile or broken document costs a bounded amount of time and memory in the CLI and
in EVERY agent reading the datastore. Decoding (`agent.inputs.yaml_docs`,
`agent.inputs.json_docs`, `agent.inputs.structure`) enforces the structural limits; the
model (`agent.model`) enforces the per-kind ones (rules per policy, selector length).

The limits are not settings: `pyfelix apply` and every agent must agree on them, or apply
would write what the agents then reject. Functions take a `limits` argument (default
`LIMITS`) so tests, and a future transport with its own bounds, can pass others.

A rejected document is rejected as a whole (never truncated or partly used) with an
`InputError` naming the resource, the field path and the limit; documents beside it are
unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyfelix.agent.selector import MAX_NESTING

KIB = 1024
MIB = 1024 * KIB

# Fixed by the selector language (agent.selector.parser), listed here with the others.
MAX_SELECTOR_NESTING = MAX_NESTING


@dataclass(frozen=True)
class InputLimits:
    """Bounds on one input document; see the README table for what happens beyond each."""

    # Encoded size of one document: a YAML/JSON document of a file (a `List` counts as
    # one), an etcd value, a Kubernetes object. Kubernetes' API server takes 3 MiB requests.
    max_document_bytes: int = 3 * MIB
    # Mappings and lists nested inside one another (the document itself is level 1).
    max_nesting_depth: int = 100
    # Entries of one list or mapping (the nets of a network set, a rule's ports, labels...).
    max_set_members: int = 100_000
    # YAML alias uses (`*name`, also in `<<: *name` merges) in one document; aliases may
    # never refer to their own ancestor, and the document WITH aliases expanded must still
    # fit max_document_bytes and max_nesting_depth.
    max_yaml_aliases: int = 100
    # Digits of an integer literal (no field holds more than 20; Python refuses >4300).
    max_integer_digits: int = 100
    # Rules of one policy or profile, ingress and egress together (for a Kubernetes
    # NetworkPolicy: its rules counted once per peer, as they are converted).
    max_rules_per_policy: int = 5_000
    # Characters of one selector, also of the selector a Kubernetes label selector becomes.
    max_selector_length: int = 16 * KIB
    # Characters of all the selectors of one policy or profile together (its own and its
    # rules'): every agent parses and compiles each one (~2 us and ~200 bytes a character).
    max_selector_text_per_policy: int = 128 * KIB


LIMITS = InputLimits()


class InputError(ValueError):
    """A document was rejected: `resource` (`Kind(namespace/name)` as far as known), `field`
    (dotted path, "" for the document as a whole), `message`, and `limit` (the name of the
    limit exceeded, None for other problems such as a duplicate key)."""

    def __init__(self, resource: str, field: str, message: str,
                 limit: str | None = None) -> None:
        self.resource = resource
        self.field = field
        self.message = message
        self.limit = limit
        where = f"{resource}: {field}: " if field else f"{resource}: "
        super().__init__(where + message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (InputError, (self.resource, self.field, self.message, self.limit))


class InputSyntaxError(ValueError):
    """A text is not valid YAML/JSON from document `index` on (1-based); nothing after that
    point can be read. `line`/`column` are 1-based when known; `detail` says what is wrong."""

    def __init__(self, index: int, line: int | None, column: int | None, detail: str) -> None:
        self.index = index
        self.line = line
        self.column = column
        self.detail = detail
        where = f"document {index}"
        if line is not None:
            where += f" (line {line}" + (f", column {column})" if column is not None else ")")
        super().__init__(f"{where}: {detail}")


def too_big(limits: InputLimits, size: int) -> str:
    return (f"the document is {size} bytes, more than max_document_bytes "
            f"({limits.max_document_bytes})")


def too_deep(limits: InputLimits) -> str:
    return f"nested more than max_nesting_depth ({limits.max_nesting_depth}) levels deep"


def too_many_members(limits: InputLimits, count: int | None = None) -> str:
    has = f"has {count} entries, " if count is not None else "has "
    return f"{has}more than max_set_members ({limits.max_set_members})"


def too_many_digits(limits: InputLimits) -> str:
    return f"an integer with more than max_integer_digits ({limits.max_integer_digits}) digits"


DUPLICATE_KEY = "the key appears more than once in its mapping (duplicate keys are rejected)"

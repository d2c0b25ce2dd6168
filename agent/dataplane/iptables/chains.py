"""The in-memory chain model: a chain is a name and an ordered tuple of rule texts.

Role: what the renderer produces and the table writer (`restore.py`) programs. A `Chain` owns
its rules' identity: each rule gets a hash of (chain name, previous rule's hash, rule text),
written into the rule as `-m comment --comment "cali:<hash>"`. Reading the kernel back, only
the hashes are compared (iptables-save prints rules in its own canonical form, so text
comparison would see differences that are not there). Two chains are equal in the kernel
iff their hash lists are equal.

Invariants: rule texts are match + target fragments without `-A <chain>`; a chain's name
fits `MAX_CHAIN_NAME`; the same rules always produce the same hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyfelix.agent.dataplane.iptables.names import HASH_COMMENT_PREFIX, MAX_CHAIN_NAME, short_hash

RULE_HASH_LENGTH = 16


def rule_hashes(chain_name: str, rules: tuple[str, ...]) -> tuple[str, ...]:
    hashes = []
    prev = ""
    for rule in rules:
        prev = short_hash(f"{chain_name}\0{prev}\0{rule}", RULE_HASH_LENGTH)
        hashes.append(prev)
    return tuple(hashes)


def with_comment(rule_hash: str, rule: str) -> str:
    return f'-m comment --comment "{HASH_COMMENT_PREFIX}{rule_hash}" {rule}'


@dataclass(frozen=True)
class Chain:
    name: str
    rules: tuple[str, ...] = ()
    hashes: tuple[str, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > MAX_CHAIN_NAME or " " in self.name:
            raise ValueError(f"iptables chain name {self.name!r}: empty, has spaces or is "
                             f"longer than {MAX_CHAIN_NAME} characters")
        object.__setattr__(self, "hashes", rule_hashes(self.name, self.rules))

    def restore_lines(self) -> list[str]:
        """`-A` lines for iptables-restore (the chain must be declared/flushed before)."""
        return [
            f"-A {self.name} {with_comment(h, rule)}"
            for h, rule in zip(self.hashes, self.rules, strict=True)
        ]

"""FixedIPSets: a few IP sets with fixed names that one manager owns (not the calc graph's).

Role: the kernel side of Felix's "special" IP sets - `cali40this-host` (host IPs),
`cali40masq-ipam-pools` / `cali40all-ipam-pools` (NAT outgoing) - for managers that run in
BOTH dataplane modes (the IP-sets manager exists only in iptables mode). Each owner declares
its names at construction; only those names are ever read, created, filled or destroyed.

Inputs: `set_members(name, members)` (CIDRs / addresses of the set's family: `cali40*`
sets are `family inet`, `cali60*` ones `family inet6`; members of the other family are
skipped), `remove(name)`. Output: `apply()` writes the difference from the
kernel in ONE `ipset -exist restore`: creates and member changes; `apply_deletions()`
destroys removed sets (call it after the iptables rules referencing them are gone).

Invariants: a second apply of the same state runs no command; a failure raises
`IPSetError`, keeps the work pending and re-reads the kernel (`ipset save`) next time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.managers.ipsets import (
    IPSetError,
    IPSetState,
    family_of_set,
    normalise_member,
    parse_ipset_save,
    restore_lines,
)
from pyfelix.agent.shims.cmd import CommandError, CommandRunner

log = logging.getLogger(__name__)

KERNEL_TYPE = "hash:net"


class FixedIPSets:
    """Named hash:net sets in one namespace, owned by one manager."""

    def __init__(self, runner: CommandRunner, names: Iterable[str], *,
                 ipset_binary: str = "ipset", max_size: int = 1048576) -> None:
        self._runner = runner
        self._names = tuple(sorted(set(names)))
        if not self._names:
            raise ValueError("FixedIPSets: no set names")
        self._binary = ipset_binary
        self._max_size = max_size
        self._tracker: DeltaTracker[str, IPSetState] = DeltaTracker()
        self._resync_needed = True
        self.restore_calls = 0

    def set_members(self, name: str, members: Iterable[str]) -> None:
        self._check(name)
        kernel: set[str] = set()
        for member in members:
            normalised = normalise_member(member, "net", family_of_set(name))
            if normalised is None:
                log.error("IP set %s: member %r is not an address or CIDR; skipped", name,
                          member)
                continue
            kernel.update(normalised)  # []: of the other family, not for this set
        self._tracker.set_desired(name, IPSetState(KERNEL_TYPE, frozenset(kernel)))

    def remove(self, name: str) -> None:
        self._check(name)
        self._tracker.delete_desired(name)

    def members(self, name: str) -> frozenset[str]:
        state = self._tracker.get_desired(name)
        return state.members if state is not None else frozenset()

    def request_resync(self) -> None:
        self._resync_needed = True

    def _check(self, name: str) -> None:
        if name not in self._names:
            raise ValueError(f"IP set {name!r} is not one of {self._names}")

    def _run(self, argv: list[str], text: str | None = None) -> str:
        try:
            return self._runner.run([self._binary, *argv], input=text).stdout
        except CommandError as exc:
            self._resync_needed = True
            raise IPSetError(str(exc)) from exc

    def _resync(self) -> None:
        saved = parse_ipset_save(self._run(["save"]), prefix=self._names)
        self._tracker.replace_all_dataplane(
            {name: state for name, state in saved.items() if name in self._names})
        self._resync_needed = False

    def apply(self) -> bool:
        """Create and fill; returns True when a restore ran."""
        if self._resync_needed:
            self._resync()
        updates = self._tracker.pending_updates()
        lines = [line for name, state in updates for line in restore_lines(
            name, state, self._tracker.get_dataplane(name), self._max_size,
            family_of_set(name))]
        if not lines:
            return False
        self.restore_calls += 1
        self._run(["-exist", "restore"], "\n".join(lines) + "\n")
        for name, _ in updates:
            self._tracker.mark_update_applied(name)
        return True

    def apply_deletions(self) -> bool:
        deletions = self._tracker.pending_deletions()
        if not deletions:
            return False
        self.restore_calls += 1
        self._run(["-exist", "restore"], "".join(f"destroy {n}\n" for n in sorted(deletions)))
        for name in deletions:
            self._tracker.mark_deletion_applied(name)
        return True

    @property
    def in_sync(self) -> bool:
        return self._tracker.in_sync and not self._resync_needed

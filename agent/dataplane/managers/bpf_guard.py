"""BPF guard manager: keeps the nftables guard's `programmed` set equal to the workload
interfaces our tc programs run on.

Role: the "no unpoliced window" half of the BPF dataplane (kernel side and rationale:
`agent.shims.nft_guard`). Every packet from or to a workload interface whose ifindex is
not in the set is dropped by the kernel, with or without a running agent. This manager
runs right after `BpfAttachManager` in each round and reads its outcome:

    BpfAttachManager.attached  (ifindexes whose tc filters run our programs)
            │ add, once attached
            ▼
    nft set inet pyfelix_guard programmed  ◄── delete, once the interface is gone
            (BpfAttachManager.links no longer has that ifindex)

Inputs: none of its own (InSync is noted); it reads the attach manager after that
manager's apply. Output (`apply`): on the first apply and at every resync, the table is
installed or its rules rewritten when the interface prefixes changed (never the set), and
the set is read back; then only the difference is written. Applying twice writes nothing.
Removals wait until the attach manager has listed the namespace's interfaces once (its
first apply may fail before that): a partial view never cuts a running pod off.

Invariants: an ifindex is added only after both filters of ours are attached to it, and
removed only when the interface no longer exists, so an interface running our programs is
never cut off, including across agent restarts (the set survives the agent, and a
restarted agent only adds to it). Policy-critical: without the guard, a new interface
would forward unpoliced until attached, so persistent failure fails the agent closed.
"""

from __future__ import annotations

import logging
from typing import Protocol

from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import InSync
from pyfelix.agent.shims.nft_guard import NftGuard

log = logging.getLogger(__name__)


class AttachedInterfaces(Protocol):
    """What the guard reads from the attach manager."""

    @property
    def attached(self) -> frozenset[int]: ...

    @property
    def links(self) -> dict[str, int]: ...

    @property
    def links_listed(self) -> bool: ...


class BpfGuardManager(ManagerBase):
    name = "bpf-guard"
    policy_critical = True

    def __init__(self, attach: AttachedInterfaces, *,
                 interface_prefixes: tuple[str, ...] = ("cali",),
                 netns: str | None = None, guard: NftGuard | None = None) -> None:
        super().__init__()
        self._attach = attach
        self._prefixes = interface_prefixes
        self.guard = guard or NftGuard(netns=netns)
        self._in_set: set[int] | None = None  # None: not read from the kernel yet

    def on_update(self, msg: object) -> None:
        if isinstance(msg, InSync):
            self._datastore_in_sync = True

    def apply(self) -> None:
        links = self._attach.links
        if self._resync_requested or self._in_set is None:
            self.guard.install(self._prefixes)
            self._in_set = self.guard.members(links)
            self._resync_requested = False
        add = self._attach.attached - self._in_set
        if add:
            self.guard.add(add)
            self._in_set |= add
        if not self._attach.links_listed:
            return  # an interface missing from a partial view is not gone (fail closed
            #         would cut off every programmed pod, so: no removal on partial data)
        gone = self._in_set - set(links.values())
        if gone:
            self.guard.discard(gone)
            self._in_set -= gone

    @property
    def programmed(self) -> frozenset[int]:
        return frozenset(self._in_set or ())

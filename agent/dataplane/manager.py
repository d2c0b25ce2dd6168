"""The dataplane manager protocol: what the driver loop (`agent.dataplane.loop`) calls.

Role: a manager owns one slice of kernel state (routes, sysctls, IP sets, iptables chains,
BPF maps...) and keeps it equal to what the calc graph's messages describe.

Contract (Felix's `Manager` interface, in Python):
- `on_update(msg)`: called for EVERY message (calc-graph `agent.proto` messages and the
  interface monitor's `agent.dataplane.events`), in order, from the loop thread. Cheap:
  records desired state and marks it dirty; ignores irrelevant messages; NEVER touches the
  kernel; never raises for bad input (logs and keeps going).
- `apply()`: diffs desired against actual (read from the kernel through a shim when a resync
  is due) and writes only the difference. Raises on failure; the work stays dirty, and
  calling `apply()` again later retries it. With nothing dirty it returns without I/O.
- `finish_apply()`: second phase, run only after every manager's `apply()` succeeded in a
  round: deletions that must wait for other managers (IP sets are destroyed only after the
  iptables rules referencing them are gone). Same failure rules as `apply()`.
- `request_resync()`: the next `apply()` re-reads the kernel and repairs drift.
- `close()` (ManagerBase): release the manager's shims; the programmed dataplane stays.
- `policy_critical`: True when a persistent failure means policy is not enforced; the loop
  fails closed (signals fatal) when such a manager fails for longer than its bound.

Invariant: before `agent.proto.InSync` has been seen, a manager does not delete kernel
objects it did not create in this run (stale state is swept only after in-sync).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Manager(Protocol):
    """What the driver loop needs from a manager."""

    name: str
    policy_critical: bool

    def on_update(self, msg: object) -> None: ...

    def apply(self) -> None: ...

    def finish_apply(self) -> None: ...

    def request_resync(self) -> None: ...

    def close(self) -> None: ...


class ManagerBase:
    """Defaults for the optional parts of the protocol; subclasses override what they need."""

    name: str = "manager"
    policy_critical: bool = False

    def __init__(self) -> None:
        self._resync_requested = True  # the first apply always reads the kernel
        self._datastore_in_sync = False

    def on_update(self, msg: object) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def apply(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def finish_apply(self) -> None:
        return None

    def request_resync(self) -> None:
        self._resync_requested = True

    def close(self) -> None:
        """Release kernel handles (netlink sockets, namespace threads); state stays in place."""
        return None

"""IP sets manager: the calc graph's IP sets -> kernel ipsets (`ipset restore`), in a namespace.

Role: Felix's `ipsets` manager for the iptables dataplane. Inputs: `IPSetUpdate` (whole
membership), `IPSetDeltaUpdate` (members added/removed), `IPSetRemove`, `InSync`.
Kernel objects: `cali40s:<hash>` hash:net sets (selectors, nets) and `cali40n:<hash>`
hash:net,port sets (named ports, members `<cidr>,<proto>:<port>`), family inet, and their
IPv6 twins `cali60s:` / `cali60n:` (family inet6, see Normalisation).

Two phases, in Felix's order around the iptables rules:
- `apply()` (before the iptables manager): create new sets and add/remove members, in ONE
  `ipset -exist restore` call carrying only the difference from the kernel;
- `finish_apply()` (after the iptables manager): destroy sets nobody wants any more, when
  no rule references them. Unknown sets of ours are destroyed only after InSync.

`only` (BPF mode): a callable returning the ids of the sets to program - the iptables
manager's `referenced_ip_sets()`, the sets its host endpoint rules match. Every set is still
tracked (a set becoming referenced is programmed whole at once), but only the referenced
ones are normalised and in the kernel (the BPF programs keep their own copy in the `ipsets`
map); updates to the others cost a Python set operation and write nothing. A set no longer
referenced is destroyed in phase 2 like a removed one.

Normalisation: members are kept in the form `ipset save` prints, so desired and actual
compare equal: host entries without "/32" ("/128"), networks as address/len; a /0 (which
hash:net cannot hold) is split into two /1s. Families (`families`): each calc-graph set is
a `cali40*` set (family inet) of its IPv4 members and, with 6 (the default, in both modes:
BPF mode thereby also sweeps an iptables-mode agent's IPv6 sets), a `cali60*` twin (family
inet6, same hash) of its IPv6 members; members of a family not managed are skipped and counted in
`skipped_other_family`.

Invariants: only sets whose name starts with `cali40s:` or `cali40n:` (`cali60s:` /
`cali60n:` for IPv6) are read or written
(fixed-name `cali40` sets such as `cali40this-host` belong to other managers); a second apply of
the same state runs no command; a failure raises, keeps the work pending, re-reads the
kernel (`ipset save`) next time.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.iptables.names import (
    CALC_IPSET_PREFIXES,
    CALC_IPSET_PREFIXES6,
    IPSET_PREFIX6,
    IPSET_TYPE_IP_PORT,
    IPSET_TYPE_NET,
    KERNEL_IPSET_TYPES,
    ipset_name,
)
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.proto import InSync, IPSetDeltaUpdate, IPSetRemove, IPSetUpdate
from pyfelix.agent.shims.cmd import CommandError, CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)

_PORT_PROTOCOLS = {"tcp", "udp", "sctp", "udplite"}


class IPSetError(RuntimeError):
    """ipset failed; the work stays pending and the kernel is re-read."""


@dataclass(frozen=True)
class IPSetState:
    kernel_type: str  # "hash:net" | "hash:net,port"
    members: frozenset[str]


def _normalise_net(text: str, family: int = 4) -> list[str] | None:
    """A CIDR/IP -> ipset's printed form(s); None when unparsable; [] when of the other
    family."""
    text = text.strip()
    addr, slash, plen = text.partition("/")
    if family == 4 and (not slash or plen == "32") and ":" not in addr:
        try:  # fast path for host entries, the bulk of every set
            socket.inet_pton(socket.AF_INET, addr)
        except OSError:
            return None
        return [addr]
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    if net.version != family:
        return []
    if net.prefixlen == 0:  # hash:net cannot hold /0
        return (["0.0.0.0/1", "128.0.0.0/1"] if family == 4 else ["::/1", "8000::/1"])
    if net.prefixlen == net.max_prefixlen:
        return [str(net.network_address)]
    return [str(net)]


def normalise_member(member: str, set_type: str, family: int = 4) -> list[str] | None:
    """One proto member -> kernel members (None: malformed; []: of the other family)."""
    if set_type == IPSET_TYPE_NET:
        return _normalise_net(member, family)
    try:
        net_text, port_text = member.rsplit(",", 1)
        proto, port = port_text.split(":", 1)
        port_number = int(port)
    except ValueError:
        return None
    proto = proto.lower()
    if proto not in _PORT_PROTOCOLS or not 0 <= port_number <= 65535:
        return None
    nets = _normalise_net(net_text, family)
    if nets is None:
        return None
    return [f"{n},{proto}:{port_number}" for n in nets]


def family_of_set(name: str) -> int:
    return 6 if name.startswith(IPSET_PREFIX6) else 4


def parse_ipset_save(text: str, prefix: str | tuple[str, ...] = CALC_IPSET_PREFIXES
                     ) -> dict[str, IPSetState]:
    types: dict[str, str] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[1].startswith(prefix):
            continue
        if parts[0] == "create":
            types[parts[1]] = parts[2]
            members.setdefault(parts[1], set())
        elif parts[0] == "add":
            set_type = IPSET_TYPE_IP_PORT if types.get(parts[1], "").endswith(",port") \
                else IPSET_TYPE_NET
            norm = normalise_member(parts[2], set_type, family_of_set(parts[1]))
            members.setdefault(parts[1], set()).update(norm or [parts[2]])
    return {name: IPSetState(types[name], frozenset(members.get(name, ()))) for name in types}


def classify_member(member: str, set_type: str) -> tuple[int, list[str]] | None:
    """One proto member -> (its family, kernel members); None when malformed."""
    ipv4 = normalise_member(member, set_type, 4)
    if ipv4 is None:
        return None
    if ipv4:
        return 4, ipv4
    ipv6 = normalise_member(member, set_type, 6)
    return (6, ipv6) if ipv6 else None


class _SetMembers:
    """One set's members: raw proto member -> (family, kernel member)s, with reference
    counts per family (two raw members can normalise to the same kernel member), so a
    delta costs O(delta). Members of a family not in `families` are skipped (counted)."""

    def __init__(self, set_id: str, set_type: str, families: tuple[int, ...]) -> None:
        self.set_id = set_id
        self.set_type = set_type
        self.families = families
        self.raw: dict[str, tuple[tuple[int, str], ...]] = {}
        self.counts: dict[int, dict[str, int]] = {family: {} for family in families}
        self._skipped_other_family = 0

    def add(self, member: str) -> None:
        if member in self.raw:
            return
        classified = classify_member(member, self.set_type)
        if classified is None:
            log.error("IP set %s: member %r is malformed; skipped", self.set_id, member)
            return
        family, norm = classified
        if family not in self.families:
            self._skipped_other_family += 1
            norm = []
        self.raw[member] = kernel_members = tuple((family, m) for m in norm)
        self._count(kernel_members)

    def _count(self, kernel_members: tuple[tuple[int, str], ...]) -> None:
        for family, kernel_member in kernel_members:
            counts = self.counts[family]
            counts[kernel_member] = counts.get(kernel_member, 0) + 1

    def remove(self, member: str) -> None:
        for family, kernel_member in self.raw.pop(member, ()):
            counts = self.counts[family]
            left = counts[kernel_member] - 1
            if left:
                counts[kernel_member] = left
            else:
                del counts[kernel_member]

    def replace(self, members: frozenset[str], old: _SetMembers | None) -> None:
        """Whole new membership; reuses `old`'s normalisations for members it already had."""
        for member in members:
            cached = old.raw.get(member) if old is not None else None
            if cached is not None:
                self.raw[member] = cached
                self._count(cached)
            else:
                self.add(member)

    def take_skipped_other_family(self) -> int:
        count, self._skipped_other_family = self._skipped_other_family, 0
        return count


def restore_lines(name: str, state: IPSetState, actual: IPSetState | None,
                  max_size: int, family: int = 4) -> list[str]:
    """`ipset restore` lines taking set `name` from `actual` (None: absent) to `state`:
    create it if absent, then delete and add only the members that differ."""
    if actual is not None and actual.kernel_type != state.kernel_type:
        raise IPSetError(f"ipset {name}: kernel has type {actual.kernel_type}, "
                         f"want {state.kernel_type}; remove it by hand")
    lines: list[str] = []
    old: frozenset[str] = frozenset()
    if actual is None:
        maxelem = max(max_size, len(state.members))
        inet = "inet" if family == 4 else "inet6"
        lines.append(f"create {name} {state.kernel_type} family {inet} maxelem {maxelem}")
    else:
        old = actual.members
    lines += [f"del {name} {m}" for m in sorted(old - state.members)]
    lines += [f"add {name} {m}" for m in sorted(state.members - old)]
    return lines


class IPSetsManager(ManagerBase):
    """The calc graph's sets as kernel ipsets, per family in `families`: `cali40*` sets of
    the IPv4 members and (with 6) `cali60*` twins of the IPv6 members, all written by one
    `ipset restore` per phase."""

    name = "ipsets"
    policy_critical = True

    def __init__(
        self,
        *,
        netns: str | None = None,
        runner: CommandRunner | None = None,
        max_size: int = 1048576,
        ipset_binary: str = "ipset",
        only: Callable[[], Collection[str]] | None = None,
        families: tuple[int, ...] = (4, 6),
    ) -> None:
        super().__init__()
        if not families or any(f not in (4, 6) for f in families):
            raise ValueError("IPSetsManager: families must be 4 and/or 6")
        self.families = tuple(sorted(set(families)))
        # sets of a family not managed here are not read either (a manager without 6 never
        # touches cali60 sets)
        self._prefixes = tuple(p for family in self.families for p in (
            CALC_IPSET_PREFIXES if family == 4 else CALC_IPSET_PREFIXES6))
        self._only = only
        if max_size <= 0:
            raise ValueError("IPSetsManager: max_size must be positive")
        self._runner = runner or NetnsCommandRunner(netns)
        self._binary = ipset_binary
        self._max_size = max_size
        self._sets: dict[str, _SetMembers] = {}  # set id -> members, normalised as they come
        self._dirty: set[str] = set()
        # with `only`: the sets not programmed, as received (set id -> type, raw members);
        # normalised only once wanted. Every set is in exactly one of _sets / _unprogrammed.
        self._unprogrammed: dict[str, tuple[str, set[str]]] = {}
        self._tracker: DeltaTracker[str, IPSetState] = DeltaTracker()
        self.skipped_other_family = 0  # members of a family not in `families`
        self.restore_calls = 0

    def _set_names(self, set_id: str, set_type: str) -> list[tuple[int, str]]:
        """(family, kernel name) of each family's set for one calc-graph set."""
        return [(family, ipset_name(set_id, set_type, family)) for family in self.families]

    def _forget(self, set_id: str, set_type: str) -> None:
        for _family, name in self._set_names(set_id, set_type):
            self._tracker.delete_desired(name)

    # --- on_update ---------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, IPSetUpdate):
            if msg.type not in KERNEL_IPSET_TYPES:
                log.error("IPSetUpdate %s: type %r is not net or ip_port; set ignored",
                          msg.id, msg.type)
                return
            if self._only is not None and msg.id not in self._sets:
                self._unprogrammed[msg.id] = (msg.type, set(msg.members))
                return
            old = self._sets.get(msg.id)
            if old is not None and old.set_type != msg.type:
                self._forget(msg.id, old.set_type)
                old = None
            entry = _SetMembers(msg.id, msg.type, self.families)
            entry.replace(msg.members, old)
            self._sets[msg.id] = entry
            self._dirty.add(msg.id)
        elif isinstance(msg, IPSetDeltaUpdate):
            unprogrammed = self._unprogrammed.get(msg.id)
            if unprogrammed is not None:
                unprogrammed[1].difference_update(msg.removed)
                unprogrammed[1].update(msg.added)
                return
            entry = self._sets.get(msg.id)
            if entry is None:
                log.error("IPSetDeltaUpdate %s: unknown set; ignored", msg.id)
                return
            for member in msg.removed:
                entry.remove(member)
            for member in msg.added:
                entry.add(member)
            self._dirty.add(msg.id)
        elif isinstance(msg, IPSetRemove):
            entry = self._sets.pop(msg.id, None)
            if entry is not None:
                self._forget(msg.id, entry.set_type)
            self._dirty.discard(msg.id)
            self._unprogrammed.pop(msg.id, None)
        elif isinstance(msg, InSync):
            self._datastore_in_sync = True

    def _select_programmed(self, wanted: Collection[str]) -> None:
        """`only` mode: move sets between programmed (normalised, desired in the kernel) and
        not (raw, absent from the kernel) as `wanted` says."""
        wanted = set(wanted)
        for set_id in [i for i in self._sets if i not in wanted]:
            entry = self._sets.pop(set_id)
            self._forget(set_id, entry.set_type)
            self._unprogrammed[set_id] = (entry.set_type, set(entry.raw))
        for set_id in wanted:
            unprogrammed = self._unprogrammed.pop(set_id, None)
            if unprogrammed is not None:
                entry = _SetMembers(set_id, unprogrammed[0], self.families)
                entry.replace(frozenset(unprogrammed[1]), None)
                self._sets[set_id] = entry
                self._dirty.add(set_id)

    def _refresh_desired(self) -> None:
        if self._only is not None:
            self._select_programmed(self._only())
        for set_id in self._dirty:
            entry = self._sets.get(set_id)
            if entry is None:
                continue
            self.skipped_other_family += entry.take_skipped_other_family()
            for family, name in self._set_names(set_id, entry.set_type):
                self._tracker.set_desired(name, IPSetState(
                    KERNEL_IPSET_TYPES[entry.set_type], frozenset(entry.counts[family])))
        self._dirty.clear()

    # --- apply -------------------------------------------------------------------------------

    def _run(self, argv: list[str], text: str | None = None) -> str:
        try:
            return self._runner.run([self._binary, *argv], input=text).stdout
        except CommandError as exc:
            self._resync_requested = True
            raise IPSetError(str(exc)) from exc

    def _resync(self) -> None:
        self._tracker.replace_all_dataplane(parse_ipset_save(self._run(["save"]), self._prefixes))
        self._resync_requested = False

    def apply(self) -> None:
        self._refresh_desired()
        if self._resync_requested:
            self._resync()
        updates = self._tracker.pending_updates()
        lines = [line for name, state in updates for line in restore_lines(
            name, state, self._tracker.get_dataplane(name), self._max_size, family_of_set(name))]
        if not lines:
            return
        self.restore_calls += 1
        self._run(["-exist", "restore"], "\n".join(lines) + "\n")
        for name, _ in updates:
            self._tracker.mark_update_applied(name)

    def finish_apply(self) -> None:
        if not self._datastore_in_sync:
            return
        deletions = self._tracker.pending_deletions()
        if not deletions:
            return
        self.restore_calls += 1
        self._run(["-exist", "restore"], "".join(f"destroy {n}\n" for n in sorted(deletions)))
        for name in deletions:
            self._tracker.mark_deletion_applied(name)

    # --- introspection -------------------------------------------------------------------------

    def desired_sets(self) -> dict[str, IPSetState]:
        return dict(self._tracker.iter_desired())

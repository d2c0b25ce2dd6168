"""Table writer: keep one kernel table (filter, nat, mangle or raw; IPv4 or IPv6) equal to a
desired set of chains, atomically.

Role: Felix's `iptables.Table` / Neutron's `iptables_manager`, for one table of one network
namespace. Inputs: `set_chain(Chain)`, `remove_chain(name)`, `set_base_inserts(chain, rules)`
(our rules at the top of the kernel's own chains of that table: FORWARD/INPUT/OUTPUT in
filter, POSTROUTING... in nat, see `BASE_CHAINS_BY_TABLE`). `apply()` then:

1. on resync (first apply, after any failure, periodically): runs `<iptables>-save -t <table>`
   and reads, for every chain with our prefix, the list of rule hashes from our comments
   (`cali:<hash>`; a rule without one counts as foreign drift), and for each base chain the
   positions of the rules carrying our comment;
2. computes the difference (DeltaTracker keyed by chain name, values = hash tuples);
3. writes ONE `iptables-restore --noflush` transaction containing only what differs:
       *filter
       :<chain> - [0:0]       for each chain to (re)write or delete (declaring flushes it)
       -D <base> <n>          our misplaced/changed inserts, highest position first
       -I <base> <i> ...      our inserts, at the top, in order
       -A <chain> ...         the rules of each rewritten chain
       -X <chain>             chains to delete (only when `allow_deletes`)
       COMMIT
4. on success records the new state; on failure raises `IptablesError`, keeps everything
   pending and re-reads the kernel on the next apply.

Invariants: only chains starting with our prefix and rules carrying our comment are ever
changed; nothing is written when desired == actual (a second apply is a no-op: no process
is even started unless a resync is due, and a resync that finds no drift writes nothing);
chains that are not ours are not deleted before the caller allows it (after in-sync).

Backends: `detect_backend()` picks nft or legacy (Felix's `IptablesBackend` Auto/NFT/Legacy):
whichever already holds rules in the namespace, else the default `iptables` binaries.
Families: an `IptablesTable` writes IPv4 or IPv6 according to its binaries;
`IptablesBinaries.ipv6()` is the ip6tables twin of a set of iptables binaries (same backend:
`ip6tables-nft-save`/`-restore` for nft, `ip6tables-legacy-*` for legacy, `ip6tables-*` for
the default), so both families of a namespace always use one backend.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from pyfelix.agent.dataplane.delta import DeltaTracker
from pyfelix.agent.dataplane.iptables.chains import Chain, rule_hashes, with_comment
from pyfelix.agent.dataplane.iptables.names import CHAIN_PREFIX, HASH_COMMENT_PREFIX
from pyfelix.agent.shims.cmd import CommandError, CommandRunner

log = logging.getLogger(__name__)

# The kernel's own chains of each table: where our inserts may go.
BASE_CHAINS_BY_TABLE: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
}
BASE_CHAINS = BASE_CHAINS_BY_TABLE["filter"]


def _ip6_twin(path: str) -> str:
    head, base = os.path.split(path)
    if base.startswith("ip6tables"):
        return path
    if not base.startswith("iptables"):
        raise ValueError(f"iptables binary {path!r}: no ip6tables twin (name must start with "
                         "'iptables')")
    return os.path.join(head, "ip6" + base[len("ip"):])


@dataclass(frozen=True)
class IptablesBinaries:
    save: str = "iptables-save"
    restore: str = "iptables-restore"
    backend: str = "default"
    family: int = 4  # 4: iptables, 6: ip6tables

    def ipv6(self) -> IptablesBinaries:
        """The ip6tables binaries of the same backend (`iptables-nft-save` ->
        `ip6tables-nft-save`, ...)."""
        if self.family == 6:
            return self
        return IptablesBinaries(_ip6_twin(self.save), _ip6_twin(self.restore), self.backend,
                                family=6)


BACKENDS = {
    "nft": IptablesBinaries("iptables-nft-save", "iptables-nft-restore", "nft"),
    "legacy": IptablesBinaries("iptables-legacy-save", "iptables-legacy-restore", "legacy"),
}
BACKENDS6 = {name: binaries.ipv6() for name, binaries in BACKENDS.items()}


class IptablesError(RuntimeError):
    """iptables-save/-restore failed; the table stays dirty and re-reads the kernel."""


def _count_rules(save_output: str) -> int:
    return sum(1 for line in save_output.splitlines() if line.startswith("-A "))


def detect_backend(
    runner: CommandRunner, mode: str = "auto", *, default: IptablesBinaries | None = None
) -> IptablesBinaries:
    """Felix's IptablesBackend: "auto" | "nft" | "legacy" (case-insensitive)."""
    mode = mode.lower()
    if mode in BACKENDS:
        return BACKENDS[mode]
    if mode != "auto":
        raise ValueError(f"IptablesBackend: {mode!r} is not one of Auto, NFT, Legacy")
    counts = {}
    for name, binaries in BACKENDS.items():
        try:
            out = runner.run([binaries.save], check=False).stdout
        except CommandError:  # binary missing
            out = ""
        counts[name] = _count_rules(out)
    if counts["legacy"] > counts["nft"]:
        chosen = BACKENDS["legacy"]
    elif counts["nft"] > 0:
        chosen = BACKENDS["nft"]
    else:
        chosen = default or IptablesBinaries()
    log.info("iptables backend: %s (rules found: %s)", chosen.backend, counts)
    return chosen


_HASH_RE = re.compile(r'--comment "?' + re.escape(HASH_COMMENT_PREFIX) + r'([A-Za-z0-9_-]+)"?')


@dataclass
class SavedTable:
    """What `iptables-save -t <table>` says, reduced to what we need."""

    chains: dict[str, tuple[str | None, ...]]  # our chains -> rule hashes (None: foreign rule)
    base_ours: dict[str, list[tuple[int, str]]]  # base chain -> [(1-based position, hash)]
    all_chains: set[str]


def parse_save(text: str, *, table: str = "filter", prefix: str = CHAIN_PREFIX) -> SavedTable:
    chains: dict[str, list[str | None]] = {}
    base_ours: dict[str, list[tuple[int, str]]] = {}
    positions: dict[str, int] = {}
    all_chains: set[str] = set()
    in_table = False
    for line in text.splitlines():
        if line.startswith("*"):
            in_table = line[1:].strip() == table
            continue
        if not in_table:
            continue
        if line.startswith(":"):
            name = line[1:].split()[0]
            all_chains.add(name)
            if name.startswith(prefix):
                chains.setdefault(name, [])
        elif line.startswith("-A "):
            parts = line.split(maxsplit=2)
            name = parts[1]
            rest = parts[2] if len(parts) > 2 else ""
            found = _HASH_RE.search(rest)
            rule_hash = found.group(1) if found else None
            if name.startswith(prefix):
                chains.setdefault(name, []).append(rule_hash)
            else:
                positions[name] = positions.get(name, 0) + 1
                if rule_hash is not None:
                    base_ours.setdefault(name, []).append((positions[name], rule_hash))
    return SavedTable({k: tuple(v) for k, v in chains.items()}, base_ours, all_chains)


class IptablesTable:
    """Desired chains of one table in one namespace, and the writer that programs them."""

    def __init__(
        self,
        runner: CommandRunner,
        *,
        binaries: IptablesBinaries | None = None,
        table: str = "filter",
        prefix: str = CHAIN_PREFIX,
        restore_timeout: float = 60.0,
    ) -> None:
        if table not in BASE_CHAINS_BY_TABLE:
            raise ValueError(f"iptables table {table!r} is not one of "
                             f"{sorted(BASE_CHAINS_BY_TABLE)}")
        self._runner = runner
        self.binaries = binaries or IptablesBinaries()
        self._table = table
        self._prefix = prefix
        self._timeout = restore_timeout
        self._chains: dict[str, Chain] = {}
        self._tracker: DeltaTracker[str, tuple[str | None, ...]] = DeltaTracker()
        self._inserts: dict[str, tuple[str, ...]] = {}
        self._inserts_actual: dict[str, list[tuple[int, str]]] = {}
        self._resync_needed = True
        self.restore_calls = 0
        self.save_calls = 0
        self.last_restore_input = ""

    # --- desired -----------------------------------------------------------------------------

    def set_chain(self, chain: Chain) -> None:
        if not chain.name.startswith(self._prefix):
            raise ValueError(f"chain {chain.name!r} does not start with {self._prefix!r}")
        self._chains[chain.name] = chain
        self._tracker.set_desired(chain.name, chain.hashes)

    def remove_chain(self, name: str) -> None:
        self._chains.pop(name, None)
        self._tracker.delete_desired(name)

    def set_base_inserts(self, base_chain: str, rules: tuple[str, ...]) -> None:
        allowed = BASE_CHAINS_BY_TABLE.get(self._table, ())
        if base_chain not in allowed:
            raise ValueError(f"base chain {base_chain!r} is not one of the {self._table} "
                             f"table's {allowed}")
        self._inserts[base_chain] = rules

    def desired_chain(self, name: str) -> Chain | None:
        return self._chains.get(name)

    def desired_chain_names(self) -> frozenset[str]:
        return frozenset(self._chains)

    def request_resync(self) -> None:
        self._resync_needed = True

    # --- kernel ------------------------------------------------------------------------------

    def _resync(self) -> None:
        self.save_calls += 1
        try:
            out = self._runner.run([self.binaries.save, "-t", self._table]).stdout
        except CommandError as exc:
            raise IptablesError(str(exc)) from exc
        saved = parse_save(out, table=self._table, prefix=self._prefix)
        self._tracker.replace_all_dataplane(saved.chains)
        self._inserts_actual = saved.base_ours
        self._resync_needed = False

    def _insert_plan(self) -> tuple[list[str], dict[str, list[tuple[int, str]]]]:
        """Lines that put our base-chain inserts right; and the resulting actual state."""
        lines: list[str] = []
        new_actual: dict[str, list[tuple[int, str]]] = {}
        for base in sorted(set(self._inserts) | set(self._inserts_actual)):
            rules = self._inserts.get(base, ())
            hashes = rule_hashes(base, rules)
            actual = self._inserts_actual.get(base, [])
            wanted = [(i + 1, h) for i, h in enumerate(hashes)]
            if actual == wanted:
                if wanted:
                    new_actual[base] = wanted
                continue
            for position, _ in sorted(actual, reverse=True):
                lines.append(f"-D {base} {position}")
            for i, (h, rule) in enumerate(zip(hashes, rules, strict=True)):
                lines.append(f"-I {base} {i + 1} {with_comment(h, rule)}")
            if wanted:
                new_actual[base] = wanted
        return lines, new_actual

    def apply(self, *, allow_deletes: bool) -> bool:
        """Program the difference. Returns True when a restore was run."""
        return apply_tables([self], allow_deletes=allow_deletes)

    def plan(self, *, allow_deletes: bool) -> TablePlan | None:
        """Resync if due, then the restore transaction for the difference (None: in sync)."""
        if self._resync_needed:
            self._resync()
        updates = sorted(name for name, _ in self._tracker.pending_updates())
        deletes = sorted(self._tracker.pending_deletions()) if allow_deletes else []
        insert_lines, new_inserts = self._insert_plan()
        if not updates and not deletes and not insert_lines:
            return None
        lines = [f"*{self._table}"]
        lines += [f":{name} - [0:0]" for name in sorted(set(updates) | set(deletes))]
        lines += insert_lines
        for name in updates:
            lines += self._chains[name].restore_lines()
        lines += [f"-X {name}" for name in deletes]
        lines.append("COMMIT")
        return TablePlan(self, lines, updates, deletes, new_inserts)

    def _committed(self, plan: TablePlan) -> None:
        for name in plan.updates:
            self._tracker.mark_update_applied(name)
        for name in plan.deletes:
            self._tracker.mark_deletion_applied(name)
        self._inserts_actual = plan.new_inserts

    def _failed(self) -> None:
        self._resync_needed = True

    def remove_all(self) -> None:
        """Forget every desired chain and insert (the next apply removes all of ours)."""
        for name in list(self._chains):
            self.remove_chain(name)
        self._inserts = {}

    @property
    def in_sync(self) -> bool:
        return self._tracker.in_sync and not self._resync_needed



@dataclass
class TablePlan:
    """One table's part of a restore transaction, and what it will have done."""

    table: IptablesTable
    lines: list[str]
    updates: list[str]
    deletes: list[str]
    new_inserts: dict[str, list[tuple[int, str]]]


def apply_tables(tables: list[IptablesTable], *, allow_deletes: bool) -> bool:
    """Program several tables of ONE namespace (same binaries) with one iptables-restore run:
    each table's `*table ... COMMIT` block in the given order (raw/mangle before filter, so
    rules trusting marks from earlier tables are never ahead of them). Returns True when a
    restore ran. On failure every table involved re-reads the kernel next time."""
    plans = [plan for plan in (t.plan(allow_deletes=allow_deletes) for t in tables)
             if plan is not None]
    if not plans:
        return False
    first = plans[0].table
    if any(p.table.binaries != first.binaries or p.table._runner is not first._runner
           for p in plans):
        raise ValueError("apply_tables: the tables must share one runner and backend")
    text = "".join("\n".join(p.lines) + "\n" for p in plans)
    for plan in plans:
        plan.table.restore_calls += 1
        plan.table.last_restore_input = text
    try:
        first._runner.run([first.binaries.restore, "--noflush", "--wait", "10"], input=text,
                          timeout=max(p.table._timeout for p in plans))
    except CommandError as exc:
        for plan in plans:
            plan.table._failed()
        raise IptablesError(str(exc)) from exc
    for plan in plans:
        plan.table._committed(plan)
    return True

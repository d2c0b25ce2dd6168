"""The BPF mode's guard against unpoliced workload interfaces: one nftables table.

Role: a workload interface forwards traffic the moment the CNI plugin brings it up, and our
tc programs are attached only when an agent sees it: at start, while the agent crash-loops
or upgrades, or in the ~40 ms after the interface appears. The guard closes that window in
the kernel, without the agent: an `inet` table (IPv4 and IPv6) of ours that drops every
packet from or to an interface of a workload prefix whose ifindex is not in the set
`programmed`:

    table inet pyfelix_guard                   (comment: "pyfelix guard <hash of the rules>")
      set programmed { type iface_index }      ifindexes running both our tc programs
      chain forward  hook forward prio -10     iifname "cali*" iif != @programmed  drop
                                               oifname "cali*" oif != @programmed  drop
      chain input    hook input   prio -10     iifname "cali*" iif != @programmed  drop
      chain output   hook output  prio -10     oifname "cali*" oif != @programmed  drop

Each drop rule counts (`counters()`: packets by reason `from_unprogrammed` /
`to_unprogrammed`). Membership is by ifindex, not by name: a pod deleted and re-created with
the same interface name gets a new ifindex, so it is dropped until the agent attaches to
the new interface, even while the agent is down.

Lifetime: `install()` creates the table, or rewrites its chains in one nft transaction when
the interface prefixes changed (told by the hash in the table's comment); it never touches
the set, so a restarted agent keeps every programmed interface reachable. A normal stop
(SIGTERM, kill -9) leaves the table in place; `remove()` is for `pyfelix cleanup` and for
an agent switched to iptables mode (BpfCleanupManager).

Kernel access is the `nft` command (Debian's nftables) through a `CommandRunner`, so the
guard works in any network namespace and unit tests use a fake runner.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence

from pyfelix.agent.shims.cmd import CommandError, CommandRunner, NetnsCommandRunner

log = logging.getLogger(__name__)

TABLE = "pyfelix_guard"
SET = "programmed"
PRIORITY = -10  # before the filter tables (iptables-nft registers at 0)
REASON_FROM = "from_unprogrammed"
REASON_TO = "to_unprogrammed"


class GuardError(RuntimeError):
    """nft failed (missing binary, kernel without nf_tables, bad rules)."""


def _rules(prefixes: Sequence[str]) -> list[tuple[str, str]]:
    """(chain, rule) of the guard for these interface prefixes."""
    out: list[tuple[str, str]] = []
    for prefix in prefixes:
        wild = json.dumps(prefix + "*")
        from_rule = f"iifname {wild} iif != @{SET} counter drop comment \"{REASON_FROM}\""
        to_rule = f"oifname {wild} oif != @{SET} counter drop comment \"{REASON_TO}\""
        out += [("forward", from_rule), ("forward", to_rule), ("input", from_rule),
                ("output", to_rule)]
    return out


def install_script(prefixes: Sequence[str]) -> tuple[str, str]:
    """(nft script, its tag): creates what is missing, rewrites the chains, keeps the set."""
    if not prefixes or not all(prefixes):
        raise ValueError("guard: interface prefixes must be non-empty strings")
    rules = _rules(prefixes)
    tag = "pyfelix guard " + hashlib.sha256(repr(rules).encode()).hexdigest()[:12]
    lines = [f"add table inet {TABLE} {{ comment {json.dumps(tag)}; }}",
             f"add set inet {TABLE} {SET} {{ type iface_index; }}"]
    for chain in ("forward", "input", "output"):
        lines.append(f"add chain inet {TABLE} {chain} {{ type filter hook {chain} priority "
                     f"{PRIORITY}; policy accept; }}")
        lines.append(f"flush chain inet {TABLE} {chain}")
    lines += [f"add rule inet {TABLE} {chain} {rule}" for chain, rule in rules]
    return "\n".join(lines) + "\n", tag


class NftGuard:
    """The guard table of one network namespace (None: the caller's)."""

    def __init__(self, *, netns: str | None = None, runner: CommandRunner | None = None) -> None:
        self._runner = runner or NetnsCommandRunner(netns)

    def _nft(self, *args: str, input: str | None = None, check: bool = True) -> str:
        try:
            return self._runner.run(["nft", *args], input=input, check=check).stdout
        except CommandError as exc:
            raise GuardError(f"nft {' '.join(args)}: {exc}") from exc

    def _table(self) -> list[dict] | None:
        """The table's objects from `nft -j list table`, None when it does not exist."""
        try:
            out = self._runner.run(["nft", "-j", "list", "table", "inet", TABLE], check=False)
        except CommandError as exc:
            raise GuardError(f"nft list table: {exc}") from exc
        if out.returncode != 0:
            if "No such file" in out.stderr or "does not exist" in out.stderr:
                return None
            raise GuardError(f"nft list table inet {TABLE}: {out.stderr.strip()}")
        return [item for item in json.loads(out.stdout).get("nftables", [])
                if "metainfo" not in item]

    def install(self, prefixes: Sequence[str]) -> bool:
        """Make the table match `prefixes`; True if it was created or rewritten."""
        script, tag = install_script(prefixes)
        listing = self._runner.run(["nft", "list", "table", "inet", TABLE], check=False)
        exists = listing.returncode == 0
        # nft's JSON omits table comments (1.0.6): the text listing has it
        if exists and f"comment {json.dumps(tag)}" in listing.stdout:
            return False
        self._nft("-f", "-", input=script)
        log.info("BPF guard %s: nft table inet %s (%s)",
                 "rewritten" if exists else "installed", TABLE, tag)
        return True

    def members(self, names: dict[str, int]) -> set[int]:
        """Ifindexes in the set. nft prints a member whose interface exists by its name
        (`names`, name -> ifindex, maps it back) and one whose interface is gone by
        number."""
        out = self._runner.run(["nft", "-j", "list", "set", "inet", TABLE, SET], check=False)
        if out.returncode != 0:
            raise GuardError(f"nft list set inet {TABLE} {SET}: {out.stderr.strip()}")
        found: set[int] = set()
        for item in json.loads(out.stdout).get("nftables", []):
            for element in item.get("set", {}).get("elem", []):
                if isinstance(element, int):
                    found.add(element)
                elif isinstance(element, str) and element.isdigit():
                    found.add(int(element))
                elif isinstance(element, str) and element in names:
                    found.add(names[element])
                else:
                    log.warning("BPF guard: set member %r is no interface we know", element)
        return found

    def add(self, ifindexes: Iterable[int]) -> None:
        items = sorted(set(ifindexes))
        if items:
            self._nft("add", "element", "inet", TABLE, SET,
                      "{ " + ", ".join(str(i) for i in items) + " }")

    def discard(self, ifindexes: Iterable[int]) -> None:
        for ifindex in sorted(set(ifindexes)):  # one by one: a missing element fails alone
            self._nft("delete", "element", "inet", TABLE, SET, f"{{ {ifindex} }}",
                      check=False)

    def counters(self) -> dict[str, int]:
        """Packets dropped by the guard, by reason; {} when there is no guard table."""
        objects = self._table()
        totals: dict[str, int] = {}
        for obj in objects or []:
            rule = obj.get("rule")
            if not rule or rule.get("comment") not in (REASON_FROM, REASON_TO):
                continue
            for expr in rule.get("expr", []):
                if "counter" in expr:
                    reason = rule["comment"]
                    totals[reason] = totals.get(reason, 0) + int(expr["counter"]["packets"])
        return totals

    def present(self) -> bool:
        return self._table() is not None

    def remove(self) -> bool:
        """Delete the table (programmed set included); True if there was one."""
        if self._table() is None:
            return False
        self._nft("delete", "table", "inet", TABLE)
        return True


def guard_counter_rows(guard: NftGuard | None = None) -> list[dict]:
    """`pyfelix bpf global_counters` rows for the guard's drops in this namespace
    (`guard_<reason>_dropped`); none when there is no guard table or no nft."""
    try:
        counts = (guard or NftGuard()).counters()
    except GuardError:
        return []
    return [{"counter": f"guard_{reason}_dropped", "value": counts[reason]}
            for reason in (REASON_FROM, REASON_TO) if reason in counts]

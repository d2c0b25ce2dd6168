"""Fixtures for privileged lab tests: a before/after snapshot of the root network namespace.

`root_guard` records, before the test, what `ip netns list`, `ip -o link`, `ip route show
table all`, `ls /sys/fs/bpf` and the iptables rules (nft and legacy, every table) show in the
root namespace; `root_guard.check()` fails the
test with a readable diff if anything was added or removed since. Tests call it explicitly
after their lab is torn down, so the check is part of what they assert.

Links, routes and iptables rules are compared in full: nothing may create or remove any of
them in the root namespace. Namespaces and bpffs entries are shared with other processes on
a development machine (other test suites create their own, concurrently), so there only
entries named as the lab names things (`pf<6 hex>-...` namespaces, `pf<6 hex>` bpffs dirs)
count, and those of a run that is still alive (another lab running right now) are left out.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyfelix.lab import naming
from pyfelix.lab.netns import list_netns
from pyfelix.lab.runstate import run_is_alive

_LINK_LINE = re.compile(r"^(\d+): ([^:@\s]+)")


@dataclass(frozen=True)
class RootSnapshot:
    netns: frozenset[str]
    links: frozenset[str]
    routes: frozenset[str]
    bpffs: frozenset[str]
    iptables: frozenset[str]

    @classmethod
    def take(cls) -> RootSnapshot:
        links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True,
                               text=True).stdout
        routes = subprocess.run(["ip", "route", "show", "table", "all"], check=True,
                                capture_output=True, text=True).stdout
        bpffs = Path("/sys/fs/bpf")
        return cls(
            netns=frozenset(list_netns()),
            links=frozenset(
                f"{m.group(1)}:{m.group(2)}"
                for m in map(_LINK_LINE.match, links.splitlines()) if m
            ),
            routes=frozenset(line.strip() for line in routes.splitlines() if line.strip()),
            bpffs=frozenset(os.listdir(bpffs)) if bpffs.is_dir() else frozenset(),
            iptables=_iptables_rules(),
        )

    def differences(self, after: RootSnapshot) -> list[str]:
        problems = []
        for what in ("links", "routes", "iptables"):
            before_set, after_set = getattr(self, what), getattr(after, what)
            if after_set - before_set:
                problems.append(f"new {what}: {sorted(after_set - before_set)}")
            if before_set - after_set:
                problems.append(f"vanished {what}: {sorted(before_set - after_set)}")
        leaked_netns = [n for n in after.netns - self.netns if _leaked(naming.parse_run_id(n))]
        if leaked_netns:
            problems.append(f"new lab netns: {sorted(leaked_netns)}")
        leaked_pins = [b for b in after.bpffs - self.bpffs
                       if naming.RUN_ID_PATTERN.match(b) and _leaked(b)]
        if leaked_pins:
            problems.append(f"new lab bpffs entries: {sorted(leaked_pins)}")
        return problems


def _iptables_rules() -> frozenset[str]:
    """Chains and rules of every table, both backends (counters and comments stripped), and
    the nftables tables (the BPF mode's guard is an nft table of its own)."""
    lines: set[str] = set()
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                          check=False)
    lines.update(f"nft: {line.strip()}" for line in done.stdout.splitlines() if line.strip())
    for binary in ("iptables-nft-save", "iptables-legacy-save"):
        done = subprocess.run([binary], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            if line.startswith(("#", "COMMIT")) or not line.strip():
                continue
            line = re.sub(r"\[\d+:\d+\]", "", line).strip()
            lines.add(f"{binary}: {line}")
    return frozenset(lines)


def _leaked(run_id: str | None) -> bool:
    """A lab run's object outlives its run when the run is not alive any more."""
    return run_id is not None and not run_is_alive(naming.run_state_dir(run_id))


class RootGuard:
    def __init__(self) -> None:
        self.before = RootSnapshot.take()

    def check(self) -> None:
        problems = self.before.differences(RootSnapshot.take())
        assert not problems, "root namespace changed:\n" + "\n".join(problems)


@pytest.fixture
def root_guard() -> RootGuard:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    return RootGuard()

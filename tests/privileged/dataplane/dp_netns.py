"""Helpers for privileged dataplane tests: namespaces named `pyf5-<pid>-<n>`, commands in them,
and a snapshot of the root namespace to prove the tests never wrote outside their own.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

_COUNTER = itertools.count()
PREFIX = f"pyf5-{os.getpid()}-"


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def in_ns(ns: str, *argv: str, check: bool = True, input: str | None = None) -> str:
    return sh("nsenter", f"--net=/run/netns/{ns}", "--", *argv, check=check, input=input)


def root_snapshot() -> dict[str, str]:
    snap = {
        "links": sh("ip", "-o", "link", "show"),
        "routes": sh("ip", "route", "show", "table", "all"),
        "iptables-nft": sh("iptables-nft-save", check=False),
        "ipset": sh("ipset", "list", "-n", check=False),
    }
    if shutil.which("ip6tables-nft-save"):
        snap["ip6tables-nft"] = sh("ip6tables-nft-save", check=False)
    if shutil.which("iptables-legacy-save"):
        snap["iptables-legacy"] = sh("iptables-legacy-save", check=False)
    if shutil.which("ip6tables-legacy-save"):
        snap["ip6tables-legacy"] = sh("ip6tables-legacy-save", check=False)
    # drop generated timestamps
    return {k: "\n".join(ln for ln in v.splitlines() if not ln.startswith("#")) for k, v in
            snap.items()}


class NetnsFactory:
    def __init__(self) -> None:
        self.created: list[str] = []

    def __call__(self) -> str:
        name = f"{PREFIX}{next(_COUNTER)}"
        sh("ip", "netns", "add", name)
        self.created.append(name)
        in_ns(name, "ip", "link", "set", "lo", "up")
        return name

    def cleanup(self) -> None:
        for name in reversed(self.created):
            sh("ip", "netns", "del", name, check=False)
        self.created.clear()


class CountingRunner:
    """A real NetnsCommandRunner that also counts the commands it ran, by binary."""

    def __init__(self, netns: str) -> None:
        from pyfelix.agent.shims.cmd import NetnsCommandRunner

        self._inner = NetnsCommandRunner(netns)
        self.netns = netns
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv, *, input=None, check=True, timeout=None):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(argv))
        return self._inner.run(argv, input=input, check=check, timeout=timeout)

    def count(self, suffix: str) -> int:
        return sum(1 for c in self.calls if c[0].endswith(suffix) or c[-1] == suffix)

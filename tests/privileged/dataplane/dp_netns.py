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
    if shutil.which("iptables-legacy-save"):
        snap["iptables-legacy"] = sh("iptables-legacy-save", check=False)
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

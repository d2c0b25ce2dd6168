"""Command-runner shim: run a program (iptables-restore, ipset...) inside a network namespace.

Role: the only place the iptables/ipset dataplane starts processes. `NetnsCommandRunner(netns)`
runs `nsenter --net=<netns path> -- argv...` when a namespace is given (a name under
/run/netns, or an absolute path such as /proc/<pid>/ns/net), else argv as is (the agent's
own namespace, i.e. the node in production).

Outputs: `CommandResult`; a non-zero exit raises `CommandError` naming the command, exit code
and stderr (unless `check=False`). A missing binary raises `CommandError` too, never
FileNotFoundError escaping from deep inside a manager.

Invariant: the runner never adds a namespace-less fallback: if the namespace path does not
exist the command fails (so a test can never touch the machine's root namespace by accident).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

NETNS_RUN_DIR = "/run/netns"


def netns_path(netns: str) -> str:
    """A namespace name (under /run/netns) or an absolute path -> the path to its nsfs file."""
    if not netns:
        raise ValueError("netns: empty namespace name")
    if netns.startswith("/"):
        return netns
    if "/" in netns or netns in (".", ".."):
        raise ValueError(f"netns: invalid namespace name {netns!r}")
    return os.path.join(NETNS_RUN_DIR, netns)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(RuntimeError):
    """A command failed; `str()` names the command, where it ran, its exit code and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, netns: str | None):
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.netns = netns
        where = f" in netns {netns}" if netns else ""
        super().__init__(
            f"command {' '.join(self.argv)!r}{where} failed with exit code {returncode}: "
            f"{stderr.strip()[:2000]}"
        )


class CommandRunner(Protocol):
    netns: str | None

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult: ...


class NetnsCommandRunner:
    """Runs commands in one network namespace (or the current one when netns is None)."""

    def __init__(self, netns: str | None = None, *, default_timeout: float = 60.0) -> None:
        self.netns = netns
        self._prefix: tuple[str, ...] = (
            ("nsenter", f"--net={netns_path(netns)}", "--") if netns else ()
        )
        self._default_timeout = default_timeout

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        full = (*self._prefix, *argv)
        try:
            proc = subprocess.run(
                full,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout or self._default_timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise CommandError(argv, 127, f"not found: {exc.filename}", self.netns) from exc
        except subprocess.TimeoutExpired as exc:
            raise CommandError(argv, -1, f"timed out after {exc.timeout} s", self.netns) from exc
        result = CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, proc.stderr or proc.stdout, self.netns)
        return result

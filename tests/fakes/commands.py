"""FakeCommands: a CommandRunner that routes iptables-* and ipset commands to the fakes.

One FakeIptables per backend ("nft", "legacy"); plain `iptables-save/-restore` go to the
`default_backend`. `calls` records every argv, so a test can assert that nothing ran.
Failures come back as `CommandError`, exactly as from the real runner.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.shims.cmd import CommandError, CommandResult
from tests.fakes.ipset import FakeIpset, FakeIpsetError
from tests.fakes.iptables import FakeIptables, FakeIptablesError


class FakeCommands:
    def __init__(self, *, default_backend: str = "nft") -> None:
        self.netns: str | None = "fake"
        self.ipset = FakeIpset()
        self.backends = {
            "nft": FakeIptables(set_exists=self.ipset.exists),
            "legacy": FakeIptables(set_exists=self.ipset.exists),
        }
        self.ipset.is_referenced = lambda name: any(
            t.references_set(name) for t in self.backends.values()
        )
        self.default_backend = default_backend
        self.calls: list[tuple[str, ...]] = []

    @property
    def iptables(self) -> FakeIptables:
        return self.backends[self.default_backend]

    def _backend(self, binary: str) -> FakeIptables:
        for name, table in self.backends.items():
            if binary.startswith(f"iptables-{name}-"):
                return table
        return self.iptables

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        binary, args = argv[0], argv[1:]
        try:
            if binary.startswith("iptables") and binary.endswith("-save"):
                table = args[args.index("-t") + 1] if "-t" in args else None
                out = self._backend(binary).save(table)
            elif binary.startswith("iptables") and binary.endswith("-restore"):
                self._backend(binary).restore(input or "", noflush="--noflush" in args)
                out = ""
            elif binary == "ipset" and args == ("save",):
                out = self.ipset.save()
            elif binary == "ipset" and args[-1:] == ("restore",):
                self.ipset.restore(input or "", exist="-exist" in args)
                out = ""
            else:
                raise CommandError(argv, 127, f"fake: no such command {binary}", self.netns)
        except (FakeIptablesError, FakeIpsetError) as exc:
            if check:
                raise CommandError(argv, 1, str(exc), self.netns) from exc
            return CommandResult(argv, 1, "", str(exc))
        return CommandResult(argv, 0, out, "")

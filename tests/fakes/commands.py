"""FakeCommands: a CommandRunner that routes iptables-*, ip6tables-* and ipset commands to
the fakes.

One FakeIptables per backend ("nft", "legacy") and family: `backends` (iptables) and
`backends6` (ip6tables); plain `iptables-save/-restore` (`ip6tables-...`) go to the
`default_backend`. `calls` records every argv, so a test can assert that nothing ran.
Failures come back as `CommandError`, exactly as from the real runner. `ip6tables_missing`
makes every ip6tables binary "not found" (exit 127); `ipv6_kernel = False` makes them fail
as on a kernel without IPv6.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyfelix.agent.shims.cmd import CommandError, CommandResult
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
        self.backends6 = {
            "nft": FakeIptables(set_exists=self.ipset.exists),
            "legacy": FakeIptables(set_exists=self.ipset.exists),
        }
        self.ipset.is_referenced = lambda name: any(
            t.references_set(name) for t in [*self.backends.values(), *self.backends6.values()]
        )
        self.default_backend = default_backend
        self.calls: list[tuple[str, ...]] = []
        self.ip6tables_missing = False
        self.ipv6_kernel = True

    @property
    def iptables(self) -> FakeIptables:
        return self.backends[self.default_backend]

    @property
    def iptables6(self) -> FakeIptables:
        return self.backends6[self.default_backend]

    def _backend(self, binary: str) -> FakeIptables:
        family, backends = ("ip6tables", self.backends6) if binary.startswith("ip6tables") \
            else ("iptables", self.backends)
        for name, table in backends.items():
            if binary.startswith(f"{family}-{name}-"):
                return table
        return backends[self.default_backend]

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
        if binary.startswith("ip6tables"):
            if self.ip6tables_missing:
                raise CommandError(argv, 127, f"not found: {binary}", self.netns)
            if not self.ipv6_kernel:
                error = (f"{binary}: can't initialize ip6tables table `filter': Address family "
                         "not supported by protocol\nPerhaps ip6tables or your kernel needs to "
                         "be upgraded.")
                if check:
                    raise CommandError(argv, 3, error, self.netns)
                return CommandResult(argv, 3, "", error)
        try:
            if binary.startswith(("iptables", "ip6tables")) and binary.endswith("-save"):
                table = args[args.index("-t") + 1] if "-t" in args else None
                out = self._backend(binary).save(table)
            elif binary.startswith(("iptables", "ip6tables")) and binary.endswith("-restore"):
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

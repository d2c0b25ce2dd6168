"""FakeIpset: the IP sets of one namespace, programmed by parsing `ipset restore` input.

Like the kernel's ipset 7: restore applies line by line and stops at the first error (the
lines before it stay applied, so callers must not assume atomicity); `-exist` ignores
re-creating an identical set, adding a present member, deleting a missing member or
destroying a missing set; destroying a set referenced by an iptables rule fails
(`is_referenced`, wired to FakeIptables); hash:net members print /32 hosts without "/32".
"""

from __future__ import annotations

from collections.abc import Callable


class FakeIpsetError(Exception):
    pass


def _kernel_member(member: str) -> str:
    net, _, port = member.partition(",")
    if net.endswith("/32"):
        net = net[:-3]
    if net.endswith("/0"):
        raise FakeIpsetError("The value of the CIDR parameter of the IP address is invalid")
    return f"{net},{port}" if port else net


class FakeIpset:
    def __init__(self, *, is_referenced: Callable[[str], bool] | None = None) -> None:
        self.sets: dict[str, tuple[str, set[str]]] = {}
        self.restore_calls = 0
        self.save_calls = 0
        self._fail = 0
        self.is_referenced = is_referenced or (lambda name: False)

    def fail_next(self, count: int = 1) -> None:
        self._fail += count

    def exists(self, name: str) -> bool:
        return name in self.sets

    def members(self, name: str) -> set[str]:
        return set(self.sets[name][1])

    def save(self) -> str:
        self.save_calls += 1
        lines = []
        for name in sorted(self.sets):
            kind, members = self.sets[name]
            lines.append(f"create {name} {kind} family inet hashsize 1024 maxelem 65536")
            lines += [f"add {name} {m}" for m in sorted(members)]
        return "\n".join(lines) + ("\n" if lines else "")

    def restore(self, text: str, *, exist: bool) -> None:
        self.restore_calls += 1
        if self._fail:
            self._fail -= 1
            raise FakeIpsetError("ipset restore: injected failure")
        for number, line in enumerate(text.splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            try:
                self._line(parts, exist)
            except FakeIpsetError as exc:
                raise FakeIpsetError(f"Error in line {number}: {exc}") from exc

    def _line(self, parts: list[str], exist: bool) -> None:
        op, name = parts[0], parts[1]
        if op == "create":
            kind = parts[2]
            if name in self.sets:
                if exist and self.sets[name][0] == kind:
                    return
                raise FakeIpsetError("Set cannot be created: set with the same name already "
                                     "exists")
            self.sets[name] = (kind, set())
            return
        if name not in self.sets:
            if op == "destroy" and exist:
                return
            raise FakeIpsetError("The set with the given name does not exist")
        kind, members = self.sets[name]
        if op == "add":
            member = _kernel_member(parts[2])
            if member in members and not exist:
                raise FakeIpsetError("Element cannot be added to the set: it's already added")
            members.add(member)
        elif op == "del":
            member = _kernel_member(parts[2])
            if member not in members and not exist:
                raise FakeIpsetError("Element cannot be deleted from the set: it's not added")
            members.discard(member)
        elif op == "destroy":
            if self.is_referenced(name):
                raise FakeIpsetError("Set cannot be destroyed: it is in use by a kernel "
                                     "component")
            del self.sets[name]
        elif op == "flush":
            members.clear()
        else:
            raise FakeIpsetError(f"unknown command {op}")

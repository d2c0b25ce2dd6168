"""FakeSysctls: /proc/sys of an imaginary namespace; per-interface entries exist only while
the interface does (`add_interface` / `remove_interface`), like the kernel's conf/<iface> dirs.
Writes to a missing entry fail with FileNotFoundError; `fail_next` fails the next writes.
`writes` records every successful write, for "nothing written" assertions.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping

_IPV4_CONF = ("rp_filter", "proxy_arp", "forwarding", "route_localnet")
_IPV6_CONF = ("accept_ra", "forwarding", "disable_ipv6")


class FakeSysctls:
    def __init__(self, *, ipv6: bool = True) -> None:
        self.ipv6 = ipv6
        self.values: dict[str, str] = {"net/ipv4/ip_forward": "0"}
        self.writes: list[tuple[str, str]] = []
        self._failures = 0
        for iface in ("all", "default", "lo"):
            self.add_interface(iface)

    def add_interface(self, name: str) -> None:
        for key in _IPV4_CONF:
            self.values[f"net/ipv4/conf/{name}/{key}"] = "0"
        self.values[f"net/ipv4/neigh/{name}/proxy_delay"] = "80"
        if self.ipv6:
            for key in _IPV6_CONF:
                self.values[f"net/ipv6/conf/{name}/{key}"] = "1" if key == "accept_ra" else "0"

    def remove_interface(self, name: str) -> None:
        for path in [p for p in self.values if f"/{name}/" in p]:
            del self.values[path]

    def fail_next(self, count: int = 1) -> None:
        self._failures += count

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        return {path: self.values.get(path) for path in paths}

    def write_many(self, values: Mapping[str, str]) -> dict[str, OSError]:
        errors: dict[str, OSError] = {}
        for path, value in values.items():
            if self._failures:
                self._failures -= 1
                errors[path] = OSError(errno.EBUSY, f"injected failure writing {path}")
            elif path not in self.values:
                errors[path] = FileNotFoundError(errno.ENOENT, f"no such sysctl {path}")
            else:
                self.values[path] = value
                self.writes.append((path, value))
        return errors

    def close(self) -> None:
        return None

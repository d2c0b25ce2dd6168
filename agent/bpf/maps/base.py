"""What every pyfelix BPF map module shares: parameters, a handle on a pinned map, a fake.

Role: each module in `agent.bpf.maps` describes ONE map of bpf/include/*.h with a
`MapParams` (name, type, ctypes key/value, default size, layout version) and helpers to
encode/decode entries. This module gives them:
- `MapParams`: pin name `<name>_v<version>` (the C header pins the same name; a layout
  change bumps the version in both, so an old pinned map is never read with a new layout);
- `BpfMap`: a map opened from its pin with raw bpf() syscalls (`agent.bpf.syscall`), no BCC:
  lookup/update/delete, iteration, batched reads/writes where the map type has them;
- `FakeMap`: the same API over a dict, with `max_entries` enforced, for manager unit tests;
- `MapFullError`: an update the map had no room for, naming the map.

Keys and values cross this API as `bytes` (exactly key_size / value_size long; for per-CPU
maps a value is one slot per possible CPU, each rounded up to 8 bytes): bytes compare and
hash, so desired-vs-actual diffs are plain dict comparisons.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import ipaddress
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.syscall import BpfError


class MapType(enum.IntEnum):
    HASH = 1
    ARRAY = 2
    PROG_ARRAY = 3
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    LRU_HASH = 9
    LRU_PERCPU_HASH = 10
    LPM_TRIE = 11


PERCPU_TYPES = frozenset({MapType.PERCPU_HASH, MapType.PERCPU_ARRAY, MapType.LRU_PERCPU_HASH})
ARRAY_TYPES = frozenset({MapType.ARRAY, MapType.PERCPU_ARRAY})
BATCH_TYPES = frozenset(
    {MapType.HASH, MapType.PERCPU_HASH, MapType.LRU_HASH, MapType.LRU_PERCPU_HASH,
     MapType.ARRAY, MapType.PERCPU_ARRAY}
)
# errnos an update returns when the map has no room: hash E2BIG, LPM trie ENOSPC, ENOMEM
MAP_FULL_ERRNOS = frozenset({errno.E2BIG, errno.ENOSPC, errno.ENOMEM})


class MapFullError(RuntimeError):
    """An update did not fit: the named map is at max_entries (or out of memory)."""

    def __init__(self, map_name: str, max_entries: int, detail: str = "") -> None:
        self.map_name = map_name
        self.max_entries = max_entries
        msg = f"BPF map {map_name!r} is full (max_entries={max_entries})"
        super().__init__(msg + (f": {detail}" if detail else ""))


class MapLayoutError(RuntimeError):
    """A pinned map's kernel parameters differ from what this code expects."""


@dataclass(frozen=True)
class MapParams:
    """One map's identity and layout. `name` is also the C variable name in bpf/include."""

    name: str
    map_type: MapType
    key_type: type[ctypes._SimpleCData] | type[ctypes.Structure]
    value_type: type[ctypes._SimpleCData] | type[ctypes.Structure]
    max_entries: int  # default; the loader may override it (-D<NAME>_MAX_ENTRIES)
    version: int
    flags: int = 0
    header: str = ""  # bpf/include file that declares it
    sized_like: str = ""  # another map whose size this one always has (same id space)

    @property
    def key_size(self) -> int:
        return ctypes.sizeof(self.key_type)

    @property
    def value_size(self) -> int:
        return ctypes.sizeof(self.value_type)

    @property
    def pin_name(self) -> str:
        return f"{self.name}_v{self.version}"

    @property
    def size_macro(self) -> str:
        """The C macro that sizes this map."""
        return f"{self.name.upper()}_MAX_ENTRIES"

    @property
    def percpu(self) -> bool:
        return self.map_type in PERCPU_TYPES

    def pin_path(self, pin_dir: str | os.PathLike[str]) -> str:
        return os.path.join(os.fspath(pin_dir), self.pin_name)


# --- encoding helpers shared by the map modules -------------------------------------------


def ip_to_be32(addr: str | ipaddress.IPv4Address) -> int:
    """An IPv4 address as the u32 whose memory holds the address in network byte order."""
    packed = ipaddress.IPv4Address(addr).packed
    return int.from_bytes(packed, sys.byteorder)


def be32_to_ip(value: int) -> str:
    return str(ipaddress.IPv4Address(value.to_bytes(4, sys.byteorder)))


class PfAddr(ctypes.Structure):
    """must match struct pf_addr in bpf/include/common.h: 16 bytes, network order (IPv4 in
    the first 4, the rest 0)"""

    _fields_ = [("w", ctypes.c_uint32 * 4)]


def addr16(addr: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, bytes]:
    """(family 4 or 6, the 16 bytes of a `struct pf_addr`: network order, an IPv4 address
    in the first 4 bytes and zeros after)."""
    ip = ipaddress.ip_address(addr)
    return ip.version, ip.packed.ljust(16, b"\0")


def addr16_to_ip(family: int, raw: bytes) -> str:
    """The address a `struct pf_addr` of `family` holds."""
    if family == 6:
        return str(ipaddress.IPv6Address(raw[:16]))
    return str(ipaddress.IPv4Address(raw[:4]))


def net16(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, bytes]:
    """(family, pf_addr bytes of the network address) of a prefix."""
    return net.version, net.network_address.packed.ljust(16, b"\0")


def parse_net(text: str | ipaddress.IPv4Network | ipaddress.IPv6Network
              ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR (or address) of either family, host bits cleared. Raises ValueError."""
    if isinstance(text, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return text
    return ipaddress.ip_network(text, strict=False)


def net_sort_key(text: str) -> tuple[int, int, int]:
    """Sorts CIDR strings of both families: IPv4 first, then by address and length."""
    net = ipaddress.ip_network(text, strict=False)
    return net.version, int(net.network_address), net.prefixlen


def to_bytes(obj: ctypes.Structure | ctypes._SimpleCData) -> bytes:
    return bytes(obj)  # type: ignore[arg-type]


def from_bytes(ctype: type, raw: bytes) -> Any:
    if len(raw) != ctypes.sizeof(ctype):
        raise ValueError(
            f"{ctype.__name__}: expected {ctypes.sizeof(ctype)} bytes, got {len(raw)}"
        )
    return ctype.from_buffer_copy(raw)


def percpu_slots(params: MapParams, raw: bytes, ncpus: int) -> list[bytes]:
    """Split a per-CPU value blob into one value_size slot per CPU."""
    stride = (params.value_size + 7) // 8 * 8
    return [raw[i * stride: i * stride + params.value_size] for i in range(ncpus)]


# --- a map handle ----------------------------------------------------------------------------


class BpfMap:
    """A kernel map opened by fd (usually from its pin). Not thread-safe; one per user."""

    def __init__(self, params: MapParams, fd: int, *, max_entries: int | None = None) -> None:
        self.params = params
        self.fd = fd
        self.max_entries = max_entries if max_entries is not None else params.max_entries
        self.ncpus = syscall.possible_cpus() if params.percpu else 1
        stride = (params.value_size + 7) // 8 * 8
        self.value_blob_size = stride * self.ncpus if params.percpu else params.value_size

    @classmethod
    def open_pinned(cls, params: MapParams, pin_dir: str | os.PathLike[str]) -> BpfMap:
        """Open `<pin_dir>/<name>_v<version>` and check its layout against params."""
        path = params.pin_path(pin_dir)
        try:
            fd = syscall.obj_get(path)
        except BpfError as e:
            raise BpfError(e.errno, f"cannot open pinned BPF map {params.name!r} at {path}: "
                           f"{os.strerror(e.errno or 0)}") from e
        info = syscall.map_info(fd)
        problem = layout_mismatch(params, info)
        if problem:
            os.close(fd)
            raise MapLayoutError(f"pinned BPF map {params.name!r} at {path}: {problem}")
        return cls(params, fd, max_entries=info.max_entries)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> BpfMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # single elements

    def _check(self, key: bytes, value: bytes | None = None) -> None:
        if len(key) != self.params.key_size:
            raise ValueError(
                f"map {self.params.name!r}: key is {len(key)} bytes, expected "
                f"{self.params.key_size}"
            )
        if value is not None and len(value) != self.value_blob_size:
            raise ValueError(
                f"map {self.params.name!r}: value is {len(value)} bytes, expected "
                f"{self.value_blob_size}"
            )

    def lookup(self, key: bytes) -> bytes | None:
        self._check(key)
        return syscall.map_lookup(self.fd, key, self.value_blob_size, self.params.name)

    def update(self, key: bytes, value: bytes, flags: int = syscall.BPF_ANY) -> None:
        self._check(key, value)
        try:
            syscall.map_update(self.fd, key, value, flags, self.params.name)
        except BpfError as e:
            if e.errno in MAP_FULL_ERRNOS:
                raise MapFullError(self.params.name, self.max_entries, str(e)) from e
            raise

    def delete(self, key: bytes) -> bool:
        self._check(key)
        return syscall.map_delete(self.fd, key, self.params.name)

    # many elements

    def iter_keys(self) -> Iterator[bytes]:
        """Every key (GET_NEXT_KEY walk). Deleting while iterating may restart a hash walk:
        collect keys first."""
        key = None
        while True:
            key = syscall.map_next_key(self.fd, key, self.params.key_size, self.params.name)
            if key is None:
                return
            yield key

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every (key, value): one batch syscall per 4096 entries where supported."""
        if self.params.map_type in BATCH_TYPES:
            try:
                return syscall.map_lookup_batch(
                    self.fd, self.params.key_size, self.value_blob_size, what=self.params.name
                )
            except BpfError as e:
                if not syscall.batch_unsupported(e):
                    raise
        out = []
        for key in list(self.iter_keys()):
            value = self.lookup(key)
            if value is not None:
                out.append((key, value))
        return out

    def update_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Write many entries, batched where the map type allows."""
        todo = list(items)
        for key, value in todo:
            self._check(key, value)
        if self.params.map_type in BATCH_TYPES and todo:
            try:
                syscall.map_update_batch(
                    self.fd, todo, self.params.key_size, self.value_blob_size,
                    what=self.params.name,
                )
                return
            except BpfError as e:
                done = getattr(e, "done", 0)
                if e.errno in MAP_FULL_ERRNOS:
                    raise MapFullError(self.params.name, self.max_entries, str(e)) from e
                if not syscall.batch_unsupported(e):
                    raise
                todo = todo[done:]
        try:
            syscall.map_update_each(self.fd, todo, self.params.key_size, self.value_blob_size,
                                    what=self.params.name)
        except BpfError as e:
            if e.errno in MAP_FULL_ERRNOS:
                raise MapFullError(self.params.name, self.max_entries, str(e)) from e
            raise

    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete keys (absent ones are ignored). Returns how many existed."""
        todo = list(keys)
        if self.params.map_type in ARRAY_TYPES:
            raise ValueError(f"map {self.params.name!r}: array entries cannot be deleted")
        for key in todo:
            self._check(key)
        deleted = 0
        if self.params.map_type in BATCH_TYPES:
            # BPF_MAP_DELETE_BATCH stops at the first absent key (ENOENT, `done` deleted
            # before it): skip that key and go on with the rest.
            while todo:
                try:
                    deleted += syscall.map_delete_batch(
                        self.fd, todo, self.params.key_size, what=self.params.name)
                    return deleted
                except BpfError as e:
                    done = getattr(e, "done", 0)
                    if e.errno == errno.ENOENT:
                        deleted += done
                        todo = todo[done + 1:]
                        continue
                    if not syscall.batch_unsupported(e):
                        raise
                    deleted += done
                    todo = todo[done:]
                    break
        return deleted + syscall.map_delete_each(self.fd, todo, self.params.key_size,
                                                 what=self.params.name)

    def clear(self) -> int:
        """Remove every entry (arrays: write zeros). Returns the number of entries touched."""
        if self.params.map_type in ARRAY_TYPES:
            zero = bytes(self.value_blob_size)
            keys = list(self.iter_keys())
            self.update_many((k, zero) for k in keys)
            return len(keys)
        return self.delete_many(list(self.iter_keys()))


def layout_mismatch(params: MapParams, info: syscall.MapInfo) -> str:
    """Why a kernel map does not fit params ("" if it does). max_entries is not compared:
    the size is a deployment setting, checked by the loader against its own config."""
    problems = []
    if info.map_type != params.map_type:
        problems.append(f"type {info.map_type} != {int(params.map_type)}")
    if info.key_size != params.key_size:
        problems.append(f"key_size {info.key_size} != {params.key_size}")
    if info.value_size != params.value_size:
        problems.append(f"value_size {info.value_size} != {params.value_size}")
    return ", ".join(problems)


# --- a fake for unit tests ----------------------------------------------------------------------


class FakeMap:
    """A dict-backed stand-in for BpfMap: same methods, exact-match keys (no LPM matching),
    max_entries enforced with MapFullError, and `fail_next` to inject one error."""

    def __init__(self, params: MapParams, *, max_entries: int | None = None) -> None:
        self.params = params
        self.max_entries = max_entries if max_entries is not None else params.max_entries
        self.ncpus = 1
        self.value_blob_size = (
            (params.value_size + 7) // 8 * 8 if params.percpu else params.value_size
        )
        self.data: dict[bytes, bytes] = {}
        self.fail_next: Exception | None = None
        self.writes = 0  # updates + deletes, to assert "nothing written"

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    def lookup(self, key: bytes) -> bytes | None:
        self._maybe_fail()
        return self.data.get(key)

    def update(self, key: bytes, value: bytes, flags: int = syscall.BPF_ANY) -> None:
        self._maybe_fail()
        if len(key) != self.params.key_size or len(value) != self.value_blob_size:
            raise ValueError(f"map {self.params.name!r}: bad key/value size")
        if key not in self.data and len(self.data) >= self.max_entries:
            raise MapFullError(self.params.name, self.max_entries)
        self.data[key] = value
        self.writes += 1

    def delete(self, key: bytes) -> bool:
        self._maybe_fail()
        self.writes += 1
        return self.data.pop(key, None) is not None

    def iter_keys(self) -> Iterator[bytes]:
        return iter(list(self.data))

    def items(self) -> list[tuple[bytes, bytes]]:
        self._maybe_fail()
        return list(self.data.items())

    def update_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        for key, value in items:
            self.update(key, value)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        return sum(self.delete(k) for k in list(keys))

    def clear(self) -> int:
        n = len(self.data)
        self.data.clear()
        return n

    def close(self) -> None:
        pass

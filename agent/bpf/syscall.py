"""The raw `bpf()` system call through ctypes: map access, pinning, info and test runs.

Role: the one place that knows `union bpf_attr` layouts and command numbers, so that the CLI
and the managers can read and write pinned maps WITHOUT compiling anything with BCC, and
tests can run programs with BPF_PROG_TEST_RUN.

Inputs are file descriptors and byte strings; outputs are byte strings, ints and small
dataclasses. Every failure raises `BpfError` (an `OSError` subclass carrying errno) whose
message names the command and, where known, the map or path; "map full" errnos on updates
become `MapFullError` (raised by `agent.bpf.maps.base`, which knows the map's name).

Easy to get wrong:
- x86-64 syscall number 321 (aarch64: 280); the attr struct is passed with its real size.
- per-CPU maps read and write round_up(value_size, 8) * possible_cpus bytes per entry.
- batch operations exist for hash/LRU/array maps, not for LPM tries or prog arrays
  (the kernel answers EINVAL/ENOTSUPP); callers fall back to one-by-one.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import platform
from dataclasses import dataclass

# --- constants (include/uapi/linux/bpf.h) ---------------------------------------------------

SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)

BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_TEST_RUN = 10
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_UPDATE_BATCH = 26
BPF_MAP_DELETE_BATCH = 27

BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

BPF_F_NO_PREALLOC = 1

ENOTSUPP = 524  # kernel-internal errno some map types return for unsupported batch ops


class BpfError(OSError):
    """A bpf() command failed. `errno` is set; the message names the command and object."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    ret = _libc.syscall(SYS_BPF, ctypes.c_int(cmd), ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"bpf({what}): {os.strerror(err)}")
    return int(ret)


def _addr(buf: ctypes.Array | None) -> int:
    return ctypes.addressof(buf) if buf is not None else 0


# --- attr layouts ----------------------------------------------------------------------------


class _MapCreateAttr(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
    ]


class _MapElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # also next_key
        ("flags", ctypes.c_uint64),
    ]


class _MapBatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64),
        ("out_batch", ctypes.c_uint64),
        ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


class _ObjAttr(ctypes.Structure):
    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
        ("path_fd", ctypes.c_int32),
    ]


class _InfoAttr(ctypes.Structure):
    _fields_ = [
        ("bpf_fd", ctypes.c_uint32),
        ("info_len", ctypes.c_uint32),
        ("info", ctypes.c_uint64),
    ]


class _MapInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


class _ProgInfo(ctypes.Structure):
    """The head of struct bpf_prog_info (the kernel fills only what info_len covers)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
    ]


class _ProgLoadAttr(ctypes.Structure):
    """The head of the BPF_PROG_LOAD attributes, up to expected_attach_type (cgroup
    sock_addr programs need it; the kernel zero-fills the rest)."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


class _GetByIdAttr(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint32),
        ("next_id", ctypes.c_uint32),
        ("open_flags", ctypes.c_uint32),
    ]


class _TestRunAttr(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("data_in", ctypes.c_uint64),
        ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32),
        ("duration", ctypes.c_uint32),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_uint64),
        ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


# --- objects -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapInfo:
    """What the kernel says about a map (BPF_OBJ_GET_INFO_BY_FD)."""

    map_type: int
    map_id: int
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int
    name: str


def obj_get(path: str) -> int:
    """Open a pinned object; returns a new fd (caller closes it)."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=ctypes.addressof(p))
    return _bpf(BPF_OBJ_GET, attr, f"OBJ_GET {path}")


def obj_pin(fd: int, path: str) -> None:
    p = ctypes.create_string_buffer(os.fsencode(path))
    attr = _ObjAttr(pathname=ctypes.addressof(p), bpf_fd=fd)
    _bpf(BPF_OBJ_PIN, attr, f"OBJ_PIN {path}")


BPF_PROG_TYPE_SCHED_CLS = 3
# `r0 = 0; exit`: a tc program that returns TC_ACT_OK and does nothing else
_RETURN_ZERO = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


def load_return_zero_tc_prog(name: str = "pf_calibrate") -> int:
    """Load the smallest tc program (returns 0); a fd the caller closes. Benchmarks run it
    with BPF_PROG_TEST_RUN to measure what the harness itself costs on this machine."""
    return prog_load(BPF_PROG_TYPE_SCHED_CLS, _RETURN_ZERO, name)


VERIFIER_LOG_BYTES = 1 << 20  # the tail of the verifier's log kept for an error message


def prog_load(prog_type: int, insns: bytes, name: str, *, expected_attach_type: int = 0,
              license_: str = "GPL", kern_version: int = 0) -> int:
    """Load a program from its instructions (map fds already in its ld_imm64 slots); a fd
    the caller closes. A rejection is retried once with the verifier's log, whose last
    lines the BpfError carries."""
    if len(insns) % 8:
        raise ValueError(f"program {name}: {len(insns)} bytes is not whole instructions")
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license_.encode())

    def attempt(log: ctypes.Array | None) -> int:
        attr = _ProgLoadAttr(
            prog_type=prog_type, insn_cnt=len(insns) // 8, insns=_addr(code),
            license=_addr(lic), kern_version=kern_version, prog_name=name.encode()[:15],
            expected_attach_type=expected_attach_type,
            log_level=1 if log is not None else 0,
            log_size=len(log) if log is not None else 0, log_buf=_addr(log))
        return _bpf(BPF_PROG_LOAD, attr, f"PROG_LOAD {name}")

    try:
        return attempt(None)
    except BpfError as first:
        log = ctypes.create_string_buffer(VERIFIER_LOG_BYTES)
        try:
            return attempt(log)
        except BpfError as e:
            tail = "\n".join(log.value.decode(errors="replace").splitlines()[-8:])
            raise BpfError(e.errno, f"{e.strerror}; verifier: {tail}") from first


def map_create(
    map_type: int, key_size: int, value_size: int, max_entries: int, flags: int = 0,
    name: str = "",
) -> int:
    """Create a map (tests, tools, and the loader's build cache, agent.bpf.build_cache)."""
    attr = _MapCreateAttr(
        map_type=map_type, key_size=key_size, value_size=value_size,
        max_entries=max_entries, map_flags=flags, map_name=name.encode()[:15],
    )
    return _bpf(BPF_MAP_CREATE, attr, f"MAP_CREATE {name or map_type}")


def map_info(fd: int) -> MapInfo:
    info = _MapInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "OBJ_GET_INFO_BY_FD")
    return MapInfo(
        map_type=info.type, map_id=info.id, key_size=info.key_size,
        value_size=info.value_size, max_entries=info.max_entries, map_flags=info.map_flags,
        name=info.name.decode(errors="replace"),
    )


@dataclass(frozen=True)
class ProgInfo:
    """What the kernel says about a loaded program: its id (unique while it is loaded; a
    rebuild gets a new one), type, tag (hash of its instructions) and (truncated) name."""

    prog_id: int
    prog_type: int
    tag: str
    name: str


def prog_info(fd: int) -> ProgInfo:
    info = _ProgInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "OBJ_GET_INFO_BY_FD (program)")
    return ProgInfo(prog_id=info.id, prog_type=info.type, tag=bytes(info.tag).hex(),
                    name=info.name.decode(errors="replace"))


def prog_info_by_id(prog_id: int) -> ProgInfo | None:
    """Info of the loaded program with this id, or None if no such program is loaded."""
    attr = _GetByIdAttr(id=prog_id)
    try:
        fd = _bpf(BPF_PROG_GET_FD_BY_ID, attr, f"PROG_GET_FD_BY_ID {prog_id}")
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def possible_cpus() -> int:
    """Number of possible CPUs, which sizes per-CPU map values (not os.cpu_count())."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    total = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        total += (int(hi) if hi else int(lo)) - int(lo) + 1
    return total


# --- elements ------------------------------------------------------------------------------------


def map_lookup(fd: int, key: bytes, value_size: int, what: str = "map") -> bytes | None:
    """The value for key, or None if absent."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    attr = _MapElemAttr(map_fd=fd, key=_addr(k), value=_addr(v))
    try:
        _bpf(BPF_MAP_LOOKUP_ELEM, attr, f"MAP_LOOKUP_ELEM {what}")
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    return v.raw


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY, what: str = "map") -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    attr = _MapElemAttr(map_fd=fd, key=_addr(k), value=_addr(v), flags=flags)
    _bpf(BPF_MAP_UPDATE_ELEM, attr, f"MAP_UPDATE_ELEM {what}")


def map_update_each(fd: int, items: list[tuple[bytes, bytes]], key_size: int, value_size: int,
                    flags: int = BPF_ANY, what: str = "map") -> int:
    """One BPF_MAP_UPDATE_ELEM per item, reusing one key, value and attr buffer (for map
    types without batch updates, such as LPM tries: a third of the Python cost of
    map_update per element). On error the raised BpfError has `.done` = items written."""
    k = ctypes.create_string_buffer(key_size)
    v = ctypes.create_string_buffer(value_size)
    attr = _MapElemAttr(map_fd=fd, key=_addr(k), value=_addr(v), flags=flags)
    size = ctypes.sizeof(attr)
    ref = ctypes.byref(attr)
    cmd = ctypes.c_int(BPF_MAP_UPDATE_ELEM)
    syscall = _libc.syscall
    last_value = None
    for done, (key, value) in enumerate(items):
        ctypes.memmove(k, key, key_size)
        if value is not last_value:
            ctypes.memmove(v, value, value_size)
            last_value = value
        if syscall(SYS_BPF, cmd, ref, size) < 0:
            err = ctypes.get_errno()
            exc = BpfError(err, f"bpf(MAP_UPDATE_ELEM {what}): {os.strerror(err)}")
            exc.done = done  # type: ignore[attr-defined]
            raise exc
    return len(items)


def map_delete_each(fd: int, keys: list[bytes], key_size: int, what: str = "map") -> int:
    """One BPF_MAP_DELETE_ELEM per key, reusing the buffers (map types without batch
    deletes); absent keys are skipped. Returns how many existed."""
    k = ctypes.create_string_buffer(key_size)
    attr = _MapElemAttr(map_fd=fd, key=_addr(k))
    size = ctypes.sizeof(attr)
    ref = ctypes.byref(attr)
    cmd = ctypes.c_int(BPF_MAP_DELETE_ELEM)
    syscall = _libc.syscall
    deleted = 0
    for key in keys:
        ctypes.memmove(k, key, key_size)
        if syscall(SYS_BPF, cmd, ref, size) < 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                continue
            raise BpfError(err, f"bpf(MAP_DELETE_ELEM {what}): {os.strerror(err)}")
        deleted += 1
    return deleted


def map_delete(fd: int, key: bytes, what: str = "map") -> bool:
    """Delete key; False if it was absent."""
    k = ctypes.create_string_buffer(key, len(key))
    attr = _MapElemAttr(map_fd=fd, key=_addr(k))
    try:
        _bpf(BPF_MAP_DELETE_ELEM, attr, f"MAP_DELETE_ELEM {what}")
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def map_next_key(fd: int, key: bytes | None, key_size: int, what: str = "map") -> bytes | None:
    """The key after `key` (the first key if None), or None at the end."""
    k = ctypes.create_string_buffer(key, len(key)) if key is not None else None
    nk = ctypes.create_string_buffer(key_size)
    attr = _MapElemAttr(map_fd=fd, key=_addr(k), value=_addr(nk))
    try:
        _bpf(BPF_MAP_GET_NEXT_KEY, attr, f"MAP_GET_NEXT_KEY {what}")
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    return nk.raw


def batch_unsupported(err: BpfError) -> bool:
    """Did a batch command fail because the map type has no batch operations?"""
    return err.errno in (errno.EINVAL, errno.ENOTSUP, ENOTSUPP)


def map_lookup_batch(
    fd: int, key_size: int, value_size: int, chunk: int = 4096, what: str = "map"
) -> list[tuple[bytes, bytes]]:
    """Every (key, value) with BPF_MAP_LOOKUP_BATCH; raises BpfError if unsupported."""
    out: list[tuple[bytes, bytes]] = []
    keys = ctypes.create_string_buffer(key_size * chunk)
    values = ctypes.create_string_buffer(value_size * chunk)
    # the batch token is opaque; 8 bytes is enough for hash (u32 bucket) and array (u32 index)
    in_tok = ctypes.create_string_buffer(max(8, key_size))
    out_tok = ctypes.create_string_buffer(max(8, key_size))
    first = True
    while True:
        attr = _MapBatchAttr(
            in_batch=0 if first else _addr(in_tok), out_batch=_addr(out_tok),
            keys=_addr(keys), values=_addr(values), count=chunk, map_fd=fd,
        )
        done = False
        try:
            _bpf(BPF_MAP_LOOKUP_BATCH, attr, f"MAP_LOOKUP_BATCH {what}")
        except BpfError as e:
            if e.errno != errno.ENOENT:
                raise
            done = True  # ENOENT: this was the last batch (count says how many it holds)
        n = attr.count
        raw_k, raw_v = keys.raw, values.raw
        for i in range(n):
            out.append(
                (raw_k[i * key_size:(i + 1) * key_size],
                 raw_v[i * value_size:(i + 1) * value_size])
            )
        if done:
            return out
        ctypes.memmove(in_tok, out_tok, len(out_tok))
        first = False


def map_update_batch(
    fd: int, items: list[tuple[bytes, bytes]], key_size: int, value_size: int,
    flags: int = BPF_ANY, what: str = "map",
) -> int:
    """Write items with BPF_MAP_UPDATE_BATCH. Returns how many were written; on error the
    raised BpfError has `.done` = the number written before the failure."""
    if not items:
        return 0
    keys = ctypes.create_string_buffer(b"".join(k for k, _ in items), key_size * len(items))
    values = ctypes.create_string_buffer(
        b"".join(v for _, v in items), value_size * len(items)
    )
    attr = _MapBatchAttr(
        keys=_addr(keys), values=_addr(values), count=len(items), map_fd=fd, elem_flags=flags
    )
    try:
        _bpf(BPF_MAP_UPDATE_BATCH, attr, f"MAP_UPDATE_BATCH {what}")
    except BpfError as e:
        e.done = attr.count  # type: ignore[attr-defined]
        raise
    return int(attr.count)


def map_delete_batch(fd: int, keys_list: list[bytes], key_size: int, what: str = "map") -> int:
    """Delete keys with BPF_MAP_DELETE_BATCH (every key must exist, else ENOENT)."""
    if not keys_list:
        return 0
    keys = ctypes.create_string_buffer(b"".join(keys_list), key_size * len(keys_list))
    attr = _MapBatchAttr(keys=_addr(keys), count=len(keys_list), map_fd=fd)
    try:
        _bpf(BPF_MAP_DELETE_BATCH, attr, f"MAP_DELETE_BATCH {what}")
    except BpfError as e:
        e.done = attr.count  # type: ignore[attr-defined]
        raise
    return int(attr.count)


# --- BPF_PROG_TEST_RUN --------------------------------------------------------------------------


@dataclass(frozen=True)
class TestRunOutput:
    """Result of BPF_PROG_TEST_RUN: the program's return value, the kernel's mean duration
    per repetition in ns, and the packet as the program left it."""

    __test__ = False  # not a pytest class

    retval: int
    duration_ns: int
    data_out: bytes


def prog_test_run(
    prog_fd: int, data: bytes, *, ctx: bytes | None = None, repeat: int = 1,
    data_out_size: int | None = None,
) -> TestRunOutput:
    """Run a loaded program once or `repeat` times on `data` (and `ctx`, e.g. a
    struct __sk_buff image). Runs in the calling thread's network namespace, which matters
    for the ifindex in ctx."""
    din = ctypes.create_string_buffer(data, len(data))
    out_size = data_out_size if data_out_size is not None else len(data) + 256
    dout = ctypes.create_string_buffer(out_size)
    cin = ctypes.create_string_buffer(ctx, len(ctx)) if ctx is not None else None
    attr = _TestRunAttr(
        prog_fd=prog_fd, data_size_in=len(data), data_size_out=out_size,
        data_in=_addr(din), data_out=_addr(dout), repeat=repeat,
        ctx_size_in=len(ctx) if ctx is not None else 0, ctx_in=_addr(cin),
    )
    _bpf(BPF_PROG_TEST_RUN, attr, "PROG_TEST_RUN")
    return TestRunOutput(
        retval=attr.retval, duration_ns=attr.duration, data_out=dout.raw[: attr.data_size_out]
    )


# --- cgroup attachments ----------------------------------------------------------------------

BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_QUERY = 16
BPF_F_ALLOW_OVERRIDE = 1


class CgroupAttachType(enum.IntEnum):
    """The bpf_attach_type values of the socket-address hooks (uapi linux/bpf.h)."""

    INET4_CONNECT = 10
    UDP4_SENDMSG = 14
    UDP4_RECVMSG = 19
    INET4_GETPEERNAME = 29


class _AttachAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("replace_bpf_fd", ctypes.c_uint32),
    ]


class _QueryAttr(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


def cgroup_attach(cgroup_fd: int, prog_fd: int, attach_type: int) -> None:
    """Attach a program to a cgroup (BPF_F_ALLOW_OVERRIDE: attaching again replaces it)."""
    attr = _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=attach_type,
                       attach_flags=BPF_F_ALLOW_OVERRIDE)
    _bpf(BPF_PROG_ATTACH, attr, f"PROG_ATTACH type {attach_type}")


def cgroup_detach(cgroup_fd: int, prog_fd: int, attach_type: int) -> None:
    attr = _AttachAttr(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=attach_type)
    _bpf(BPF_PROG_DETACH, attr, f"PROG_DETACH type {attach_type}")


def cgroup_query(cgroup_fd: int, attach_type: int, capacity: int = 64) -> list[int]:
    """Ids of the programs attached to the cgroup itself for `attach_type`."""
    ids = (ctypes.c_uint32 * capacity)()
    attr = _QueryAttr(target_fd=cgroup_fd, attach_type=attach_type,
                      prog_ids=ctypes.addressof(ids), prog_cnt=capacity)
    _bpf(BPF_PROG_QUERY, attr, f"PROG_QUERY type {attach_type}")
    return [int(ids[i]) for i in range(min(attr.prog_cnt, capacity))]


def prog_fd_by_id(prog_id: int) -> int | None:
    """A new fd for the loaded program with this id (the caller closes it), or None."""
    try:
        return _bpf(BPF_PROG_GET_FD_BY_ID, _GetByIdAttr(id=prog_id), f"PROG_GET_FD_BY_ID {prog_id}")
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return None
        raise

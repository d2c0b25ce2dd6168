"""Compile bpf/tc.c + bpf/xdp.c ONCE with BCC, adopting (or creating) the pinned maps.

Role: the only module that imports bcc. `load_dataplane(BuildConfig(pin_dir=...))` returns a
`LoadedDataplane` with program fds (to attach with pyroute2 / BCC) and `BpfMap` handles on
every data map (the same raw-syscall handles the CLI uses).

How the build works:
- BCC only rewrites map calls (`map.lookup(&k)`) in its MAIN file, so `assemble_source()`
  inlines every local `#include "x.h"` of tc.c and xdp.c into one text (each file once,
  with `#line` markers so compiler errors name the real file and line). System headers
  (`<uapi/...>`) are left to clang.
- Macros: PIN_DIR (where maps are pinned), PROG_ABI (a hash of the assembled source and
  flags: it names the prog array and walker scratch pins, which are private to one build),
  <MAP>_MAX_ENTRIES per map, POLICY_RULES_PER_PROG, CT_TIMEOUT_*, and PF_KTIME_COARSE when
  the running kernel has bpf_ktime_get_coarse_ns (5.11+; conntrack.h falls back to
  bpf_ktime_get_ns on older kernels, which the verifier would otherwise refuse).
- Every map is declared BPF_TABLE_PINNED: BCC opens the pin if it exists (so a restarted
  agent adopts the previous agent's maps and their contents) and creates + pins it if not.
  BCC does NOT check that an existing pin matches the declaration, so `prepare_pins()` does
  first: a pin with another type/key/value size/max_entries is unpinned (its contents are
  lost; the managers rewrite desired state) and reported in `LoadedDataplane.replaced_pins`.
- After loading, policy_progs[0] = calico_policy. The prog array is pinned too: pins hold
  the map's user reference, so tail calls keep working after the agent exits (a kill -9
  must not break attached programs).

- With a `BuildCache` (agent.bpf.build_cache), a build compiled before with the same key
  loads from its image (maps adopted or created and pinned as above, programs verified
  again, no clang); a compiled build is captured into the cache after it loaded.

Invariants: nothing outside `pin_dir` (and the cache directory) is created; `close()`
releases fds but never unpins (use `remove_pin_dir()` for that); stale `progs_<abi>`/
`scratch_<abi>`/`nat6scratch_<abi>` pins of older builds are removed only by
`sweep_stale_build_pins()`, after attachments moved to the new build.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import stat
import struct
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.build_cache import (
    BuildCache,
    BuildImage,
    ImageMismatch,
    LoadedImage,
    MapSpec,
    Uncacheable,
    cache_key,
    extract_relocations,
    load_image,
)
from pyfelix.agent.bpf.maps import ALL_MAPS, BY_NAME
from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, layout_mismatch
from pyfelix.agent.bpf.maps.conntrack import DEFAULT_TIMEOUTS, Timeouts
from pyfelix.agent.bpf.maps.rules import DEFAULT_RULES_PER_PROG
from pyfelix.agent.bpf.syscall import CgroupAttachType

log = logging.getLogger(__name__)

BPF_DIR = Path(os.environ.get("PYFELIX_BPF_DIR", Path(__file__).resolve().parents[2] / "bpf"))
ENTRY_FILES = ("tc.c", "xdp.c", "ctlb.c")
TC_PROGRAMS = ("calico_from_wep", "calico_to_wep", "calico_policy", "calico_from_hep",
               "calico_from_host")
XDP_PROGRAMS = ("calico_xdp",)
# cgroup v2 socket-address programs (ctlb.c) and the attach type each is loaded for
CTLB_PROGRAMS = {
    "calico_connect4": CgroupAttachType.INET4_CONNECT,
    "calico_sendmsg4": CgroupAttachType.UDP4_SENDMSG,
    "calico_recvmsg4": CgroupAttachType.UDP4_RECVMSG,
    "calico_getpeername4": CgroupAttachType.INET4_GETPEERNAME,
}
POLICY_PROG_INDEX = 0  # PROG_IDX_POLICY in policy.h
BUILD_PIN_PREFIXES = ("progs_", "scratch_", "nat6scratch_")  # pins private to one build (PROG_ABI)
FIXED_SIZE_MAPS = frozenset({"config", "global_counters"})  # sized in C, not configurable

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
# BPF_TABLE_PINNED[7]("type", key type, value type, NAME, ...): the tables a build pins
_PINNED_TABLE = re.compile(r'BPF_TABLE_PINNED7?\(\s*"\w+"\s*,[^,;]+,[^,;]+,\s*(\w+)\s*,')
KTIME_COARSE_SINCE = (5, 11)  # the kernel that added bpf_ktime_get_coarse_ns


def kernel_has_ktime_coarse(release: str | None = None) -> bool:
    """Whether the kernel (`os.uname().release` by default) has bpf_ktime_get_coarse_ns.
    An unparseable release counts as old: the fine clock works everywhere."""
    match = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return bool(match) and (int(match[1]), int(match[2])) >= KTIME_COARSE_SINCE


class LoaderError(RuntimeError):
    """Compiling, verifying or pinning failed; the message names the file/program/map."""


@dataclass(frozen=True)
class BuildConfig:
    """Everything that shapes one build. `map_sizes` overrides max_entries by map name."""

    pin_dir: str
    map_sizes: Mapping[str, int] = field(default_factory=dict)
    rules_per_prog: int = DEFAULT_RULES_PER_PROG
    ct_timeouts: Timeouts = DEFAULT_TIMEOUTS
    bpf_dir: Path = BPF_DIR
    ktime_coarse: bool = field(default_factory=kernel_has_ktime_coarse)

    def max_entries(self, params: MapParams) -> int:
        if params.sized_like:
            return self.max_entries(BY_NAME[params.sized_like])
        return int(self.map_sizes.get(params.name, params.max_entries))

    def validate(self) -> None:
        unknown = sorted(set(self.map_sizes) - set(BY_NAME))
        if unknown:
            raise ValueError(f"BuildConfig.map_sizes: unknown map(s) {unknown}")
        for name, size in self.map_sizes.items():
            if name in FIXED_SIZE_MAPS or int(size) < 1:
                raise ValueError(f"BuildConfig.map_sizes[{name!r}]: bad size {size!r}")
        if not 1 <= self.rules_per_prog <= 256:
            raise ValueError(
                f"BuildConfig.rules_per_prog: {self.rules_per_prog} outside 1..256 (kept for "
                "the build's ABI; the classifier's budget per run is CLS_STEPS_PER_PROG)"
            )

    def cflags(self, abi: str | None = None) -> list[str]:
        flags = [f'-DPIN_DIR="{self.pin_dir}"']
        if abi is not None:
            flags.append(f'-DPROG_ABI="{abi}"')
        for p in ALL_MAPS:
            if p.name not in FIXED_SIZE_MAPS:
                flags.append(f"-D{p.size_macro}={self.max_entries(p)}")
        flags.append(f"-DPOLICY_RULES_PER_PROG={self.rules_per_prog}")
        if self.ktime_coarse:
            flags.append("-DPF_KTIME_COARSE=1")
        flags += self.ct_timeouts.cflags()
        return flags


def assemble_source(bpf_dir: Path = BPF_DIR, entry_files: tuple[str, ...] = ENTRY_FILES) -> str:
    """One C text from the entry files with local includes inlined (each file once)."""
    seen: set[Path] = set()
    out: list[str] = []
    include_dir = bpf_dir / "include"

    def emit(path: Path) -> None:
        path = path.resolve()
        if path in seen:
            return
        seen.add(path)
        out.append(f'#line 1 "{path}"')
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            m = _INCLUDE.match(line)
            if not m:
                out.append(line)
                continue
            for cand in (path.parent / m.group(1), include_dir / m.group(1)):
                if cand.exists():
                    emit(cand)
                    break
            else:
                raise LoaderError(f"{path}:{lineno}: included file {m.group(1)!r} not found")
            out.append(f'#line {lineno + 1} "{path}"')

    for name in entry_files:
        emit(bpf_dir / name)
    return "\n".join(out) + "\n"


def build_abi(source: str, cflags: list[str]) -> str:
    """Hash of what the programs are built from (pin dir excluded, so it is stable)."""
    h = hashlib.sha256(source.encode())
    for f in cflags:
        if not f.startswith("-DPIN_DIR="):
            h.update(f.encode())
    return h.hexdigest()[:12]


# --- bpffs and pins ------------------------------------------------------------------------


HOST_ROOT = "/proc/1/root"  # the init process's view of the filesystem


def bpffs_mount_of(path: str, mounts_file: str = "/proc/self/mounts") -> str | None:
    """The bpffs mount point containing path (per `mounts_file`), or None."""
    best = None
    try:
        with open(mounts_file) as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "bpf":
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (
                best is None or len(mnt) > len(best)
            ):
                best = mnt
    return best


def resolve_pin_dir(pin_dir: str, *, mount: bool = True) -> str:
    """The path to pin under so the pins land in the HOST's bpffs at `pin_dir`.

    - pin_dir is on bpffs in our mount namespace: pin_dir itself;
    - init's mount namespace has bpffs there but ours does not: we run in a private mount
      namespace (`ip netns exec` remounts /sys, hiding the host's /sys/fs/bpf). Pins must
      go to the host's instance, reached as `/proc/1/root<pin_dir>` where the kernel lets
      us; where it does not (some sandboxes deny /proc/1/root), a bpffs is mounted in OUR
      namespace and a warning says so: its pins die with this process, so a restarted
      agent adopts nothing (run the agent with `nsenter --net=...` instead, which keeps
      the host's mounts);
    - otherwise, with `mount`, /sys/fs/bpf is mounted (fresh machines have none).
    Raises LoaderError when pin_dir cannot be on bpffs.
    """
    pin_dir = os.path.abspath(pin_dir)
    if bpffs_mount_of(pin_dir):
        return pin_dir
    host_mount = bpffs_mount_of(pin_dir, "/proc/1/mounts")
    if host_mount is not None:
        host_path = HOST_ROOT + pin_dir
        try:
            os.stat(HOST_ROOT + host_mount)
        except OSError as e:
            log.warning("pin directory %s is on the host's bpffs, which this mount namespace "
                        "cannot reach (%s); pinning into a bpffs private to this process: "
                        "pinned state will NOT survive an agent restart", pin_dir, e)
        else:
            log.info("pin directory %s is on the host's bpffs, outside this mount "
                     "namespace; pinning through %s", pin_dir, host_path)
            return host_path
    if mount and pin_dir.startswith("/sys/fs/bpf/"):
        subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], check=True)
        if bpffs_mount_of(pin_dir):
            return pin_dir
    raise LoaderError(f"pin directory {pin_dir!r} is not on a bpf filesystem")


def ensure_bpffs(pin_dir: str) -> None:
    """Make sure pin_dir is on bpffs (see resolve_pin_dir; pass its result as pin_dir)."""
    if not pin_dir.startswith(HOST_ROOT + "/"):
        resolve_pin_dir(pin_dir)


def prepare_pins(config: BuildConfig) -> list[str]:
    """Create pin_dir; unpin data maps whose kernel layout or size differs from config.
    Returns the pin names it removed."""
    ensure_bpffs(config.pin_dir)
    os.makedirs(config.pin_dir, exist_ok=True)
    replaced = []
    for params in ALL_MAPS:
        path = params.pin_path(config.pin_dir)
        if not os.path.exists(path):
            continue
        try:
            fd = syscall.obj_get(path)
        except OSError as e:
            problem = f"cannot open: {e}"
        else:
            try:
                info = syscall.map_info(fd)
            finally:
                os.close(fd)
            problem = layout_mismatch(params, info)
            if not problem and info.max_entries != config.max_entries(params):
                problem = f"max_entries {info.max_entries} != {config.max_entries(params)}"
        if problem:
            log.warning("BPF map %s: pinned map does not fit (%s); replacing it, its "
                        "contents are lost", path, problem)
            os.unlink(path)
            replaced.append(params.pin_name)
    return replaced


def remove_pin_dir(pin_dir: str) -> None:
    """Unpin everything under pin_dir and remove it (tests, the lab, uninstall): a
    directory this code made for itself. Symlinks are removed, never followed, and a
    pin_dir that is itself a symlink is left alone (what it points to is not ours)."""
    if os.path.islink(pin_dir) or not os.path.isdir(pin_dir):
        return
    for name in os.listdir(pin_dir):
        path = os.path.join(pin_dir, name)
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_pin_dir(path)
        else:
            os.unlink(path)  # a pin, or a symlink itself
    os.rmdir(pin_dir)


def sweep_stale_build_pins(pin_dir: str, keep_abi: str) -> list[str]:
    """Remove prog-array/scratch pins of builds other than keep_abi. Call only once no
    attached program of an older build is left (they tail-call through those pins)."""
    removed = []
    for name in sorted(os.listdir(pin_dir)):
        for prefix in BUILD_PIN_PREFIXES:
            if name.startswith(prefix) and name != prefix + keep_abi:
                os.unlink(os.path.join(pin_dir, name))
                removed.append(name)
    return removed


# --- loading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedProgram:
    """A program loaded from a cached image (what BCC's function objects give: fd, name)."""

    name: str
    fd: int


@dataclass
class LoadedDataplane:
    """A loaded build: programs (fds stay valid while this object lives) and map handles."""

    config: BuildConfig
    abi: str
    bpf: Any  # bcc.BPF; None when loaded from the build cache (no BCC tables then)
    functions: dict[str, Any]  # program name -> bcc function object or LoadedProgram
    maps: dict[str, BpfMap]
    compile_seconds: float
    load_seconds: float
    replaced_pins: list[str]
    image: LoadedImage | None = None  # the fds of a build-cache load
    from_cache: bool = False

    def prog_fd(self, name: str) -> int:
        return int(self.functions[name].fd)

    def close(self) -> None:
        """Release fds (programs stay attached where attached; pins stay)."""
        for m in self.maps.values():
            m.close()
        self.maps = {}
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
        if self.image is not None:
            self.image.close()
            self.image = None

    def __enter__(self) -> LoadedDataplane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def program_list(bcc: Any) -> list[tuple[str, int, int]]:
    """(name, BPF program type, expected attach type or -1) of every program, load order."""
    return ([(n, int(bcc.BPF.SCHED_CLS), -1) for n in TC_PROGRAMS]
            + [(n, int(bcc.BPF.XDP), -1) for n in XDP_PROGRAMS]
            + [(n, int(bcc.BPF.CGROUP_SOCK_ADDR), int(a)) for n, a in CTLB_PROGRAMS.items()])


def load_dataplane(config: BuildConfig, cache: BuildCache | None = None) -> LoadedDataplane:
    """Compile and load every program; adopt or create every pinned map. With `cache`, a
    build of the same key loads from its image instead of compiling (agent.bpf.build_cache;
    a miss or a failed image load compiles), and a compiled build is stored there."""
    import bcc  # only here: the rest of agent.bpf works without BCC

    config.validate()
    replaced = prepare_pins(config)
    source = assemble_source(config.bpf_dir)
    abi = build_abi(source, config.cflags())
    cflags = config.cflags(abi)
    programs = program_list(bcc)
    key = cache_key(source, cflags, programs, kernel_release=os.uname().release,
                    bcc_version=str(getattr(bcc, "__version__", "unknown")))
    if cache is not None and (image := cache.get(key)) is not None:
        try:
            return _load_image(config, image, abi, replaced)
        except (OSError, ImageMismatch, ValueError, KeyError) as e:
            log.warning("BPF build cache image %s did not load (%s); compiling", key, e)
    t0 = time.monotonic()
    try:
        b = bcc.BPF(text=source.encode(), cflags=cflags)
    except Exception as e:  # BCC raises bare Exception with the compiler output on stderr
        raise LoaderError(f"BCC could not compile {config.bpf_dir}/{{tc,xdp,ctlb}}.c: {e}") \
            from e
    t1 = time.monotonic()
    functions: dict[str, Any] = {}
    try:
        for name, prog_type, attach_type in programs:
            functions[name] = _load_func(b, name, prog_type, attach_type)
        progs = b[b"policy_progs"]
        progs[progs.Key(POLICY_PROG_INDEX)] = progs.Leaf(functions["calico_policy"].fd)
        maps = {p.name: BpfMap.open_pinned(p, config.pin_dir) for p in ALL_MAPS}
    except Exception:
        b.cleanup()
        raise
    t2 = time.monotonic()
    log.info("BPF programs loaded in %.2fs (compile %.2fs, verify %.2fs), abi %s",
             t2 - t0, t1 - t0, t2 - t1, abi)
    if cache is not None:
        try:
            cache.put(key, capture_image(b, programs, config.pin_dir,
                                         set(_PINNED_TABLE.findall(source))))
        except (Uncacheable, OSError) as e:
            log.warning("BPF build not cached: %s", e)
    return LoadedDataplane(
        config=config, abi=abi, bpf=b, functions=functions, maps=maps,
        compile_seconds=t1 - t0, load_seconds=t2 - t1, replaced_pins=replaced,
    )


def _load_image(config: BuildConfig, image: BuildImage, abi: str,
                replaced: list[str]) -> LoadedDataplane:
    t0 = time.monotonic()
    loaded = load_image(image, config.pin_dir)
    try:
        syscall.map_update(loaded.map_fds["policy_progs"],
                           struct.pack("<I", POLICY_PROG_INDEX),
                           struct.pack("<I", loaded.prog_fds["calico_policy"]),
                           what="policy_progs")
        maps = {p.name: BpfMap.open_pinned(p, config.pin_dir) for p in ALL_MAPS}
    except BaseException:
        loaded.close()
        raise
    t1 = time.monotonic()
    log.info("BPF programs loaded from the build cache in %.2fs (verify), abi %s",
             t1 - t0, abi)
    return LoadedDataplane(
        config=config, abi=abi, bpf=None,
        functions={n: LoadedProgram(n, fd) for n, fd in loaded.prog_fds.items()},
        maps=maps, compile_seconds=0.0, load_seconds=t1 - t0, replaced_pins=replaced,
        image=loaded, from_cache=True)


def capture_image(b: Any, programs: list[tuple[str, int, int]], pin_dir: str,
                  pinned: set[str]) -> BuildImage:
    """The build cache's image of a BCC build that has just loaded: every table's kernel
    definition and pin name (matched by map id among pin_dir's pins), every program's
    instructions with their map relocations. A table of `pinned` (the source's
    BPF_TABLE_PINNED names) without its pin makes the build Uncacheable: loaded unpinned,
    it would not outlive the agent (the prog array's tail calls after a kill -9)."""
    from bcc.libbcc import lib

    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pin_by_map_id: dict[int, str] = {}
    for entry in sorted(os.listdir(pin_dir)):
        path = os.path.join(pin_dir, entry)
        if os.path.isdir(path):
            continue
        try:
            fd = syscall.obj_get(path)
        except OSError:
            continue
        try:
            pin_by_map_id[syscall.map_info(fd).map_id] = entry
        except OSError:
            pass  # a pinned program, not a map
        finally:
            os.close(fd)
    specs, table_by_fd = [], {}
    for i in range(lib.bpf_num_tables(b.module)):
        table = lib.bpf_table_name(b.module, i)
        fd = lib.bpf_table_fd(b.module, table)
        if fd < 0:
            raise Uncacheable(f"table {table.decode()} has no fd")
        info = syscall.map_info(fd)
        name = table.decode()
        pin = pin_by_map_id.get(info.map_id)
        if pin is None and name in pinned:
            raise Uncacheable(f"table {name} is declared pinned but no pin in {pin_dir} "
                              "holds it")
        table_by_fd[fd] = name
        specs.append(MapSpec(table=name, name=info.name, map_type=info.map_type,
                             key_size=info.key_size, value_size=info.value_size,
                             max_entries=info.max_entries, flags=info.map_flags, pin=pin))
    images = tuple(extract_relocations(name, prog_type, attach_type,
                                       b.dump_func(name.encode()), table_by_fd)
                   for name, prog_type, attach_type in programs)
    return BuildImage(license=lib.bpf_module_license(b.module).decode(),
                      kern_version=int(lib.bpf_module_kern_version(b.module)),
                      maps=tuple(specs), programs=images)


def _load_func(b: Any, name: str, prog_type: int, attach_type: int = -1) -> Any:
    try:
        return b.load_func(name.encode(), prog_type, attach_type=attach_type)
    except Exception as e:
        raise LoaderError(
            f"BPF program {name!r} failed to load (the verifier log is on stderr): {e}"
        ) from e

"""The BPF build cache: load a build's verified-before instructions without compiling again.

Role: BCC compiles bpf/{tc,xdp,ctlb}.c with clang on every agent start (seconds of CPU per
start, for the same source, flags and kernel each time). After a BCC build has loaded,
`agent.bpf.loader` captures it as a `BuildImage`: each program's instructions with the map
references taken out, and each map's definition (type, sizes, flags, pin name). The next
load with the same key creates or adopts the same maps, puts their fds back into the
instructions and loads them with BPF_PROG_LOAD: the kernel's verifier checks them again, as
on any load; only the compiler is skipped. Pin names are kept without the pin directory,
so agents with different pin directories (one per node in the lab) share an image.

Inputs: the cache key (`cache_key`: the assembled C source, the compiler flags other than
PIN_DIR, the kernel release, the BCC version, the program list and this module's format)
and a directory. Outputs: `BuildImage`s read and written as JSON files `<key>.json`.

Invariants:
- An image holds only what a successful BCC load produced on this kernel (the loader
  writes it after loading); any other key misses. A miss, an unreadable or untrusted file,
  or a load that fails (a pin that does not match, a verifier rejection) falls back to the
  full BCC build: the cache changes how long a start takes, never what is loaded.
- At most KEEP_IMAGES images stay (the newest): an upgrade's old builds do not pile up.
- Trust: the directory and file must belong to this user and not be writable by group or
  others, else the image is ignored (a rewritten image would be a program the kernel
  accepts and the agent never compiled). Written 0600 in a 0700 directory, atomically.
- Instructions: every 16-byte ld_imm64 with src_reg BPF_PSEUDO_MAP_FD is a relocation
  (instruction index -> map name), its immediate stored as 0. Any other pseudo source
  (map values, BTF ids, kfuncs) makes the build uncacheable (`Uncacheable`).

    BCC build --capture--> BuildImage --put--> <dir>/<key>.json
                                                      |
    next start: get(key) --> open/create maps --> patch fds --> BPF_PROG_LOAD (verifier)
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from pyfelix.agent.bpf import syscall

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
CACHE_DIR_ENV = "PYFELIX_BPF_CACHE_DIR"
DEFAULT_CACHE_DIR = "/var/cache/pyfelix/bpf"
DISABLED_VALUES = ("", "off", "none", "0")
KEEP_IMAGES = 8  # the most recently written images kept; older builds' are removed

LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instruction slots
BPF_PSEUDO_MAP_FD = 1
INSN_BYTES = 8


class Uncacheable(ValueError):
    """The build references something other than maps by fd; it is not cached."""


class ImageMismatch(RuntimeError):
    """A cached image does not fit the pinned maps it would adopt."""


@dataclass(frozen=True)
class MapSpec:
    """One map of the build, as the kernel reported it after BCC created it."""

    table: str  # the C name (relocations name it)
    name: str  # the kernel's name (15 characters at most)
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    pin: str | None  # file name in the pin directory; None: not pinned

    def layout(self) -> tuple[int, int, int, int, int]:
        return (self.map_type, self.key_size, self.value_size, self.max_entries, self.flags)


@dataclass(frozen=True)
class ProgramImage:
    name: str
    prog_type: int
    attach_type: int  # expected_attach_type (-1: none)
    insns: bytes  # relocated slots' immediates zeroed
    relocations: tuple[tuple[int, str], ...]  # (instruction index, map table)


@dataclass(frozen=True)
class BuildImage:
    license: str
    kern_version: int
    maps: tuple[MapSpec, ...]
    programs: tuple[ProgramImage, ...]

    def to_json(self) -> str:
        return json.dumps({
            "format": CACHE_FORMAT, "license": self.license, "kern_version": self.kern_version,
            "maps": [asdict(m) for m in self.maps],
            "programs": [{"name": p.name, "prog_type": p.prog_type,
                          "attach_type": p.attach_type,
                          "insns": base64.b64encode(p.insns).decode(),
                          "relocations": [list(r) for r in p.relocations]}
                         for p in self.programs]})

    @classmethod
    def from_json(cls, text: str) -> BuildImage:
        doc = json.loads(text)
        if doc.get("format") != CACHE_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {CACHE_FORMAT}")
        return cls(
            license=str(doc["license"]), kern_version=int(doc["kern_version"]),
            maps=tuple(MapSpec(**m) for m in doc["maps"]),
            programs=tuple(ProgramImage(
                name=str(p["name"]), prog_type=int(p["prog_type"]),
                attach_type=int(p["attach_type"]), insns=base64.b64decode(p["insns"]),
                relocations=tuple((int(i), str(t)) for i, t in p["relocations"]))
                for p in doc["programs"]))


def cache_key(source: str, cflags: Iterable[str], programs: Iterable[tuple[str, int, int]],
              *, kernel_release: str, bcc_version: str) -> str:
    """What a build's instructions depend on. PIN_DIR is left out: it names where the maps
    are pinned, which the image does not hold."""
    h = hashlib.sha256(f"pyfelix-bpf-image-{CACHE_FORMAT}\0{kernel_release}\0{bcc_version}\0"
                       .encode())
    h.update(source.encode())
    for flag in cflags:
        if not flag.startswith("-DPIN_DIR="):
            h.update(b"\0" + flag.encode())
    for name, prog_type, attach_type in programs:
        h.update(f"\0{name}:{prog_type}:{attach_type}".encode())
    return h.hexdigest()[:32]


# --- instructions ----------------------------------------------------------------------------


def _ld_imm64_src(insns: bytes, index: int) -> int | None:
    """src_reg of the ld_imm64 at index, or None when that instruction is not one."""
    if insns[index * INSN_BYTES] != LD_IMM64:
        return None
    return insns[index * INSN_BYTES + 1] >> 4


def extract_relocations(program: str, prog_type: int, attach_type: int, insns: bytes,
                        table_by_fd: Mapping[int, str]) -> ProgramImage:
    """A loaded program's image: its instructions with the map fds zeroed, and the
    relocations. `table_by_fd`: the fds BCC put into the instructions, by table name."""
    if len(insns) % INSN_BYTES:
        raise Uncacheable(f"program {program}: {len(insns)} bytes is not whole instructions")
    out = bytearray(insns)
    relocations = []
    index, count = 0, len(insns) // INSN_BYTES
    while index < count:
        src = _ld_imm64_src(insns, index)
        if src is None:
            index += 1
            continue
        if src != 0:
            imm = struct.unpack_from("<i", insns, index * INSN_BYTES + 4)[0]
            if src != BPF_PSEUDO_MAP_FD:
                raise Uncacheable(f"program {program}: instruction {index} is an ld_imm64 "
                                  f"with pseudo source {src} (only map fds are cached)")
            if imm not in table_by_fd:
                raise Uncacheable(f"program {program}: instruction {index} references fd "
                                  f"{imm}, which is none of the build's maps")
            relocations.append((index, table_by_fd[imm]))
            struct.pack_into("<i", out, index * INSN_BYTES + 4, 0)
        index += 2
    return ProgramImage(name=program, prog_type=prog_type, attach_type=attach_type,
                        insns=bytes(out), relocations=tuple(relocations))


def patch_relocations(image: ProgramImage, fd_by_table: Mapping[str, int]) -> bytes:
    """The program's instructions with each relocation's map fd in place."""
    out = bytearray(image.insns)
    count = len(image.insns) // INSN_BYTES
    for index, table in image.relocations:
        if not 0 <= index < count - 1 or \
                _ld_imm64_src(image.insns, index) != BPF_PSEUDO_MAP_FD:
            raise ValueError(f"program {image.name}: relocation {index} is not a map ld_imm64")
        struct.pack_into("<i", out, index * INSN_BYTES + 4, fd_by_table[table])
    return bytes(out)


# --- loading an image ----------------------------------------------------------------------


@dataclass
class LoadedImage:
    """Fds of a loaded image: programs by name, maps by table (all owned by the caller)."""

    prog_fds: dict[str, int]
    map_fds: dict[str, int]

    def close(self) -> None:
        for fd in (*self.prog_fds.values(), *self.map_fds.values()):
            os.close(fd)
        self.prog_fds, self.map_fds = {}, {}


def _open_or_create(spec: MapSpec, pin_dir: str) -> int:
    if spec.pin is None:
        return syscall.map_create(spec.map_type, spec.key_size, spec.value_size,
                                  spec.max_entries, spec.flags, spec.name)
    path = os.path.join(pin_dir, spec.pin)
    if os.path.exists(path):
        fd = syscall.obj_get(path)
        info = syscall.map_info(fd)
        found = (info.map_type, info.key_size, info.value_size, info.max_entries,
                 info.map_flags)
        if found != spec.layout():
            os.close(fd)
            raise ImageMismatch(f"pinned map {path}: (type, key, value, max_entries, flags) "
                                f"{found}, the image has {spec.layout()}")
        return fd
    fd = syscall.map_create(spec.map_type, spec.key_size, spec.value_size, spec.max_entries,
                            spec.flags, spec.name)
    try:
        syscall.obj_pin(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load_image(image: BuildImage, pin_dir: str) -> LoadedImage:
    """Adopt or create (and pin) every map of the image, then load every program. On any
    failure everything opened here is closed (pins this call created stay, as BCC's do)."""
    loaded = LoadedImage(prog_fds={}, map_fds={})
    try:
        for spec in image.maps:
            loaded.map_fds[spec.table] = _open_or_create(spec, pin_dir)
        for prog in image.programs:
            loaded.prog_fds[prog.name] = syscall.prog_load(
                prog.prog_type, patch_relocations(prog, loaded.map_fds), prog.name,
                expected_attach_type=max(prog.attach_type, 0), license_=image.license,
                kern_version=image.kern_version)
    except BaseException:
        loaded.close()
        raise
    return loaded


# --- the directory -------------------------------------------------------------------------


def _trusted(path: Path, what: str) -> bool:
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning("BPF build cache: %s %s is not this user's only (uid %d, mode %o); "
                    "not used", what, path, st.st_uid, stat.S_IMODE(st.st_mode))
        return False
    return True


@dataclass(frozen=True)
class BuildCache:
    directory: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> BuildCache | None:
        """The cache named by PYFELIX_BPF_CACHE_DIR (default /var/cache/pyfelix/bpf), or
        None when it is set to "", "off", "none" or "0"."""
        value = environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR)
        return None if value.strip().lower() in DISABLED_VALUES else cls(Path(value))

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> BuildImage | None:
        path = self.path(key)
        try:
            if not path.exists() or not _trusted(self.directory, "directory") or \
                    not _trusted(path, "file"):
                return None
            return BuildImage.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("BPF build cache: %s unreadable (%s); compiling", path, e)
            return None

    def put(self, key: str, image: BuildImage) -> None:
        """Write atomically; a failure is logged, never raised (the build is loaded)."""
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(image.to_json())
            os.replace(tmp, path)
            images = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime,
                            reverse=True)
            for old in images[KEEP_IMAGES:]:
                old.unlink(missing_ok=True)
        except OSError as e:
            log.warning("BPF build cache: could not write %s: %s", path, e)
            tmp.unlink(missing_ok=True)

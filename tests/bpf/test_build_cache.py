"""agent.bpf.build_cache without a kernel: relocations, the image's JSON, the key, the
directory's trust rules. The real loads are tests/privileged/bpf/test_priv_bpf_build_cache.py.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from pyfelix.agent.bpf.build_cache import (
    KEEP_IMAGES,
    BuildCache,
    BuildImage,
    MapSpec,
    ProgramImage,
    Uncacheable,
    cache_key,
    extract_relocations,
    patch_relocations,
)


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def ld_imm64(dst: int, src: int, imm: int) -> bytes:
    return insn(0x18, dst, src, 0, imm) + insn(0, 0, 0, 0, 0)


MOV_R0_0 = insn(0xB7, 0, 0, 0, 0)
EXIT = insn(0x95)


def program(conntrack_fd: int, routes_fd: int) -> bytes:
    return (ld_imm64(1, 1, conntrack_fd) + MOV_R0_0 + ld_imm64(2, 0, 12345)
            + ld_imm64(1, 1, routes_fd) + ld_imm64(3, 1, conntrack_fd) + EXIT)


def test_map_fds_become_relocations_and_come_back_as_other_fds() -> None:
    image = extract_relocations("p", 3, -1, program(7, 9), {7: "conntrack", 9: "routes"})
    assert image.relocations == ((0, "conntrack"), (5, "routes"), (7, "conntrack"))
    assert image.insns == program(0, 0)  # a plain 64-bit constant (src 0) is kept
    assert patch_relocations(image, {"conntrack": 30, "routes": 31}) == program(30, 31)


def test_other_pseudo_sources_and_unknown_fds_are_uncacheable() -> None:
    with pytest.raises(Uncacheable, match="pseudo source 2"):
        extract_relocations("p", 3, -1, ld_imm64(1, 2, 7) + EXIT, {7: "m"})
    with pytest.raises(Uncacheable, match="fd 8"):
        extract_relocations("p", 3, -1, ld_imm64(1, 1, 8) + EXIT, {7: "m"})
    with pytest.raises(Uncacheable, match="whole instructions"):
        extract_relocations("p", 3, -1, EXIT[:5], {})


def test_a_relocation_that_does_not_fit_the_instructions_is_refused() -> None:
    bad = ProgramImage("p", 3, -1, MOV_R0_0 + EXIT, ((1, "m"),))
    with pytest.raises(ValueError, match="not a map ld_imm64"):
        patch_relocations(bad, {"m": 3})
    far = ProgramImage("p", 3, -1, MOV_R0_0 + EXIT, ((40, "m"),))
    with pytest.raises(ValueError):
        patch_relocations(far, {"m": 3})


IMAGE = BuildImage(
    license="GPL", kern_version=0,
    maps=(MapSpec("routes", "routes", 11, 24, 16, 1024, 1, "routes_v2"),
          MapSpec("flow_events", "flow_events", 27, 0, 0, 1 << 16, 0, None)),
    programs=(ProgramImage("calico_connect4", 18, 10, program(0, 0),
                           ((0, "routes"), (5, "routes"), (7, "routes"))),))


def test_image_json_round_trip() -> None:
    assert BuildImage.from_json(IMAGE.to_json()) == IMAGE


def test_key_ignores_the_pin_dir_and_nothing_else() -> None:
    progs = [("calico_from_wep", 3, -1)]
    base = cache_key("src", ['-DPIN_DIR="/a"', "-DX=1"], progs, kernel_release="6.1",
                     bcc_version="0.26")
    assert base == cache_key("src", ['-DPIN_DIR="/b"', "-DX=1"], progs,
                             kernel_release="6.1", bcc_version="0.26")
    others = [cache_key("src2", ["-DX=1"], progs, kernel_release="6.1", bcc_version="0.26"),
              cache_key("src", ["-DX=2"], progs, kernel_release="6.1", bcc_version="0.26"),
              cache_key("src", ["-DX=1"], progs, kernel_release="6.2", bcc_version="0.26"),
              cache_key("src", ["-DX=1"], progs, kernel_release="6.1", bcc_version="0.29"),
              cache_key("src", ["-DX=1"], [("calico_from_wep", 3, 2)], kernel_release="6.1",
                        bcc_version="0.26")]
    assert base not in others and len(set(others)) == len(others)


def test_put_then_get_private_files_only(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    cache = BuildCache(tmp_path / "cache")
    assert cache.get("k") is None
    cache.put("k", IMAGE)
    path = cache.path("k")
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == oct(0o700)
    assert cache.get("k") == IMAGE
    path.chmod(0o620)
    with caplog.at_level(logging.WARNING):
        assert cache.get("k") is None
    assert "not this user's only" in caplog.text
    path.chmod(0o600)
    (tmp_path / "cache").chmod(0o777)
    assert cache.get("k") is None
    (tmp_path / "cache").chmod(0o700)
    path.write_text('{"format": 99}')
    assert cache.get("k") is None
    assert not [n for n in os.listdir(tmp_path / "cache") if n.endswith(".tmp")]


def test_cache_dir_from_the_environment() -> None:
    assert BuildCache.from_env({}) == BuildCache(Path("/var/cache/pyfelix/bpf"))
    assert BuildCache.from_env({"PYFELIX_BPF_CACHE_DIR": "/tmp/x"}) == BuildCache(Path("/tmp/x"))
    for off in ("", "off", "OFF", "none", "0"):
        assert BuildCache.from_env({"PYFELIX_BPF_CACHE_DIR": off}) is None


def test_only_the_newest_images_are_kept(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    for i in range(KEEP_IMAGES + 3):
        cache.put(f"k{i}", IMAGE)
        os.utime(cache.path(f"k{i}"), (1000 + i, 1000 + i))
    cache.put("last", IMAGE)
    kept = sorted(p.stem for p in tmp_path.glob("*.json"))
    assert len(kept) == KEEP_IMAGES and "last" in kept and "k0" not in kept


def test_the_loader_knows_every_pinned_table_of_the_source() -> None:
    """capture_image refuses a build whose pinned tables lack pins; the names come from the
    source's BPF_TABLE_PINNED[7] declarations: every data map, and the build-private ones."""
    from pyfelix.agent.bpf import loader
    from pyfelix.agent.bpf.maps import ALL_MAPS

    pinned = set(loader._PINNED_TABLE.findall(loader.assemble_source(loader.BPF_DIR)))
    assert pinned - {p.name for p in ALL_MAPS} == {"policy_progs", "policy_scratch",
                                                   "nat6_scratch"}
    assert {p.name for p in ALL_MAPS} <= pinned

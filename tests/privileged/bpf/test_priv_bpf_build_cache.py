"""The BPF build cache (agent.bpf.build_cache) in the real kernel: a build compiled by BCC
into one pin directory loads from its image into another without compiling, with the same
programs (kernel tags), its own maps (the relocations point at the second directory's
pins, not the first's) and the same policy verdicts; an image the kernel refuses falls
back to compiling. (Untrusted files and other builds' keys never reach the kernel: unit
tests in tests/bpf/test_build_cache.py.)
"""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import packets as pk
from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.build_cache import BuildCache
from pyfelix.agent.bpf.loader import BuildConfig, LoadedDataplane, load_dataplane
from pyfelix.agent.bpf.maps import counters as counters_map
from pyfelix.agent.bpf.scratch import scratch_pin_dir
from pyfelix.agent.bpf.testrun import TC_ACT_SHOT, NetnsThread, run_tc
from tests.privileged.bpf.bpf_harness import Harness
from tests.privileged.bpf.conftest import TEST_MAP_SIZES
from tests.privileged.bpf.test_priv_bpf_policy import B, check, ingress_policy, tcp, udp

pytestmark = pytest.mark.privileged


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bpf-build-cache")


@pytest.fixture(scope="module")
def compiled(root_untouched: None, cache_dir: Path) -> Iterator[LoadedDataplane]:
    """A BCC build (the cache starts empty) that stores its image."""
    with scratch_pin_dir("cache-a") as pin_dir, load_dataplane(
            BuildConfig(pin_dir=pin_dir, map_sizes=TEST_MAP_SIZES),
            cache=BuildCache(cache_dir)) as dp:
        yield dp


def config(pin_dir: str) -> BuildConfig:
    return BuildConfig(pin_dir=pin_dir, map_sizes=TEST_MAP_SIZES)


def tags(dp: LoadedDataplane) -> dict[str, str]:
    return {name: syscall.prog_info(dp.prog_fd(name)).tag for name in dp.functions}


def test_second_build_loads_from_the_image_with_its_own_maps(
        compiled: LoadedDataplane, cache_dir: Path,
        netns: tuple[NetnsThread, dict[str, int]]) -> None:
    assert not compiled.from_cache and compiled.compile_seconds > 0
    assert len(list(cache_dir.glob("*.json"))) == 1
    thread, ifindexes = netns
    with scratch_pin_dir("cache-b") as pin_dir, \
            load_dataplane(config(pin_dir), cache=BuildCache(cache_dir)) as cached:
        assert cached.from_cache and cached.bpf is None and cached.compile_seconds == 0
        assert tags(cached) == tags(compiled)
        assert sorted(os.listdir(pin_dir)) == sorted(os.listdir(compiled.config.pin_dir))
        # the tail-call target is this build's calico_policy
        progs_pin = os.path.join(pin_dir, f"progs_{cached.abi}")
        fd = syscall.obj_get(progs_pin)
        try:
            entry = syscall.map_lookup(fd, struct.pack("<I", 0), 4, "policy_progs")
        finally:
            os.close(fd)
        assert entry is not None
        assert struct.unpack("<I", entry)[0] == syscall.prog_info(
            cached.prog_fd("calico_policy")).prog_id
        # a packet from an interface without an endpoint is dropped and counted in THIS
        # build's global counters, not the compiled build's
        before = counters_map.read_globals(compiled.maps["global_counters"])
        out = thread.call(run_tc, cached.prog_fd("calico_from_wep"),
                          pk.tcp("10.65.0.1", "10.65.0.2", 40000, 80), ifindex=ifindexes["d3"])
        assert out.retval == TC_ACT_SHOT
        assert counters_map.read_globals(cached.maps["global_counters"])[
            "no_endpoint_dropped"] == 1
        assert counters_map.read_globals(compiled.maps["global_counters"]) == before
        # and policy decides as in the compiled build (tail call into the walker)
        h = Harness(cached, thread, ifindexes)
        ingress_policy(h, p.Rule("allow", protocol=17))
        check(h, *udp(B, 53), "allow")
        check(h, *tcp(B, 53), "deny")


def test_an_image_that_does_not_load_compiles_and_is_rewritten(
        compiled: LoadedDataplane, cache_dir: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    image = next(cache_dir.glob("*.json"))
    doc = json.loads(image.read_text())
    # a program with an unknown opcode (the verifier refuses it, after the maps were
    # made): compiled instead, and the image rewritten
    broken = tmp_path / "broken"
    broken.mkdir(mode=0o700)
    first = doc["programs"][0]
    insns = base64.b64decode(first["insns"])
    assert insns[0] != 0x18 and all(index > 0 for index, _ in first["relocations"])
    bad = base64.b64encode(bytes([0xFF]) + insns[1:]).decode()  # no such opcode
    doc_bad = {**doc, "programs": [{**first, "insns": bad}, *doc["programs"][1:]]}
    (broken / image.name).write_text(json.dumps(doc_bad))
    (broken / image.name).chmod(0o600)
    with scratch_pin_dir("cache-c") as pin_dir, \
            load_dataplane(config(pin_dir), cache=BuildCache(broken)) as dp:
        assert not dp.from_cache and tags(dp) == tags(compiled)
    assert "did not load" in caplog.text and "verifier" in caplog.text
    assert json.loads((broken / image.name).read_text()) == doc

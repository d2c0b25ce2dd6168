"""Fixtures for the real-kernel BPF tests.

- `loaded` (session): ONE BCC build (compile ~3 s) with maps pinned under
  /sys/fs/bpf/pyfelix-scratch-test-<random>/ (agent.bpf.scratch), small map sizes;
  unpinned and removed at the end, also on failure (and after a kill, by the next sweep).
- `netns` (session): a namespace `pyfbpf-<pid>` with veth interfaces d1..d4, and a worker
  thread inside it, so BPF_PROG_TEST_RUN can use their ifindexes; deleted at the end.
- `harness` (per test): all maps emptied, a fresh compiler and state.
- A session check that the root namespace's links are unchanged and that no namespace or
  bpffs entry of ours appeared and was left (entries of a concurrent run are not ours).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from pyfelix.agent.bpf.loader import BuildConfig, LoadedDataplane, load_dataplane
from pyfelix.agent.bpf.scratch import scratch_pin_dir
from pyfelix.agent.bpf.testrun import NetnsThread
from tests.privileged.bpf.bpf_harness import Harness, reset_maps

IFACES = ("d1", "d2", "d3", "d4")
TEST_MAP_SIZES = {"rules": 32768, "cls_words": 1 << 17, "cls_tries": 1 << 16,
                  "rule_counters": 4096, "ep_counters": 256, "endpoints": 256,
                  "ipsets": 65536, "ids": 8192, "conntrack": 4096, "routes": 1024,
                  "untracked": 1024}


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


OUR_PREFIXES = ("pyfbpf-", "pyfelix-test-", "pyfelix-scratch-")


def _root_snapshot() -> dict[str, object]:
    """Root-namespace links, and the namespaces / bpffs entries with OUR prefixes (other
    test suites may create their own concurrently)."""
    links = "\n".join(line.split("\\")[0] for line in sh("ip", "-o", "link").splitlines())
    netns = [n for n in sh("ip", "netns", "list").split() if n.startswith(OUR_PREFIXES)]
    bpffs = [n for n in os.listdir("/sys/fs/bpf") if n.startswith(OUR_PREFIXES)]
    nft = sh("nft", "list", "tables")  # the BPF mode's guard must never land here
    return {"links": links, "netns": sorted(netns), "bpffs": sorted(bpffs), "nft": nft}


@pytest.fixture(scope="session")
def root_untouched() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("BPF tests need root")
    before = _root_snapshot()
    yield
    after = _root_snapshot()
    assert after["links"] == before["links"]
    assert after["nft"] == before["nft"], "nft tables changed in the root namespace"
    # only what appeared during this session counts: a concurrent run of this suite may
    # have had (and since removed) namespaces and pins of its own when we started
    for what in ("netns", "bpffs"):
        leaked = set(after[what]) - set(before[what])  # type: ignore[arg-type]
        assert not leaked, f"left behind in the root namespace: {what} {sorted(leaked)}"


@pytest.fixture(scope="session")
def pin_dir(root_untouched: None) -> Iterator[str]:
    with scratch_pin_dir("test") as path:
        yield path


@pytest.fixture(scope="session")
def loaded(pin_dir: str) -> Iterator[LoadedDataplane]:
    dp = load_dataplane(BuildConfig(pin_dir=pin_dir, map_sizes=TEST_MAP_SIZES))
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture(scope="session")
def netns(root_untouched: None) -> Iterator[tuple[NetnsThread, dict[str, int]]]:
    name = f"pyfbpf-{os.getpid()}"
    sh("ip", "netns", "add", name)
    try:
        for iface in IFACES:
            # veth pairs (this kernel has no dummy driver); d<n> plays the host side
            sh("ip", "-n", name, "link", "add", iface, "type", "veth", "peer", "name",
               f"{iface}p")
        ifindexes = {}
        for line in sh("ip", "-n", name, "-o", "link").splitlines():
            idx, ifname = line.split(":")[:2]
            ifindexes[ifname.strip().split("@")[0]] = int(idx)
        with NetnsThread(f"/run/netns/{name}") as thread:
            yield thread, ifindexes
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=60)


@pytest.fixture
def harness(loaded: LoadedDataplane, netns: tuple[NetnsThread, dict[str, int]]) -> Harness:
    reset_maps(loaded)
    thread, ifindexes = netns
    return Harness(loaded, thread, ifindexes)


@pytest.fixture
def netns_routes(netns: tuple[NetnsThread, dict[str, int]]) -> Iterator[None]:
    """Routes for the reverse-path tests: 192.0.2.1/24 on d1 (its subnet routes via d1) and
    198.51.100.0/24 via d2 (an address on d2's peer side); removed afterwards."""
    name = f"pyfbpf-{os.getpid()}"
    # forwarding on, as the agent sets it (net.ipv4.ip_forward=1): the kernel's FIB lookup
    # helper answers FWD_DISABLED on an interface that does not forward
    sh("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    steps = [("link", "set", "d1", "up"), ("link", "set", "d1p", "up"),
             ("link", "set", "d2", "up"), ("link", "set", "d2p", "up"),
             ("addr", "add", "192.0.2.1/24", "dev", "d1"),
             ("addr", "add", "192.0.3.1/24", "dev", "d2"),
             ("route", "add", "198.51.100.0/24", "via", "192.0.3.2", "dev", "d2")]
    try:
        for step in steps:
            sh("ip", "-n", name, *step)
        yield
    finally:
        for step in (("route", "del", "198.51.100.0/24"),
                     ("addr", "del", "192.0.2.1/24", "dev", "d1"),
                     ("addr", "del", "192.0.3.1/24", "dev", "d2")):
            subprocess.run(["ip", "-n", name, *step], check=False, timeout=30)

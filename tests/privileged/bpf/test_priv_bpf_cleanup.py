"""Switching a node from BPF mode to iptables mode on a real kernel, in a namespace of our
own: the BPF managers attach our programs (tc on two workload veths, XDP on a host veth)
and pin under a per-test directory, then go away as a stopped agent would (programs and
pins stay); a foreign tool's programs sit beside ours (a bpf filter at another priority,
a u32 filter, an XDP program on another interface). A real `pyfelix agent` process in
iptables mode, against the same namespace and pin directory, must reach in-sync with our
filters gone at both hooks, our XDP program gone, the pin directory gone, every foreign
program still attached, and its iptables chains in place. A later agent's sweep (a fresh
manager in-process) then finds nothing (its duration is printed), and a resync does not
sweep again.

On the real bpffs, without any agent: only our pins leave the pin directory (a foreign pin,
a foreign subdirectory holding one of our names, a link to a directory outside, a link to
the bpffs root all stay, and so does the directory, with a warning); a BPFPinDir that is a
link to the bpffs root is refused and nothing at the root is touched. These use a fake
attacher: no netlink in the root namespace.

Teardown on success and failure: the agent is killed, the namespace deleted (veths, filters
and XDP programs go with it), the pin directory removed; `root_untouched` (conftest)
checks that nothing of ours is left in the root namespace.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyfelix.agent import proto as p
from pyfelix.agent.bpf import syscall
from pyfelix.agent.bpf.attach import HOOK_PARENTS, XDP_FLAGS_SKB_MODE
from pyfelix.agent.bpf.maps.base import MapType
from pyfelix.agent.dataplane.bpf_dataplane import build_bpf_managers
from pyfelix.agent.dataplane.managers.bpf_cleanup import (
    BpfCleanupManager,
    locate_pin_dir,
    remove_our_pins,
)
from tests.bpf.fakes import FakeAttacher
from tests.privileged.bpf.node_testlib import (
    Node,
    allow_all_workloads,
    node_namespace,
    own_pin_dir,
    sh,
    small_maps_config,
)

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[3]
WORKLOADS = ("cali1", "cali2")
HOSTS = ("eth0", "eth1")  # eth0: our XDP (untracked host endpoint); eth1: a foreign XDP

FOREIGN_SOURCE = """
int foreign_cls(struct __sk_buff *skb) { return -1; /* TC_ACT_UNSPEC: carry on */ }
int foreign_xdp(struct xdp_md *ctx) { return 2; /* XDP_PASS */ }
"""

DATASTORE = """
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node1-k8s-web-eth0, namespace: default, labels: {app: web}}
spec: {node: node1, orchestrator: k8s, workload: web, pod: web, endpoint: eth0,
       interfaceName: cali1, ipNetworks: [10.65.0.5/32]}
"""


@pytest.fixture
def node(root_untouched: None) -> Iterator[Node]:
    # peers named p<iface>: not matching the workload prefix `cali`
    veths = [(iface, f"p{iface}") for iface in (*WORKLOADS, *HOSTS)]
    with node_namespace(f"pyfbpf-cl-{os.getpid()}-{secrets.token_hex(2)}", veths,
                        up=True) as made:
        yield made


@pytest.fixture
def pin_dir(root_untouched: None) -> Iterator[str]:
    with own_pin_dir("cl") as path:
        yield path


@pytest.fixture
def foreign_programs() -> Iterator[dict[str, int]]:
    """A foreign tool's tc and XDP programs (fds), compiled with BCC."""
    import bcc

    bpf = bcc.BPF(text=FOREIGN_SOURCE.encode())
    try:
        yield {"cls": bpf.load_func(b"foreign_cls", bcc.BPF.SCHED_CLS).fd,
               "xdp": bpf.load_func(b"foreign_xdp", bcc.BPF.XDP).fd}
    finally:
        bpf.cleanup()


def bpf_mode_messages() -> list[object]:
    untracked = p.ActivePolicyUpdate(p.PolicyID("default", "untracked-deny"), p.Policy(
        untracked=True, inbound_rules=(p.Rule("deny", src_nets=("192.0.2.0/24",)),)))
    host = p.HostEndpointUpdate(p.HostEndpointID("node1-eth0"), p.HostEndpoint(
        "eth0", untracked_tiers=(p.TierInfo("default", ingress_policies=("untracked-deny",)),)))
    return [*allow_all_workloads(WORKLOADS), untracked, host, p.InSync()]


def run_bpf_agent_once(node: Node, pin_dir: str) -> None:
    """What a BPF-mode agent leaves behind when it stops: programs attached, maps pinned."""
    def run() -> None:
        managers = build_bpf_managers(small_maps_config(pin_dir))
        try:
            for msg in bpf_mode_messages():
                for m in managers:
                    m.on_update(msg)
            for m in managers:
                m.apply()
            for m in managers:
                m.finish_apply()
        finally:
            for m in managers:
                m.close()

    node.thread.call(run)


def add_foreign_programs(node: Node, fds: dict[str, int]) -> None:
    from pyroute2 import IPRoute

    def run() -> None:
        with IPRoute() as ipr:
            for iface, hook in (("cali1", "ingress"), ("cali2", "egress")):
                ipr.tc("add-filter", "bpf", node.ifindex(iface), 1, fd=fds["cls"],
                       name="foreign_cls", parent=HOOK_PARENTS[hook], classid=1,
                       direct_action=True, prio=5)
            ipr.link("set", index=node.ifindex("eth1"), xdp={"attrs": [
                ("IFLA_XDP_FD", fds["xdp"]), ("IFLA_XDP_FLAGS", XDP_FLAGS_SKB_MODE)]})

    node.thread.call(run)
    sh("ip", "netns", "exec", node.name, "tc", "filter", "add", "dev", "cali1", "egress",
       "prio", "8", "protocol", "all", "u32", "match", "u32", "0", "0", "flowid", "1:1")


def in_sync(status: Path) -> bool:
    try:
        return bool(json.loads(status.read_text()).get("dataplane_in_sync"))
    except (OSError, ValueError):
        return False


def test_iptables_agent_removes_our_programs_and_pins_and_keeps_foreign_ones(
        node: Node, pin_dir: str, foreign_programs: dict[str, int], tmp_path: Path):
    run_bpf_agent_once(node, pin_dir)
    add_foreign_programs(node, foreign_programs)
    for iface in WORKLOADS:
        assert "pyfelix:calico_from_wep:" in node.filters(iface, "ingress")
        assert "pyfelix:calico_to_wep:" in node.filters(iface, "egress")
    assert "prog/xdp" in node.link("eth0") and "prog/xdp" in node.link("eth1")
    # the host endpoint's interface runs the reverse-path check (BPFEnforceRPF)
    assert "pyfelix:calico_from_hep:" in node.filters("eth0", "ingress")
    assert os.listdir(pin_dir)

    datastore = tmp_path / "ds"
    datastore.mkdir()
    (datastore / "resources.yaml").write_text(DATASTORE)
    status, log_path = tmp_path / "status.json", tmp_path / "agent.log"
    env = {**os.environ, "FELIX_BPFENABLED": "false", "FELIX_BPFPINDIR": pin_dir,
           "FELIX_STATUSFILE": str(status), "FELIX_LOGSEVERITYSCREEN": "Info"}
    # nsenter --net keeps our mount namespace (the pins' bpffs), as the lab runs agents
    with open(log_path, "wb") as log_file:
        agent = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.name}", sys.executable, "-m", "pyfelix.cli.main",
             "agent", "--datastore", str(datastore), "--hostname", "node1"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not in_sync(status):
            assert agent.poll() is None, f"agent exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"not in sync:\n{log_path.read_text()}"
            time.sleep(0.1)
        log_text = log_path.read_text()
        for iface in WORKLOADS:
            for hook in ("ingress", "egress"):
                assert "pyfelix:" not in node.filters(iface, hook), (iface, hook, log_text)
        assert "foreign_cls" in node.filters("cali1", "ingress")
        assert "foreign_cls" in node.filters("cali2", "egress")
        assert "u32" in node.filters("cali1", "egress")
        assert "prog/xdp" not in node.link("eth0")
        assert "prog/xdp" in node.link("eth1")  # the foreign XDP program
        assert not os.path.exists(pin_dir)
        assert "pyfelix:" not in node.filters("eth0", "ingress")
        # 2 workload interfaces x 2 hooks + calico_from_hep on eth0
        assert "removed 5 tc filter(s) and 1 XDP program(s) of ours on 3 interface(s)" \
            in log_text, log_text
        chains = sh("ip", "netns", "exec", node.name, "iptables-save", "-t", "filter")
        assert "cali-tw-cali1" in chains
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=15) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()

    # a later agent's sweep finds nothing of ours: reads only, foreign programs untouched;
    # a resync does not sweep again
    cleanup = BpfCleanupManager(pin_dir, netns=node.name)
    try:
        cleanup.on_update(p.InSync())
        started = time.perf_counter()
        cleanup.finish_apply()  # includes opening the netlink socket in the namespace
        elapsed = time.perf_counter() - started
        first = cleanup.last
        cleanup.request_resync()
        cleanup.finish_apply()
    finally:
        cleanup.close()
    assert cleanup.sweeps == 1 and first is not None and not first.anything
    assert cleanup.last is first
    assert "foreign_cls" in node.filters("cali1", "ingress")
    print(f"\nsweep with nothing to remove, {len(WORKLOADS) + len(HOSTS) + 1} "
          f"interfaces: {elapsed * 1000:.1f} ms")


@pytest.fixture
def bpffs_dirs(root_untouched: None) -> Iterator[tuple[str, str]]:
    """A pin directory and an "outside" directory of this test under /sys/fs/bpf, removed
    afterwards by shutil.rmtree, which unlinks links without following them (the pin
    directory holds one to the bpffs root: `loader.remove_pin_dir` would follow it)."""
    token = secrets.token_hex(4)
    paths = (f"/sys/fs/bpf/pyfelix-test-clp-{token}", f"/sys/fs/bpf/pyfelix-test-clo-{token}")
    try:
        for path in paths:
            os.mkdir(path)
        yield paths
    finally:
        for path in paths:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)


def pin_a_map(path: str) -> None:
    fd = syscall.map_create(MapType.ARRAY, 4, 4, 1)
    try:
        syscall.obj_pin(fd, path)
    finally:
        os.close(fd)


def test_on_bpffs_only_our_pins_go_and_a_link_to_the_root_is_refused(
        bpffs_dirs: tuple[str, str], caplog: pytest.LogCaptureFixture):
    pin_dir, outside = bpffs_dirs
    ours = ["ipsets_v1", "progs_0123456789ab", "rules_v1"]
    for name in ours:
        pin_a_map(f"{pin_dir}/{name}")
    pin_a_map(f"{pin_dir}/cilium_calls")
    os.mkdir(f"{pin_dir}/other")
    pin_a_map(f"{pin_dir}/other/rules_v1")
    pin_a_map(f"{outside}/ipsets_v1")
    os.symlink(outside, f"{pin_dir}/elsewhere")
    os.symlink("/sys/fs/bpf", f"{pin_dir}/root-link")
    at_root = set(os.listdir("/sys/fs/bpf"))

    with pytest.raises(ValueError, match="root of a bpf filesystem"):
        locate_pin_dir(f"{pin_dir}/root-link")
    refused = BpfCleanupManager(f"{pin_dir}/root-link", attacher=FakeAttacher())
    refused.on_update(p.InSync())
    refused.finish_apply()
    assert refused.sweeps == 1 and refused.last is not None and not refused.last.anything
    assert at_root <= set(os.listdir("/sys/fs/bpf"))  # others' pins may come, none went

    assert locate_pin_dir(pin_dir) == pin_dir
    with caplog.at_level("WARNING", logger="pyfelix.agent.dataplane.managers.bpf_cleanup"):
        cleanup = BpfCleanupManager(pin_dir, attacher=FakeAttacher())
        cleanup.on_update(p.InSync())
        cleanup.finish_apply()
    assert cleanup.sweeps == 1 and cleanup.last is not None and cleanup.last.pins == 3
    assert sorted(os.listdir(pin_dir)) == ["cilium_calls", "elsewhere", "other", "root-link"]
    assert os.listdir(f"{pin_dir}/other") == ["rules_v1"]
    assert os.listdir(outside) == ["ipsets_v1"]
    assert at_root <= set(os.listdir("/sys/fs/bpf"))
    assert "cilium_calls, elsewhere, other, root-link" in caplog.text

    # once the foreign entries are gone, the directory goes too
    for name in ("cilium_calls", "elsewhere", "root-link"):
        os.unlink(f"{pin_dir}/{name}")
    os.unlink(f"{pin_dir}/other/rules_v1")
    os.rmdir(f"{pin_dir}/other")
    pin_a_map(f"{pin_dir}/routes_v1")
    removal = remove_our_pins(pin_dir)
    assert removal.removed == ["routes_v1"] and removal.dir_removed
    assert not os.path.exists(pin_dir)

"""The VM lab's tooling (vagrant/box/, vagrant/lab/) without booting anything.

`make vm-box` / `make vm-test` boot real VMs (too slow for `make test`); what is checked here
is the logic they rely on, quickly and without VM tooling installed:
- every script parses (`bash -n`);
- the kernel matrix: JUnit parsing, the table, and its pass rule (every kernel ran the same
  non-empty set of tests and all passed; a test missing on one kernel fails it); the one-shot
  VM's QEMU command has no network device at all, never writes the box, and asks for KVM only
  when told to; `--vm-only` (`make vm-overlay`) runs the selection in the VM alone and fails
  on a skip there;
- the box carries every Debian package scripts/setup.sh installs (so setup.sh never calls
  apt in a VM, which has no route out);
- the lab's probe check: the demo's expected verdicts before and after policy, a wrong,
  missing or never cross-node probe is a problem.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from deploy_checks import REPO, VAGRANT_DIR


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


kernel_matrix = _load("kernel_matrix", VAGRANT_DIR / "box" / "kernel_matrix.py")
check_probes = _load("check_probes", VAGRANT_DIR / "lab" / "check_probes.py")
SCRIPTS = sorted([*(VAGRANT_DIR / "box").glob("*.sh"), *(VAGRANT_DIR / "lab").glob("*.sh")])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.privileged.bpf.test_priv_bpf_policy" name="test_a" time="1"/>
<testcase classname="tests.privileged.bpf.test_priv_bpf_policy" name="test_b" time="1">
  <failure message="boom">trace</failure></testcase>
<testcase classname="tests.privileged.bpf.test_priv_bpf_policy" name="test_c" time="0">
  <skipped message="no"/></testcase>
<testcase classname="tests.privileged.bpf.test_priv_bpf_policy" name="test_d" time="0">
  <error message="setup"/></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes() -> None:
    outcomes = kernel_matrix.parse_junit(JUNIT)
    prefix = "tests.privileged.bpf.test_priv_bpf_policy::"
    assert outcomes == {prefix + "test_a": "passed", prefix + "test_b": "failed",
                        prefix + "test_c": "skipped", prefix + "test_d": "error"}


def _run(label: str, **outcomes: str) -> object:
    return kernel_matrix.KernelRun(label, {f"m::{k}": v for k, v in outcomes.items()}, 12.0)


def test_matrix_passes_only_when_every_kernel_passed_the_same_tests() -> None:
    host = _run("host 6.18", test_a="passed", test_b="passed")
    assert kernel_matrix.matrix_ok([host, _run("vm 6.1", test_a="passed", test_b="passed")])
    assert not kernel_matrix.matrix_ok([host, _run("vm 6.1", test_a="passed", test_b="failed")])
    assert not kernel_matrix.matrix_ok([host, _run("vm 6.1", test_a="passed")])  # one missing
    assert not kernel_matrix.matrix_ok([host, _run("vm 6.1")])  # the VM produced nothing
    assert not kernel_matrix.matrix_ok([])
    skipped = _run("vm 6.1", test_a="passed", test_b="skipped")
    assert not kernel_matrix.matrix_ok([host, skipped])


def test_matrix_table_has_a_row_per_test_and_a_column_per_kernel() -> None:
    table = kernel_matrix.render_matrix(
        [_run("host 6.18", test_a="passed", test_b="passed"), _run("vm 6.1", test_a="error")])
    lines = table.splitlines()
    assert lines[0].split() == ["test", "host", "6.18", "vm", "6.1"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:3]}
    assert rows == {"m::test_a": ["passed", "error"], "m::test_b": ["passed", "missing"]}
    assert "host 6.18: 2 passed in 12 s" in table
    assert "vm 6.1: 1 error in 12 s" in table


@pytest.mark.parametrize("accel", ["kvm", "qemu"])
def test_one_shot_vm_has_no_network_and_never_writes_the_box(accel: str, tmp_path: Path) -> None:
    cmd = kernel_matrix.qemu_command(tmp_path / "box", tmp_path / "results",
                                     tmp_path / "source.tar", accel, 2048, 2,
                                     tmp_path / "console.log")
    joined = " ".join(cmd)
    assert cmd[cmd.index("-nic") + 1] == "none"
    assert "-nodefaults" in cmd
    assert not re.search(r"-netdev|-net\b|-device [^ ]*net", joined)
    drives = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-drive"]
    assert any("rootfs.raw" in d and "snapshot=on" in d for d in drives)
    assert any("source.tar" in d and "readonly=on" in d for d in drives)
    shares = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-virtfs"]
    assert any("mount_tag=pyfelix" in s and "readonly=on" in s for s in shares)
    assert ("-enable-kvm" in cmd) == (accel == "kvm")
    assert "init=/usr/local/sbin/pyfelix-oneshot" in cmd[cmd.index("-append") + 1]


def _setup_packages() -> set[str]:
    text = re.sub(r"#[^\n]*", "", (REPO / "scripts" / "setup.sh").read_text())
    block = re.search(r"^APT_PACKAGES=\(([^)]*)\)", text, re.M)
    assert block
    return set(block.group(1).split())


def test_box_carries_every_package_setup_sh_installs() -> None:
    script = VAGRANT_DIR / "box" / "build-box.sh"
    # the same extraction build-box.sh does, run by bash on the real setup.sh
    snippet = script.read_text().split("SETUP_PACKAGES=$(", 1)[1].split("\n# ...", 1)[0]
    assert "python3-matplotlib" in _setup_packages()  # the last one, after a comment
    result = subprocess.run(["bash", "-c", f"repo={REPO}; echo $({snippet.rstrip()}"],
                            capture_output=True, text=True, timeout=30, check=True)
    assert set(result.stdout.split()) == _setup_packages()
    box_packages = re.search(r'BOX_PACKAGES="([^"]*)"', script.read_text())
    assert box_packages
    for needed in ("linux-image-amd64", "linux-headers-amd64", "openssh-server", "rsync"):
        assert needed in box_packages.group(1).split()


def _pods() -> dict:
    return check_probes.pod_placement(
        yaml.safe_load_all((VAGRANT_DIR / "demo" / "cluster.yaml").read_text()))


def _results(phase: str, pods: dict, override: dict | None = None) -> list[dict]:
    results = []
    for source in pods:
        for target, (_node, ports) in pods.items():
            if target == source:
                continue
            for port, protocol in ports:
                result = check_probes.expected_result(phase, source, target, port, protocol)
                key = (source, target, port, protocol)
                if override and key in override:
                    result = override[key]
                    if result is None:
                        continue
                results.append({"from": source, "to": target, "port": port,
                                "protocol": protocol, "result": result})
    return results


def test_probe_check_accepts_the_expected_verdicts() -> None:
    pods = _pods()
    assert {node for node, _ in pods.values()} == {"node1", "node2"}
    for phase in check_probes.PHASES:
        assert check_probes.check(phase, _results(phase, pods), pods) == []
    denied = {(r["from"], r["to"]) for r in _results("after", pods) if r["result"] == "deny"}
    # demo/policy.yaml: postgres only from team=web namespaces; cache only from app=frontend
    assert denied == {("other/intruder", "db/postgres"), ("other/intruder", "web/cache"),
                      ("db/postgres", "web/cache")}


def test_probe_check_reports_a_wrong_a_missing_and_a_never_cross_node_probe() -> None:
    pods = _pods()
    leak = ("other/intruder", "db/postgres", 5432, "TCP")
    problems = check_probes.check("after", _results("after", pods, {leak: "allow"}), pods)
    assert problems == ["other/intruder -> db/postgres:5432/TCP: allow, want deny"]
    missing = check_probes.check("before", _results("before", pods, {leak: None}), pods)
    assert missing == ["other/intruder -> db/postgres:5432/TCP: not probed"]
    same_node = [r for r in _results("before", pods)
                 if pods[r["from"]][0] == pods[r["to"]][0]]
    problems = check_probes.check("before", same_node, pods)
    assert "no probe from a pod on node1 to a pod on node2" in problems
    with pytest.raises(ValueError, match="phase"):
        check_probes.expected_result("during", "a/b", "c/d", 1, "TCP")


def _fake_box(tmp_path: Path) -> Path:
    box = tmp_path / "box"
    box.mkdir()
    for name in ("vmlinuz", "initrd.img", "rootfs.raw"):
        (box / name).write_bytes(b"")
    return box


@pytest.mark.parametrize(("vm_outcome", "code"), [("passed", 0), ("skipped", 1), ("failed", 1)])
def test_vm_only_runs_the_selection_in_the_vm_alone(
        vm_outcome: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make vm-overlay`: the host's kernel (no IPIP) is not asked; the VM's column must pass,
    and a test the VM skipped (e.g. no IPIP there either) fails the run."""
    guest_calls: list[tuple[str, ...]] = []

    def host(*_args: object) -> object:
        raise AssertionError("--vm-only ran the host's pytest")

    def guest(box: Path, work: Path, accel: str, pytest_args: list[str], *_rest: object) -> object:
        guest_calls.append(tuple(pytest_args))
        return _run("vm 6.1", test_ipip=vm_outcome, test_vxlan="passed")

    monkeypatch.setattr(kernel_matrix, "run_host", host)
    monkeypatch.setattr(kernel_matrix, "run_guest", guest)
    argv = ["--box", str(_fake_box(tmp_path)), "--accel", "qemu", "--vm-only",
            "--keep", str(tmp_path / "work"), "--", "-q", "tests/x.py"]
    assert kernel_matrix.main(argv) == code
    assert guest_calls == [("-q", "tests/x.py")]


def test_make_vm_overlay_runs_the_overlay_labs_in_the_vm_only() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^vm-overlay:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "Makefile has no vm-overlay target"
    command = recipe.group(1).replace("\\\n", " ")
    assert "kernel_matrix.py" in command and "--vm-only" in command
    assert "tests/privileged/lab/test_lab_overlay.py" in command

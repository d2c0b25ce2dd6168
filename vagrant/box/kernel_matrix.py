"""Kernel matrix: the same real BPF tests on the host's kernel and on the box's kernel.

Role: proves the kernel-version claim for pyfelix's BPF programs on a second kernel. The
host runs a pytest selection of the real-kernel BPF tests (BCC compiles and loads the
programs, BPF_PROG_TEST_RUN checks policy verdicts); a one-shot VM booted from the box made
by `make vm-box` (Debian 12, its own 6.1 kernel, QEMU with KVM when kvm-check.sh found it
usable, else TCG) runs the same selection on the same source. Both write JUnit XML; the
matrix prints one row per test, one column per kernel.

With `--vm-only` the box's kernel alone runs the selection: for tests that need what the
host's kernel lacks (IPIP: `make vm-overlay` runs the two-node lab over VXLAN and IPIP on
both dataplanes in the VM, where the host's kernel has no CONFIG_NET_IPIP and skips).

Inputs: the box directory (vmlinuz, initrd.img, rootfs.raw), the accelerator (`kvm` or
`qemu`), the pytest arguments. Outputs: the matrix on stdout, the logs and XML under the work
directory; exit 0 only when every test ran and passed on every kernel (a skip is no pass).

Invariants: the VM has no network device at all (`-nic none`): it shares only the project,
read-only, and a results directory over virtio-9p, so nothing reaches any network
namespace; the box's disk is used as a snapshot (never written); the VM is killed at the
time limit and on interrupt.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTEST_ARGS = ("-q", "tests/privileged/bpf/test_priv_bpf_policy.py")
OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class KernelRun:
    """One column of the matrix: a kernel and its test outcomes (test id -> outcome)."""

    label: str
    outcomes: dict[str, str]
    seconds: float
    note: str = ""


def parse_junit(xml_text: str) -> dict[str, str]:
    """Test id (`file-less classname::name`) -> passed/failed/error/skipped."""
    root = ET.fromstring(xml_text)
    outcomes: dict[str, str] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                break
        outcomes[test_id] = outcome
    return outcomes


def render_matrix(runs: Sequence[KernelRun]) -> str:
    """A text table: one row per test, one column per kernel, then per-kernel totals."""
    test_ids = sorted({t for run in runs for t in run.outcomes})
    short = {t: t.rsplit(".", 1)[-1] for t in test_ids}
    first = max([len("test"), *(len(s) for s in short.values())])
    widths = [max(len(run.label), 8) for run in runs]
    lines = [
        "test".ljust(first)
        + "  "
        + "  ".join(r.label.ljust(w) for r, w in zip(runs, widths, strict=True))
    ]
    for t in test_ids:
        cells = [
            run.outcomes.get(t, "missing").ljust(w) for run, w in zip(runs, widths, strict=True)
        ]
        lines.append(short[t].ljust(first) + "  " + "  ".join(cells))
    lines.append("")
    for run in runs:
        counts = {o: sum(1 for v in run.outcomes.values() if v == o) for o in OUTCOMES}
        summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
        note = f" ({run.note})" if run.note else ""
        lines.append(f"{run.label}: {summary or 'no tests'} in {run.seconds:.0f} s{note}")
    return "\n".join(lines)


def matrix_ok(runs: Sequence[KernelRun]) -> bool:
    """Every kernel ran the same, non-empty set of tests and all of them passed."""
    if not runs or any(not run.outcomes for run in runs):
        return False
    ids = set(runs[0].outcomes)
    return all(set(run.outcomes) == ids for run in runs) and all(
        v == "passed" for run in runs for v in run.outcomes.values()
    )


def qemu_command(
    box: Path,
    results: Path,
    source_tar: Path,
    accel: str,
    memory_mb: int,
    cpus: int,
    serial_log: Path,
) -> list[str]:
    """The one-shot VM: direct kernel boot into /usr/local/sbin/pyfelix-oneshot, no NIC.

    Disks: the box (a snapshot, never written) and the project as a tar archive (/dev/vdb,
    read-only; one sequential read is far quicker under TCG than copying a 9p tree)."""
    accel_args = (
        ["-enable-kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", "tcg", "-cpu", "max"]
    )
    return [
        "qemu-system-x86_64",
        *accel_args,
        "-m",
        str(memory_mb),
        "-smp",
        str(cpus),
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-nic",
        "none",
        "-kernel",
        str(box / "vmlinuz"),
        "-initrd",
        str(box / "initrd.img"),
        "-drive",
        f"file={box / 'rootfs.raw'},format=raw,if=virtio,snapshot=on",
        "-drive",
        f"file={source_tar},format=raw,if=virtio,readonly=on",
        "-virtfs",
        f"local,path={REPO},mount_tag=pyfelix,security_model=none,readonly=on",
        "-virtfs",
        f"local,path={results},mount_tag=results,security_model=none",
        "-serial",
        f"file:{serial_log}",
        "-append",
        "console=ttyS0 root=/dev/vda rw init=/usr/local/sbin/pyfelix-oneshot quiet panic=-1",
    ]


# Left out of the VM's copy: at the top of the tree, and anywhere in it.
SOURCE_EXCLUDES_TOP = (".git", ".venv", "build", "vagrant/.box", "vagrant/.lab", "vagrant/.vagrant")
SOURCE_EXCLUDES_ANY = ("__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache")


def pack_source(dest: Path) -> None:
    """The project's tree as the VM gets it: a tar archive without VCS, venv and box files."""
    excludes = [f"--exclude=./{e}" for e in SOURCE_EXCLUDES_TOP]
    excludes += [f"--exclude={e}" for e in SOURCE_EXCLUDES_ANY]
    subprocess.run(["tar", "-C", str(REPO), *excludes, "-cf", str(dest), "."], check=True)


def run_guest(
    box: Path,
    work: Path,
    accel: str,
    pytest_args: Sequence[str],
    limit_s: int,
    memory_mb: int,
    cpus: int,
) -> KernelRun:
    results = work / "guest"
    results.mkdir(parents=True, exist_ok=True)
    (results / "pytest-args").write_text("\n".join(pytest_args) + "\n")
    serial = work / "guest-console.log"
    kernel = (
        (box / "kernel-release").read_text().strip() if (box / "kernel-release").exists() else "box"
    )
    source_tar = work / "source.tar"
    pack_source(source_tar)
    cmd = qemu_command(box, results, source_tar, accel, memory_mb, cpus, serial)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    note = f"QEMU {'KVM' if accel == 'kvm' else 'TCG'}"
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        note += f", killed at the {limit_s} s limit"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - t0
    xml = results / "guest.xml"
    outcomes = parse_junit(xml.read_text()) if xml.exists() else {}
    if not outcomes:
        note += f", no results: see {serial} and {results / 'guest.log'}"
    return KernelRun(f"vm {kernel}", outcomes, seconds, note)


def run_host(work: Path, pytest_args: Sequence[str], python: str) -> KernelRun:
    xml = work / "host.xml"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.monotonic()
    with (work / "host.log").open("w") as log:
        subprocess.run(
            [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={xml}", *pytest_args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.monotonic() - t0
    outcomes = parse_junit(xml.read_text()) if xml.exists() else {}
    return KernelRun(
        f"host {platform.release()}",
        outcomes,
        seconds,
        "" if outcomes else f"no results: see {work / 'host.log'}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--box", type=Path, default=REPO / "vagrant" / ".box")
    ap.add_argument("--accel", choices=("kvm", "qemu"), required=True)
    ap.add_argument("--time-limit", type=int, default=2400, help="seconds for the VM run")
    ap.add_argument("--memory", type=int, default=2048, help="MiB for the VM")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="the host's Python for pytest")
    ap.add_argument("--keep", type=Path, help="keep logs and XML in this directory")
    ap.add_argument("--vm-only", action="store_true",
                    help="run the selection in the VM only (tests the host's kernel cannot run)")
    ap.add_argument("pytest_args", nargs="*", default=list(DEFAULT_PYTEST_ARGS))
    args = ap.parse_args(argv)
    for name in ("vmlinuz", "initrd.img", "rootfs.raw"):
        if not (args.box / name).exists():
            print(
                f"kernel-matrix: {args.box / name} missing: run `make vm-box` first",
                file=sys.stderr,
            )
            return 2
    work = Path(tempfile.mkdtemp(prefix="pyfelix-kmatrix-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    print(f"kernel-matrix: pytest {' '.join(args.pytest_args)}; logs in {work}", flush=True)
    runs = [] if args.vm_only else [run_host(work, args.pytest_args, args.python)]
    host_done = f"host done in {runs[0].seconds:.0f} s; " if runs else ""
    print(f"kernel-matrix: {host_done}booting the box ({args.accel})", flush=True)
    runs.append(
        run_guest(
            args.box, work, args.accel, args.pytest_args, args.time_limit, args.memory, args.cpus
        )
    )
    print(render_matrix(runs))
    ok = matrix_ok(runs)
    print(f"kernel matrix: {'PASS' if ok else 'FAIL'}")
    if args.keep is None and ok:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

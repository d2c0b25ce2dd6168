"""Explain every probe of a conformance run (`ExplainEveryProbe`, an `after_step` hook).

After each case is probed, while its policy is in force, every cell's flow is explained on
the node, in-process (`explain_flow` over the calc graph of the lab's datastore; in BPF mode
the program attached to each pod's interface run on a crafted packet in the node's
namespace, against the agent's pinned maps). Problems are collected, not raised, so the
conformance run itself is never cut short; test_conformance_explain asserts on them. Once per
dataplane the real CLI runs too (nsenter into the node, JSON out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pyfelix.agent.bpf.attach import PyRoute2Attacher
from pyfelix.agent.bpf.explain import run_policy_program
from pyfelix.agent.bpf.testrun import NetnsThread
from pyfelix.agent.calc.explain import ExplainError, compute_model
from pyfelix.agent.datastore import parse_datastore_url
from pyfelix.cli.commands.explain import explain_flow, make_flow
from pyfelix.lab.conformance.matrix import CellResult
from pyfelix.lab.conformance.plan import PlannedStep
from pyfelix.lab.conformance.world import pod_ip

REPO = Path(__file__).resolve().parents[3]


class ExplainEveryProbe:
    def __init__(self, dataplane: str) -> None:
        self.dataplane = dataplane
        self.explained = 0
        self.absent_checked = 0
        self.kernel_runs = 0
        self.problems: list[str] = []
        self.cli_checked: list[dict[str, Any]] = []
        self.verdicts: set[str] = set()
        self.seconds = 0.0
        self._threads: dict[str, tuple[NetnsThread, PyRoute2Attacher]] = {}

    def close(self) -> None:
        for thread, attacher in self._threads.values():
            thread.call(attacher.close)
            thread.__exit__(None, None, None)
        self._threads.clear()

    def _kernel(self, netns: str) -> Any:
        """Kernel runs in the node's namespace, through one netlink handle kept per node
        (opened in that namespace's thread)."""
        if netns not in self._threads:
            thread = NetnsThread(f"/run/netns/{netns}").__enter__()
            self._threads[netns] = (thread, thread.call(PyRoute2Attacher))
        thread, attacher = self._threads[netns]

        def run(pin_dir: str, iface: str, hook: str, packet: bytes) -> Any:
            self.kernel_runs += 1
            return thread.call(run_policy_program, pin_dir, iface, hook, packet,
                               attacher=attacher)
        return run

    def __call__(self, runner: Any, planned: PlannedStep, results: list[CellResult]) -> None:
        started = time.monotonic()
        location = parse_datastore_url(str(runner.datastore_dir))
        nodes = runner.topology.nodes
        models = {name: compute_model(location, name) for name in nodes}
        for result in results:
            if result.again is not None and result.again != result.got:
                continue  # the probe itself was not stable: nothing to compare with
            cell = result.cell
            src = str(pod_ip(*cell.source.split("/")))
            flow = make_flow(src, str(cell.target_ip), cell.column.protocol,
                             cell.column.port or 0)
            outs = []
            for name, model in models.items():
                try:
                    outs.append(explain_flow(
                        model, flow, dataplane=self.dataplane,
                        pin_dir=str(runner.bpffs_dir / name),
                        kernel=self._kernel(nodes[name].netns)))
                except ExplainError:
                    continue  # neither end on this node
            where = f"{planned.case.name} {cell.source}->{cell.target} {cell.column}"
            if not outs:
                self.problems.append(f"{where}: no node explained it")
                continue
            pods = planned.case.world.pods
            absent = {str(pod_ip(*k.split("/"))) for k in (cell.source, cell.target)
                      if not pods[k].present}
            if absent:
                # no Pod document: explain must say it knows no endpoint there, and the
                # probe must have been dropped (no endpoint)
                self.absent_checked += 1
                if set(outs[0]["unknown_addresses"]) != absent or result.got:
                    self.problems.append(f"{where}: pod without a Pod document: explain "
                                         f"unknown {outs[0]['unknown_addresses']}, probe "
                                         f"{result.got_word}")
                continue
            self.explained += 1
            verdict = "deny" if any(o["verdict"] == "deny" for o in outs) else "allow"
            self.verdicts.add(verdict)
            if verdict != result.got_word:
                self.problems.append(f"{where}: explain says {verdict}, the probe saw "
                                     f"{result.got_word} ({outs[0]['policy']})")
            for out in outs:
                if self.dataplane == "bpf" and not out["agree"]:
                    self.problems.append(f"{where}: program and calc graph disagree: " + "; ".join(
                        d["disagreement"] for d in out["directions"] if d["disagreement"]))
        if not self.cli_checked and {r.got for r in results} == {True, False}:
            self._check_cli(runner, results)
        self.seconds += time.monotonic() - started

    def _check_cli(self, runner: Any, results: list[CellResult]) -> None:
        """The real command, in the node's namespace, for one denied and one allowed probe."""
        [(node_name, node)] = runner.topology.nodes.items()
        for result in (next(r for r in results if not r.got), next(r for r in results if r.got)):
            cell = result.cell
            args = ["explain", "--datastore", str(runner.datastore_dir), "--hostname", node_name,
                    "--from", cell.source, "--to", cell.target, "--protocol",
                    cell.column.protocol, "-o", "json"]
            if cell.column.port:
                args += ["--port", str(cell.column.port)]
            env = {**os.environ, "FELIX_BPFPINDIR": str(runner.bpffs_dir / node_name),
                   "FELIX_BPFENABLED": "true" if self.dataplane == "bpf" else "false",
                   "PYTHONPATH": str(REPO)}
            proc = subprocess.run(
                ["nsenter", f"--net=/run/netns/{node.netns}", sys.executable, "-m",
                 "pyfelix.cli.main", *args], capture_output=True, text=True, timeout=120,
                env=env, check=False)
            assert proc.returncode == 0, proc.stderr + proc.stdout
            out = json.loads(proc.stdout)
            assert out["dataplane"] == self.dataplane
            assert out["verdict"] == result.got_word, out
            assert {"verdict", "policy", "tier", "rule"} <= set(out)
            if self.dataplane == "bpf":
                assert out["agree"] is True and out["kernel_verdict"] == out["verdict"], out
            else:  # the chains explain names are the node's own
                saved = subprocess.run(["ip", "netns", "exec", node.netns, "iptables-save"],
                                       capture_output=True, text=True, timeout=60,
                                       check=True).stdout
                chains = {line[1:].split()[0] for line in saved.splitlines()
                          if line.startswith(":")}
                named = {c for d in out["directions"] for c in d["chains"]}
                assert named and named <= chains, sorted(named - chains)
            self.cli_checked.append(out)

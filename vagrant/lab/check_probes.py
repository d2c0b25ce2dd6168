"""Check the VM lab's probe results against what the demo's policy must do.

Role: `make vm-test` collects `vmlab.py probe -o json` from every node VM, before and after
`demo/policy.yaml` is applied, and this decides pass or fail. Before the policy every pod
reaches every port of every other pod (also across VMs, through routes learned over BGP);
after it, `other/intruder` is denied to `db/postgres:5432/TCP` (the NetworkPolicy: only
namespaces labelled team=web), `other/intruder` and `db/postgres` are denied to
`web/cache:11211/UDP` (the GlobalNetworkPolicy: only app == 'frontend'), and everything else
is still allowed.

Inputs: the phase (`before` or `after`), JSON files each holding a list of probe results
(`from`, `to`, `port`, `protocol`, `result`), and the cluster file for the pod placement.
Outputs: one line per probe, then the problems; exit 0 only with no problem. Invariants: a
probe missing from the results is a problem (each node must probe every pod port of the
other pods), and the check needs at least one cross-node probe per direction.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

DENIED_AFTER_POLICY = frozenset(
    {
        ("other/intruder", "db/postgres", 5432, "TCP"),
        ("other/intruder", "web/cache", 11211, "UDP"),
        ("db/postgres", "web/cache", 11211, "UDP"),
    }
)
PHASES = ("before", "after")
DEFAULT_CLUSTER = Path(__file__).resolve().parents[1] / "demo" / "cluster.yaml"


def expected_result(phase: str, source: str, target: str, port: int, protocol: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    denied = phase == "after" and (source, target, port, protocol) in DENIED_AFTER_POLICY
    return "deny" if denied else "allow"


def pod_placement(cluster_docs: Iterable[Mapping[str, object]]) -> dict[str, tuple[str, tuple]]:
    """Pod key -> (node, ((port, protocol), ...)) from the cluster file's Pod documents."""
    pods: dict[str, tuple[str, tuple]] = {}
    for doc in cluster_docs:
        if not doc or doc.get("kind") != "Pod":
            continue
        meta, spec = doc["metadata"], doc["spec"]
        ports = tuple(
            (int(p["containerPort"]), str(p.get("protocol", "TCP")))
            for c in spec.get("containers", [])
            for p in c.get("ports", [])
        )
        pods[f"{meta['namespace']}/{meta['name']}"] = (spec["nodeName"], ports)
    return pods


def check(
    phase: str, results: Sequence[Mapping[str, object]], pods: Mapping[str, tuple[str, tuple]]
) -> list[str]:
    """Problems with these results for this phase (empty: all as expected)."""
    problems: list[str] = []
    seen: dict[tuple[str, str, int, str], str] = {}
    for r in results:
        key = (str(r["from"]), str(r["to"]), int(r["port"]), str(r["protocol"]))
        seen[key] = str(r["result"])
    for source in pods:
        for target, (_node, ports) in pods.items():
            if target == source:
                continue
            for port, protocol in ports:
                key = (source, target, port, protocol)
                want = expected_result(phase, *key)
                got = seen.get(key)
                if got is None:
                    problems.append(f"{source} -> {target}:{port}/{protocol}: not probed")
                elif got != want:
                    problems.append(f"{source} -> {target}:{port}/{protocol}: {got}, want {want}")
    cross = {(pods[s][0], pods[t][0]) for s, t, _, _ in seen if s in pods and t in pods}
    nodes = sorted({node for node, _ in pods.values()})
    for a in nodes:
        for b in nodes:
            if a != b and (a, b) not in cross:
                problems.append(f"no probe from a pod on {a} to a pod on {b}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=PHASES)
    ap.add_argument("results", nargs="+", type=Path, help="vmlab.py probe -o json outputs")
    ap.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER)
    args = ap.parse_args(argv)
    pods = pod_placement(yaml.safe_load_all(args.cluster.read_text()))
    results: list[Mapping[str, object]] = []
    for path in args.results:
        results.extend(json.loads(path.read_text()))
    for r in results:
        node = pods.get(str(r["from"]), ("?",))[0]
        target_node = pods.get(str(r["to"]), ("?",))[0]
        print(
            f"  {r['from']:<16} ({node}) -> {r['to']}:{r['port']}/{r['protocol']:<4} "
            f"({target_node}) {r['result']}"
        )
    problems = check(args.phase, results, pods)
    for p in problems:
        print(f"PROBLEM: {p}")
    print(f"probes {args.phase} policy: {'as expected' if not problems else 'FAIL'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

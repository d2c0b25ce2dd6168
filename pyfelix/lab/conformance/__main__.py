"""`python -m pyfelix.lab.conformance`: run the conformance suite and print its report.

    python -m pyfelix.lab.conformance                         # every conformant dataplane
    python -m pyfelix.lab.conformance --dataplane bpf -o json
    python -m pyfelix.lab.conformance --case tier --case k8s-egress
    python -m pyfelix.lab.conformance --nodes 2       # pods on two nodes, BGP between them
    python -m pyfelix.lab.conformance --ip-family dual   # every cell over IPv4 and IPv6
    python -m pyfelix.lab.conformance --list
    python -m pyfelix.lab.conformance --emit-scenario suite.yaml   # for `pyfelix lab run`

Exit status: 0 when every case agreed with its expected matrix on every dataplane run; 1 on
any mismatch or lab error; 2 on bad arguments; 128+N after SIGINT/SIGTERM (lab torn down).
Progress goes to stderr, so `-o json` stdout stays parseable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import yaml

from pyfelix.lab.conformance import ALL_CASES, CONFORMANT_DATAPLANES
from pyfelix.lab.conformance.case import select_cases
from pyfelix.lab.conformance.matrix import DEFAULT_MAX_WORKERS
from pyfelix.lab.conformance.plan import build_plan
from pyfelix.lab.conformance.report import ConformanceReport
from pyfelix.lab.conformance.suite import DATAPLANE_NAMES, DEFAULT_PROBE_TIMEOUT, run_dataplane
from pyfelix.lab.family import IP_FAMILIES

if TYPE_CHECKING:
    from pyfelix.lab.conformance.suite import AfterStep


def run_conformance(
    dataplanes: Sequence[str],
    *,
    case_patterns: Sequence[str] = (),
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    max_workers: int = DEFAULT_MAX_WORKERS,
    interface_prefix: str = "cali",
    nodes: int = 1,
    ip_family: str = "ipv4",
    progress: Callable[[str], None] | None = None,
    after_step: AfterStep | None = None,
) -> ConformanceReport:
    """Run the selected cases on each dataplane in turn (one lab per dataplane), with the
    pods spread over `nodes` nodes (several: confd + BIRD route between them), over the
    IP family(ies) `ip_family` (lab.family). `after_step` is called after each case is
    probed, while its policy is in force (suite.run_dataplane)."""
    cases = select_cases(ALL_CASES, case_patterns)
    if not cases:
        raise ValueError(f"no case matches {list(case_patterns)}")
    plan = build_plan(cases, nodes=nodes, ip_family=ip_family)
    started = time.monotonic()
    outcomes = [
        run_dataplane(cases, dataplane, probe_timeout=probe_timeout, max_workers=max_workers,
                      interface_prefix=interface_prefix, plan=plan,
                      progress=progress, after_step=after_step)
        for dataplane in dataplanes
    ]
    return ConformanceReport(outcomes, time.monotonic() - started)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Network-policy conformance suite: x/y/z x a/b/c reachability matrices "
                    "on real agents in a network-namespace lab.")
    parser.add_argument("--dataplane", action="append", choices=DATAPLANE_NAMES,
                        help="dataplane to run (repeatable; default: "
                             f"{', '.join(CONFORMANT_DATAPLANES)})")
    parser.add_argument("--case", action="append", default=[], metavar="PATTERN",
                        help="run only cases whose name contains PATTERN (repeatable; the "
                             "cases they follow are included)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument("--probe-timeout", type=float, default=DEFAULT_PROBE_TIMEOUT,
                        help="seconds before a probe without answer counts as deny")
    parser.add_argument("--workers", type=int, default=DEFAULT_MAX_WORKERS,
                        help="probes in flight at once")
    parser.add_argument("--nodes", type=int, default=1,
                        help="spread the pods over this many nodes (BGP between them)")
    parser.add_argument("--ip-family", choices=IP_FAMILIES, default="ipv4",
                        help="pods' addresses and probes: ipv4, ipv6 (every address, CIDR and "
                             "ICMP rule mapped to IPv6) or dual (every cell over both)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--emit-scenario", metavar="FILE",
                        help="write the suite as a lab scenario (steps form) and exit")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m pyfelix.lab.conformance"
         ) -> int:
    """The command line; `prog` names the command in --help (`pyfelix lab conformance`)."""
    args = _parser(prog).parse_args(argv)
    if not 0.05 <= args.probe_timeout <= 30:
        print("--probe-timeout must be between 0.05 and 30 seconds", file=sys.stderr)
        return 2
    if not 1 <= args.nodes <= 9:
        print("--nodes must be between 1 and 9", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return 2
    cases = select_cases(ALL_CASES, args.case)
    if not cases:
        print(f"no case matches {args.case}", file=sys.stderr)
        return 2
    if args.list:
        for case in cases:
            follows = f" (follows {case.follows})" if case.follows else ""
            print(f"{case.name:<48} {case.group:<10} {case.summary}{follows}")
        return 0
    if args.emit_scenario:
        plan = build_plan(cases, nodes=args.nodes)
        with open(args.emit_scenario, "w") as out:
            yaml.dump(plan.scenario_data, out, sort_keys=False,
                      Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
        print(f"wrote {len(plan.steps)} steps, {plan.probe_count} cells to "
              f"{args.emit_scenario}", file=sys.stderr)
        return 0
    if os.geteuid() != 0:
        print("the lab creates network namespaces: run it as root", file=sys.stderr)
        return 2
    from pyfelix.lab.runner import LabInterrupted

    prefix = os.environ.get("FELIX_INTERFACEPREFIX", "cali").split(",")[0].strip() or "cali"
    try:
        report = run_conformance(
            args.dataplane or CONFORMANT_DATAPLANES, case_patterns=args.case,
            probe_timeout=args.probe_timeout, max_workers=args.workers,
            interface_prefix=prefix, nodes=args.nodes, ip_family=args.ip_family,
            progress=lambda m: print(m, file=sys.stderr, flush=True))
    except LabInterrupted as exc:
        print(f"conformance: interrupted ({exc}); lab torn down", file=sys.stderr)
        return 128 + exc.signum
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.format_text())
    return 0 if report.all_agree else 1


if __name__ == "__main__":
    sys.exit(main())

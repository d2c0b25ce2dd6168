"""A flood of new flows against a real agent with flow logs on (used by
test_lab_flow_logs.py on both dataplanes, in the same lab as its other checks).

The scanner pod of calico-gnp-order offers the node 100,000 new UDP flows a second for 5 s
(a fresh 5-tuple per frame) to the api pod, whose ingress policy denies them all. The
generator, pyfelix/bench/c/flow_flood.c, writes pre-built Ethernet frames to the scanner's
eth0 on a packet socket (no routing or IP output on the sending side, qdisc bypassed); the
veth hands each frame to the node's dataplane in the generator's own softirq, so the
generator's CPU time is the dataplane's cost per new flow. It runs SCHED_FIFO (a NIC's
softirq would preempt the machine's other tasks the same way), pinned: BPF needs one CPU
(~7 us of CPU a frame here, most of it the two tc programs' conntrack and policy lookups),
iptables two generators, one per CPU, at half the rate each (~14 us a frame: nft rule
traversal and two NFLOG messages built per frame), which leaves the agent the rest. Paced
at 250,000/s instead, they reached 174,500/s (BPF, one CPU) and 131,500/s (iptables, two;
one CPU alone: ~72,000/s) on this shared 2-core VM.

The verdict mix: every frame is two policy decisions (the scanner's egress profile allows
the new flow, api's ingress policy denies it) and crosses the node's routing, so it costs
two flow events (BPF: ring-buffer events under the in-kernel budget; iptables: NFLOG
messages under the reader's budget), the most the flow logs can be asked per frame; dropped
before api, it draws no reply. Allowed flows to api would add api's stack and replies to
every frame, i.e. test the pod rather than the agent. (iptables keeps no conntrack entry of
a dropped new flow, the drop coming before confirmation; BPF's conntrack LRU map takes an
entry per frame, perf shows the inserts, and evicts the oldest.)

Asserted: the frames reached the node at >= 100,000/s, counted by the kernel (the host-side
veth's rx packets over the generators' sending time; on iptables also the deny rule's own
counter, on BPF also logged + dropped == 2 decisions a frame); the agent's health endpoint
answered every poll (each within its own timeout) during the flood; afterwards the agent
still wrote flows, counted what it dropped (`pyfelix_flow_log_events_dropped_total` grew) and
enforced the scenario's probes. The figures are printed (`pytest -s`); on this shared 2-core
machine they are lower bounds of what the dataplanes can take.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyfelix.lab.agents import AgentProcesses
from pyfelix.lab.flows import read_records
from pyfelix.lab.netns import in_netns
from pyfelix.lab.runner import LabRunner
from pyfelix.lab.topology import HOST_SIDE_MAC, POD_IFNAME

REPO = Path(__file__).resolve().parents[3]
FLOOD_SOURCE = REPO / "pyfelix" / "bench" / "c" / "flow_flood.c"
RATE, SECONDS = 100_000, 5
PACED_RATE = 102_000  # 2% over RATE: a generator that keeps up measures above RATE
FRAMES = PACED_RATE * SECONDS  # one new flow each
# generators, each pinned to its own CPU (of those this process may use, in turn) with its
# share of the rate: the frames' dataplane work runs in the generator's softirq, so the CPUs
# it needs are the dataplane's cost per new flow
SENDERS = {"bpf": 1, "iptables": 2}
RT_PRIORITY = 1  # SCHED_FIFO, as a NIC's softirq would preempt the machine's other tasks
STRAY_FRAMES = 16  # other frames the scanner may send meanwhile (none expected)
HEALTH_PORT, METRICS_PORT = 9099, 9091
POLL_TIMEOUT = 5.0  # one health answer may take this long under the flood


def _http_get(netns: str, port: int, path: str) -> tuple[int, str]:
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(POLL_TIMEOUT)
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    return int(head.split()[1]), body


def _dropped(netns: str) -> float:
    _, body = _http_get(netns, METRICS_PORT, "/metrics")
    match = re.search(r"^pyfelix_flow_log_events_dropped_total (\S+)$", body, re.M)
    return float(match.group(1)) if match else 0.0


FLOOD_AGENT_ENV = {"FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.1",
                   "FELIX_PROMETHEUSMETRICSENABLED": "true",
                   "FELIX_PROMETHEUSMETRICSHOST": "127.0.0.1"}


@dataclass(frozen=True)
class LinkCounters:
    """One interface's kernel counters (`ip -s`): what crossed it, what it dropped."""

    rx_packets: int
    rx_dropped: int
    tx_packets: int
    tx_dropped: int

    def __sub__(self, before: LinkCounters) -> LinkCounters:
        return LinkCounters(self.rx_packets - before.rx_packets,
                            self.rx_dropped - before.rx_dropped,
                            self.tx_packets - before.tx_packets,
                            self.tx_dropped - before.tx_dropped)


def _link_counters(netns: str, ifname: str) -> LinkCounters:
    proc = subprocess.run(["ip", "-n", netns, "-j", "-s", "link", "show", "dev", ifname],
                          capture_output=True, text=True, check=True, timeout=30)
    [link] = json.loads(proc.stdout)
    stats = link["stats64"]
    return LinkCounters(stats["rx"]["packets"], stats["rx"]["dropped"],
                        stats["tx"]["packets"], stats["tx"]["dropped"])


@dataclass
class FloodResult:
    dataplane: str
    sent: int  # the generators' count of frames the kernel accepted
    seconds: float  # the slowest generator's time to send its share
    send_errors: int
    cpus: list[int]  # the generators' CPUs
    host: LinkCounters  # the scanner's host-side veth during the flood: the kernel's count
    denied_by_rule: int | None  # iptables: the deny-scanner rule's kernel counter meanwhile
    dropped: float
    polls: list[tuple[float, int | str]]
    records: list[dict[str, Any]]  # the flood's records (scanner -> api, UDP)
    during: list[dict[str, Any]]  # those that started during the flood
    after: list[Any]  # the scenario's probes, run again after the flood

    def check(self) -> None:
        logged = sum(r["policy_packets"] for r in self.records)
        delivered = self.host.rx_packets
        offered = delivered / self.seconds
        print(f"\n{self.dataplane}: {delivered:,} new flows reached the node in "
              f"{self.seconds} s: {offered:,.0f}/s offered (kernel-counted, host-side veth "
              f"rx; generators on CPUs {self.cpus}: {self.sent:,} sent, "
              f"{self.send_errors} send errors; veth "
              f"drops rx {self.host.rx_dropped} tx {self.host.tx_dropped}"
              + (f"; deny rule matched {self.denied_by_rule:,}"
                 if self.denied_by_rule is not None else "") + "); logged "
              f"{logged:,} in {len(self.records)} records; dropped {self.dropped:,.0f}; "
              f"health polls {len(self.polls)}, slowest "
              f"{max(t for t, _ in self.polls) * 1000:.0f} ms")
        # the flood really happened at the rate: every frame crossed the veth (the kernel's
        # count, a few frames of other traffic aside) within SECONDS of pacing
        assert self.sent == FRAMES and self.seconds >= SECONDS - 0.01, (
            self.sent, self.seconds)
        assert FRAMES <= delivered <= FRAMES + STRAY_FRAMES, (delivered, FRAMES)
        assert offered >= RATE, (f"offered {offered:,.0f} new flows/s < {RATE:,}: the "
                                 f"generators on CPUs {self.cpus} fell behind", self.seconds)
        assert self.polls and all(status == 200 for _, status in self.polls), self.polls
        assert len(self.polls) >= SECONDS, self.polls  # it kept answering through the flood
        # api's ingress denied every flood packet (the scanner's egress profile allowed each
        # new flow first: those are the `src` records)
        ingress = [r for r in self.records if r["reporter"] == "dst"]
        assert self.during and ingress and all(
            (r["action"], r["policies"]["all_policies"])
            == ("deny", ["0|default|deny-scanner|deny|0"]) for r in ingress), ingress[:3]
        # each packet is at most two decisions (egress, ingress): logged or counted as dropped
        assert self.dropped > 0 and logged + self.dropped <= 2 * self.sent, (
            logged, self.dropped, self.sent)
        if self.dataplane == "bpf":  # the kernel accounts for every decision
            assert logged + self.dropped == 2 * self.sent, (logged, self.dropped, self.sent)
        else:  # the deny rule matched every frame
            assert self.denied_by_rule == self.sent, (self.denied_by_rule, self.sent)


DENY_RULE_LOG = re.compile(  # [packets:bytes] ... the rule's NFLOG prefix names the policy
    r'^\[(\d+):\d+\] -A \S+ .*--nflog-prefix "DI\w*\|default\|deny-scanner"')


def _deny_rule_packets(netns: str) -> int:
    """iptables: the packets api's deny-scanner rule has matched (its NFLOG rule's kernel
    counter, `iptables-save -c` in the node's namespace; the DROP beside it counts the same)."""
    proc = subprocess.run(["ip", "netns", "exec", netns, "iptables-save", "-c", "-t", "filter"],
                          capture_output=True, text=True, check=True, timeout=30)
    counts = [int(m.group(1)) for line in proc.stdout.splitlines()
              if (m := DENY_RULE_LOG.match(line))]
    assert counts, f"no deny-scanner NFLOG rule in {netns}:\n{proc.stdout}"
    return sum(counts)


def flood_and_check(lab: LabRunner, agents: AgentProcesses, dataplane: str,
                    workdir: Path) -> FloodResult:
    """Run the flood against a lab of calico-gnp-order whose agents write flow logs and
    serve health and metrics (FLOOD_AGENT_ENV); poll health throughout; gather what
    `FloodResult.check()` asserts, with the kernel's count of the frames that reached the
    node (the scanner's host-side veth). Call inside the lab, after its steps."""
    flood = workdir / "flow_flood"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(flood), str(FLOOD_SOURCE)], check=True,
                   timeout=120)
    [node] = lab.topology.nodes.values()
    scanner, api = lab.topology.pods["prod/scanner"], lab.topology.pods["prod/api"]
    dropped_before = _dropped(node.netns)
    polls: list[tuple[float, int | str]] = []
    stop = threading.Event()

    def poll_health() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                status: int | str = _http_get(node.netns, HEALTH_PORT, "/liveness")[0]
            except OSError as exc:
                status = repr(exc)
            polls.append((time.monotonic() - started, status))
            stop.wait(0.25)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    host_before = _link_counters(node.netns, scanner.host_ifname)
    denied_before = _deny_rule_packets(node.netns) if dataplane == "iptables" else 0
    usable = sorted(os.sched_getaffinity(0))
    cpus = [usable[i % len(usable)] for i in range(SENDERS[dataplane])]
    flood_started = time.time()
    senders = [subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{scanner.netns}", "chrt", "-f", str(RT_PRIORITY),
         str(flood), POD_IFNAME, HOST_SIDE_MAC, str(scanner.spec.ip), str(api.spec.ip),
         str(PACED_RATE // len(cpus)), str(FRAMES // len(cpus)), "64",
         str(1 + 64 * i), str(cpu)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, cpu in enumerate(cpus)]
    try:
        outputs = [proc.communicate(timeout=3 * SECONDS + 60) for proc in senders]
    finally:  # interrupted or timed out: no generator outlives the test
        for proc in senders:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    flood_ended = time.time()
    host = _link_counters(node.netns, scanner.host_ifname) - host_before
    denied_by_rule = (_deny_rule_packets(node.netns) - denied_before
                      if dataplane == "iptables" else None)
    time.sleep(3)  # flushes every second: the flood's last records and drop counts
    stop.set()
    poller.join(timeout=POLL_TIMEOUT + 1)
    assert all(proc.returncode == 0 for proc in senders), outputs
    figures = [out.split() for out, _ in outputs]
    records = [r for r in read_records(agents.flow_log_dirs.values())
               if r["source_ip"] == str(scanner.spec.ip) and r["proto"] == "udp"
               and r["dest_ip"] == str(api.spec.ip)]
    return FloodResult(
        dataplane, sent=sum(int(f[0]) for f in figures),
        seconds=max(float(f[1]) for f in figures),
        send_errors=sum(int(f[2]) for f in figures), cpus=cpus, host=host,
        denied_by_rule=denied_by_rule,
        dropped=_dropped(node.netns) - dropped_before, polls=polls, records=records,
        during=[r for r in records if flood_started - 1 <= r["start_time"] <= flood_ended],
        after=lab.run_probes(lab.scenario.probes, step=99))

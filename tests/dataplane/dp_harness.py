"""Test harness: the iptables + ipsets managers on FakeCommands, and verdicts via PacketWalker."""

from __future__ import annotations

from collections.abc import Iterable

from pyfelix.agent.dataplane.managers.ipsets import IPSetsManager
from pyfelix.agent.dataplane.managers.iptables import IptablesManager
from pyfelix.agent.proto import InSync, WorkloadEndpoint, WorkloadEndpointID, WorkloadEndpointUpdate
from tests.fakes.commands import FakeCommands
from tests.fakes.netfilter import Packet, PacketWalker


class Harness:
    def __init__(self, **iptables_kw: object) -> None:
        self.cmds = FakeCommands()
        self.ipsets = IPSetsManager(runner=self.cmds)
        self.iptables = IptablesManager(runner=self.cmds, **iptables_kw)  # type: ignore[arg-type]
        self.walker = PacketWalker(self.cmds.iptables, self.cmds.ipset)

    def feed(self, msgs: Iterable[object]) -> None:
        for msg in msgs:
            self.ipsets.on_update(msg)
            self.iptables.on_update(msg)

    def apply(self) -> None:
        """One loop round: ipsets create/fill -> iptables -> ipsets deletions."""
        self.ipsets.apply()
        self.iptables.apply()
        self.ipsets.finish_apply()

    def sync(self, msgs: Iterable[object]) -> None:
        self.feed(msgs)
        self.feed([InSync()])
        self.apply()

    def forward(self, src_if: str, dst_if: str, **packet: object) -> str:
        """Verdict for a packet routed from workload interface src_if to dst_if."""
        return self.walker.verdict("FORWARD", Packet(iif=src_if, oif=dst_if, **packet))

    def to_host(self, src_if: str, **packet: object) -> str:
        return self.walker.verdict("INPUT", Packet(iif=src_if, **packet))


def endpoint(name: str, ip: str, *, tiers=(), profiles=(), state="active"):  # type: ignore[no-untyped-def]
    return WorkloadEndpointUpdate(
        WorkloadEndpointID("k8s", f"ns/{name}", "eth0"),
        WorkloadEndpoint(state=state, name=name, ipv4_nets=(f"{ip}/32",),
                         profile_ids=tuple(profiles), tiers=tuple(tiers)),
    )

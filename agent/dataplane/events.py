"""Messages the dataplane makes for itself: interface state from the interface monitor.

Role: the interface monitor (`agent.dataplane.ifacemonitor`) turns netlink link/address
events into these, and puts them on the driver loop's queue beside the calc graph's
`agent.proto` messages; managers receive both through `on_update`.

Invariants: the monitor sends an update only when something changed; `state == "absent"`
(or `addrs is None`) means the interface is gone; after a monitor resync every interface
that exists has been reported and every one that vanished reported absent.
"""

from __future__ import annotations

from dataclasses import dataclass

IFACE_UP = "up"  # administratively up AND carrier (IFF_UP and IFF_LOWER_UP/RUNNING)
IFACE_DOWN = "down"  # exists, but not up or no carrier
IFACE_ABSENT = "absent"  # gone


@dataclass(frozen=True)
class InterfaceUpdate:
    name: str
    index: int
    state: str  # IFACE_UP | IFACE_DOWN | IFACE_ABSENT


@dataclass(frozen=True)
class InterfaceAddrsUpdate:
    """All addresses (CIDR strings, e.g. "10.0.0.1/24") of one interface; None when it is gone."""

    name: str
    addrs: frozenset[str] | None

"""The `config` map: dataplane-wide settings in one array entry (bpf/include/config.h).

endpoint_to_host_action is Felix's DefaultEndpointToHostAction for new flows from a workload
to this host: DROP (the zero value, Felix's default), ACCEPT, or RETURN (treated as ACCEPT:
the tc programs have no host-endpoint policy yet). The low bits of `flags` are Felix's
BPFEnforceRPF for host endpoint interfaces (calico_from_hep): STRICT (the zero value),
LOOSE or DISABLED. The REDIRECT_DISABLED bit of `flags` is Felix's BPFRedirectToPeer=Disabled:
otherwise (the zero value) the tc programs redirect allowed pod-to-local-pod packets to the
destination's interface past the host stack (bpf/tc.c, fastpath_verdict).
"""

from __future__ import annotations

import ctypes
import enum
import os
import struct

from pyfelix.agent.bpf.maps.base import BpfMap, MapParams, MapType


class EndpointToHostAction(enum.IntEnum):
    """must match EP_TO_HOST_* in bpf/include/config.h"""

    DROP = 0
    ACCEPT = 1
    RETURN = 2


class RpfMode(enum.IntEnum):
    """must match CFG_RPF_* in bpf/include/config.h"""

    STRICT = 0
    LOOSE = 1
    DISABLED = 2


RPF_MASK = 0x3
REDIRECT_DISABLED = 0x4  # must match CFG_REDIRECT_DISABLED in bpf/include/config.h
CTLB_UDP = 0x8  # must match CFG_CTLB_UDP: BPFConnectTimeLoadBalancing=Enabled (bpf/ctlb.c)
IPV6_DISABLED = 0x10  # must match CFG_IPV6_DISABLED: Ipv6Support false
FLOW_EVENTS = 0x20  # must match CFG_F_FLOW_EVENTS: the programs send flow events
DROP_VXLAN_FROM_WEP = 0x40  # must match CFG_DROP_VXLAN_FROM_WEP
DROP_IPIP_FROM_WEP = 0x80  # must match CFG_DROP_IPIP_FROM_WEP
VXLAN_PORT_SHIFT = 16  # must match CFG_VXLAN_PORT_SHIFT


class Value(ctypes.Structure):
    """must match struct config_value in bpf/include/config.h"""

    _fields_ = [("flags", ctypes.c_uint32), ("endpoint_to_host_action", ctypes.c_uint32)]


PARAMS = MapParams(
    name="config", map_type=MapType.ARRAY, key_type=ctypes.c_uint32, value_type=Value,
    max_entries=1, version=1, header="config.h",
)

KEY = struct.pack("=I", 0)
_VALUE = struct.Struct("=II")


def encode_value(endpoint_to_host_action: EndpointToHostAction,
                 rpf: RpfMode = RpfMode.STRICT, *, redirect: bool = True,
                 ctlb_udp: bool = False, ipv6: bool = True,
                 flow_events: bool = False, drop_vxlan_port: int = 0,
                 drop_ipip: bool = False) -> bytes:
    """`drop_vxlan_port`: VXLAN in use and not allowed from workloads (0: allowed or off)."""
    if not 0 <= drop_vxlan_port < 65536:
        raise ValueError(f"VXLANPort: {drop_vxlan_port} is not 1..65535")
    flags = int(rpf) | (0 if redirect else REDIRECT_DISABLED) | (CTLB_UDP if ctlb_udp else 0)
    flags |= 0 if ipv6 else IPV6_DISABLED
    flags |= FLOW_EVENTS if flow_events else 0
    if drop_vxlan_port:
        flags |= DROP_VXLAN_FROM_WEP | (drop_vxlan_port << VXLAN_PORT_SHIFT)
    flags |= DROP_IPIP_FROM_WEP if drop_ipip else 0
    return _VALUE.pack(flags, int(endpoint_to_host_action))


def redirect_from_felix(text: str) -> bool:
    """Felix's BPFRedirectToPeer ("Enabled" | "L2Only" | "Disabled") -> redirect or not.
    pyfelix's pods are all layer-2 (veth) interfaces, so L2Only behaves as Enabled."""
    value = text.strip().lower()
    if value not in ("enabled", "l2only", "disabled"):
        raise ValueError(f"BPFRedirectToPeer: {text!r} is not one of Enabled, L2Only, Disabled")
    return value != "disabled"


def rpf_from_felix(text: str) -> RpfMode:
    """Felix's BPFEnforceRPF ("Strict" | "Loose" | "Disabled") -> the map's enum."""
    try:
        return RpfMode[text.strip().upper()]
    except KeyError:
        raise ValueError(f"BPFEnforceRPF: {text!r} is not one of Strict, Loose, Disabled") \
            from None


def action_from_felix(text: str) -> EndpointToHostAction:
    """Felix's config string ("Drop" | "Accept" | "Return") -> the map's enum."""
    try:
        return EndpointToHostAction[text.strip().upper()]
    except KeyError:
        raise ValueError(
            f"DefaultEndpointToHostAction: {text!r} is not one of Drop, Accept, Return"
        ) from None


def decode_value(raw: bytes) -> dict:
    flags, action = _VALUE.unpack(raw)
    try:
        name = EndpointToHostAction(action).name
    except ValueError:
        name = str(action)
    try:
        rpf = RpfMode(flags & RPF_MASK).name
    except ValueError:
        rpf = str(flags & RPF_MASK)
    return {"flags": flags, "endpoint_to_host_action": name, "bpf_enforce_rpf": rpf,
            "bpf_redirect_to_peer": "Disabled" if flags & REDIRECT_DISABLED else "Enabled",
            "ctlb_udp": bool(flags & CTLB_UDP),
            "ipv6_support": not flags & IPV6_DISABLED, "flow_events": bool(flags & FLOW_EVENTS),
            "drop_vxlan_from_workloads_port": (flags >> VXLAN_PORT_SHIFT
                                               if flags & DROP_VXLAN_FROM_WEP else 0),
            "drop_ipip_from_workloads": bool(flags & DROP_IPIP_FROM_WEP)}


def open_pinned(pin_dir: str | os.PathLike[str]) -> BpfMap:
    return BpfMap.open_pinned(PARAMS, pin_dir)


def dump(m: BpfMap) -> list[dict]:
    raw = m.lookup(KEY)
    return [decode_value(raw)] if raw is not None else []

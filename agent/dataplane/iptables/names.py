"""Names of everything the iptables dataplane creates: chains, IP sets, marks, comments.

Role: ONE place that decides how our kernel objects are named, so they are recognisable as
ours (ownership first) and fit the kernel's limits:
- chains start with `cali-` (Calico's names) and are at most 28 characters (the xtables
  limit); policy and profile chains use a hash of the (tier, name) or profile id, since those
  names can be long and contain any character;
- IP sets are `cali40s:<hash>` (hash:net, selector/net sets) and `cali40n:<hash>` (hash:net,port,
  named ports): 30 characters, under ipset's 31; these two families belong to the IP-sets
  manager. Fixed-name sets belong to the manager that needs them, in both dataplane modes:
  `cali40this-host` (this host's addresses, host-IPs manager), `cali40masq-ipam-pools` and
  `cali40all-ipam-pools` (NAT outgoing; `cali60masq-ipam-pools` / `cali60all-ipam-pools`
  for IPv6), `cali40all-vxlan-net` (the nodes' VXLAN parent IPs, iptables manager), as
  Felix names them;
- every rule we write carries the comment `cali:<rule hash>`; a DROP that exists for a reason
  an operator must be able to read off `iptables-save -c` carries a second comment
  `pyfelix: <reason>` (spoofed source, unknown workload interface, IPv6 not policed).
"""

from __future__ import annotations

import base64
import hashlib

CHAIN_PREFIX = "cali-"
MAX_CHAIN_NAME = 28
HASH_COMMENT_PREFIX = "cali:"
IPSET_PREFIX = "cali40"
# The calc graph's sets (IPSetsManager): hashed names.
CALC_IPSET_PREFIXES = (f"{IPSET_PREFIX}s:", f"{IPSET_PREFIX}n:")
# IPv6 twins of the calc graph's sets (family inet6), for the ip6tables rules
IPSET_PREFIX6 = "cali60"
CALC_IPSET_PREFIXES6 = (f"{IPSET_PREFIX6}s:", f"{IPSET_PREFIX6}n:")
IPSET_THIS_HOST = f"{IPSET_PREFIX}this-host"
IPSET_MASQ_POOLS = f"{IPSET_PREFIX}masq-ipam-pools"
IPSET_ALL_POOLS = f"{IPSET_PREFIX}all-ipam-pools"
IPSET_MASQ_POOLS6 = f"{IPSET_PREFIX6}masq-ipam-pools"  # IPv6 NAT outgoing (family inet6)
IPSET_ALL_POOLS6 = f"{IPSET_PREFIX6}all-ipam-pools"
IPSET_ALL_VXLAN = f"{IPSET_PREFIX}all-vxlan-net"
IPSET_ALL_VXLAN6 = f"{IPSET_PREFIX6}all-vxlan-net"  # IPv6 VTEPs' parents (vxlan-v6.calico)
IPSET_ALL_HOSTS = f"{IPSET_PREFIX}all-hosts-net"  # the nodes IPIP is accepted from (Felix's)
MAX_IPSET_NAME = 31
MAX_IFACE_NAME = 15

CHAIN_FORWARD = "cali-FORWARD"
CHAIN_INPUT = "cali-INPUT"
CHAIN_FROM_WL_DISPATCH = "cali-from-wl-dispatch"
CHAIN_TO_WL_DISPATCH = "cali-to-wl-dispatch"
CHAIN_WL_TO_HOST = "cali-wl-to-host"
CHAIN_OUTPUT = "cali-OUTPUT"
CHAIN_PREROUTING = "cali-PREROUTING"
CHAIN_POSTROUTING = "cali-POSTROUTING"
CHAIN_NAT_OUTGOING = "cali-nat-outgoing"
CHAIN_FIP_DNAT = "cali-fip-dnat"  # nat table: floating IP -> workload IP (Felix's)
CHAIN_FIP_SNAT = "cali-fip-snat"  # nat table: a workload reaching its own floating IP
CHAIN_FROM_HOST_DISPATCH = "cali-from-host-endpoint"
CHAIN_TO_HOST_DISPATCH = "cali-to-host-endpoint"
CHAIN_FROM_HEP_FORWARD_DISPATCH = "cali-from-hep-forward"
CHAIN_TO_HEP_FORWARD_DISPATCH = "cali-to-hep-forward"
CHAIN_FAILSAFE_IN = "cali-failsafe-in"
CHAIN_FAILSAFE_OUT = "cali-failsafe-out"
# raw table, iptables mode: the source check (anti-spoofing) of packets from workloads
CHAIN_WL_SRC_DISPATCH = "cali-wl-src-dispatch"
# Felix's name for the chains of a host endpoint with interfaceName "*".
ALL_INTERFACES_CHAIN_SUFFIX = "any-interface-at-all"

# Second comments of DROP rules: why the packet was dropped (counted by iptables-save -c).
COMMENT_SPOOFED_SOURCE = "pyfelix: spoofed source"
COMMENT_UNKNOWN_WORKLOAD = "pyfelix: no workload endpoint"
COMMENT_IPV6_DISABLED = "pyfelix: Ipv6Support false"

IPSET_TYPE_NET = "net"  # proto.IPSetUpdate.type -> kernel type hash:net
IPSET_TYPE_IP_PORT = "ip_port"  # -> hash:net,port
KERNEL_IPSET_TYPES = {IPSET_TYPE_NET: "hash:net", IPSET_TYPE_IP_PORT: "hash:net,port"}


def short_hash(text: str, length: int) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()[:length]


def policy_chain_name(tier: str, name: str, inbound: bool) -> str:
    return ("cali-pi-" if inbound else "cali-po-") + short_hash(f"{tier}/{name}", 18)


def profile_chain_name(profile_id: str, inbound: bool) -> str:
    return ("cali-pri-" if inbound else "cali-pro-") + short_hash(profile_id, 18)


def endpoint_chain_name(iface: str, to_workload: bool) -> str:
    """cali-tw-<iface> (traffic to the workload: ingress policy) / cali-fw-<iface>."""
    return ("cali-tw-" if to_workload else "cali-fw-") + iface


def source_check_chain_name(iface: str) -> str:
    """cali-ws-<iface>: the sources a workload may send from (raw table)."""
    return "cali-ws-" + iface


def reason_comment(reason: str) -> str:
    """The match that names why a rule drops (a second comment after the hash comment)."""
    return f'-m comment --comment "{reason}"'


def host_endpoint_chain_name(iface: str, *, to_host_endpoint: bool, forward: bool = False) -> str:
    """cali-th-<iface> (leaving the host through it: egress policy) / cali-fh-<iface>
    (arriving: ingress policy); cali-thfw-/cali-fhfw- for applyOnForward chains. Interface
    "*" (every host interface) uses Felix's `any-interface-at-all` (`any-interface` in the
    forward chains, to fit the 28-character limit)."""
    suffix = iface
    if iface == "*":
        suffix = "any-interface" if forward else ALL_INTERFACES_CHAIN_SUFFIX
    kind = ("th" if to_host_endpoint else "fh") + ("fw" if forward else "")
    return f"cali-{kind}-{suffix}"


def ipset_name(set_id: str, set_type: str, family: int = 4) -> str:
    """The kernel name of a calc-graph set: `cali40s:<hash>` / `cali40n:<hash>`, or the
    IPv6 twin `cali60s:<hash>` / `cali60n:<hash>` (same hash: one set id, two families)."""
    letter = "n" if set_type == IPSET_TYPE_IP_PORT else "s"
    prefix = IPSET_PREFIX if family == 4 else IPSET_PREFIX6
    return f"{prefix}{letter}:{short_hash(set_id, 22)}"


def ipset_name6(set_id: str, set_type: str) -> str:
    return ipset_name(set_id, set_type, 6)


def valid_iface_name(name: str) -> bool:
    return (
        0 < len(name) <= MAX_IFACE_NAME
        and name not in (".", "..")
        and all(c.isalnum() or c in "-_." for c in name)
    )

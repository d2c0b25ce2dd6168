"""Names of everything the iptables dataplane creates: chains, IP sets, marks, comments.

Role: ONE place that decides how our kernel objects are named, so they are recognisable as
ours (ownership first) and fit the kernel's limits:
- chains start with `cali-` (Calico's names) and are at most 28 characters (the xtables
  limit); policy and profile chains use a hash of the (tier, name) or profile id, since those
  names can be long and contain any character;
- IP sets are `cali40s:<hash>` (hash:net, selector/net sets) and `cali40n:<hash>` (hash:net,port,
  named ports): 30 characters, under ipset's 31;
- every rule we write carries the comment `cali:<rule hash>`.
"""

from __future__ import annotations

import base64
import hashlib

CHAIN_PREFIX = "cali-"
MAX_CHAIN_NAME = 28
HASH_COMMENT_PREFIX = "cali:"
IPSET_PREFIX = "cali40"
MAX_IPSET_NAME = 31
MAX_IFACE_NAME = 15

CHAIN_FORWARD = "cali-FORWARD"
CHAIN_INPUT = "cali-INPUT"
CHAIN_FROM_WL_DISPATCH = "cali-from-wl-dispatch"
CHAIN_TO_WL_DISPATCH = "cali-to-wl-dispatch"
CHAIN_WL_TO_HOST = "cali-wl-to-host"

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


def ipset_name(set_id: str, set_type: str) -> str:
    letter = "n" if set_type == IPSET_TYPE_IP_PORT else "s"
    return f"{IPSET_PREFIX}{letter}:{short_hash(set_id, 22)}"


def valid_iface_name(name: str) -> bool:
    return (
        0 < len(name) <= MAX_IFACE_NAME
        and name not in (".", "..")
        and all(c.isalnum() or c in "-_." for c in name)
    )

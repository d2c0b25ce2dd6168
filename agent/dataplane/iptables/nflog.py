"""NFLOG prefixes of the iptables dataplane's flow-log rules: which rule decided a packet.

Role: the iptables twin of the BPF rule counters' metadata. With flow logs on
(`FlowLogsFileEnabled`), the renderer puts an NFLOG rule before every decision a new flow
can meet (established packets are accepted before policy, so only a flow's first packet
gets there, and every packet of a denied one):

    group 1 (GROUP_DENY)   before each Deny rule's DROP, the end-of-tier DROP, the final
                           DROP when no profile allowed, a dropped unknown policy
    group 2 (GROUP_ALLOW)  after each Allow rule set the ACCEPT mark, before its RETURN

with a prefix naming the rule (Felix's Prometheus reporter encodes its prefixes the same
way, in its own format):

    <A|D><I|O><kind><index>|<tier>|<owner>
        A/D     allow / deny;  I/O: the endpoint's inbound (to it) or outbound policy
        kind    P policy rule, R profile rule, T end of tier, X no policy or profile allowed
        index   the rule's index in its policy/profile direction (absent for T and X)
        e.g.    DIP0|default|deny-scanner   AOR2||kns.prod   DIT|default|   DIX||

A prefix longer than NFLOG's 63 bytes keeps its head and replaces `<tier>|<owner>` with
`#<hash of tier/owner>`; the reader resolves the hash from the policies and profiles it has
seen (`PrefixDecoder.learn`). Outputs of `decode()`: a `RuleMeta` (agent.proto: the record
the BPF compiler attaches to its rule counters), or None for a prefix that is not ours.
"""

from __future__ import annotations

from pyfelix.agent.dataplane.iptables.names import short_hash
from pyfelix.agent.proto import RuleMeta

GROUP_DENY = 1
GROUP_ALLOW = 2
MAX_PREFIX = 63  # xt_NFLOG: 64 bytes with the terminating NUL
KIND_LETTERS = {"policy": "P", "profile": "R", "tier-end": "T", "default-deny": "X"}
KIND_OF_LETTER = {v: k for k, v in KIND_LETTERS.items()}


def _owner_hash(tier: str, owner: str) -> str:
    return "#" + short_hash(f"{tier}/{owner}", 16)


def prefix(action: str, inbound: bool, kind: str, index: int = -1, tier: str = "",
           owner: str = "") -> str:
    head = (("A" if action == "allow" else "D") + ("I" if inbound else "O")
            + KIND_LETTERS[kind] + (str(index) if index >= 0 else ""))
    full = f"{head}|{tier}|{owner}"
    if len(full.encode()) <= MAX_PREFIX and '"' not in full and "\\" not in full:
        return full
    return f"{head}|{_owner_hash(tier, owner)}"


def nflog_rule(matches: str, action: str, log_prefix: str) -> str:
    group = GROUP_ALLOW if action == "allow" else GROUP_DENY
    target = f'-j NFLOG --nflog-group {group} --nflog-prefix "{log_prefix}" --nflog-size 80'
    return f"{matches} {target}" if matches else target


class PrefixDecoder:
    """Prefix -> RuleMeta; hashed prefixes resolved from the (tier, owner) pairs learnt."""

    def __init__(self) -> None:
        self._hashed: dict[str, tuple[str, str]] = {}

    def learn(self, tier: str, owner: str) -> None:
        self._hashed[_owner_hash(tier, owner)] = (tier, owner)

    def forget(self, tier: str, owner: str) -> None:
        self._hashed.pop(_owner_hash(tier, owner), None)

    def decode(self, text: str) -> RuleMeta | None:
        head, sep, rest = text.partition("|")
        if not sep or len(head) < 3 or head[0] not in "AD" or head[1] not in "IO":
            return None
        kind = KIND_OF_LETTER.get(head[2])
        if kind is None or (head[3:] and not head[3:].isdigit()):
            return None
        if rest.startswith("#"):
            pair = self._hashed.get(rest)
            if pair is None:
                return None
            tier, owner = pair
        else:
            tier, _, owner = rest.partition("|")
        return RuleMeta(kind, tier, owner, "ingress" if head[1] == "I" else "egress",
                        int(head[3:]) if head[3:] else -1,
                        "allow" if head[0] == "A" else "deny")

"""PacketWalker: evaluates a packet through FakeIptables chains, like netfilter's filter table.

Role: lets unit tests check what rendered chains DO (verdicts), not only what they say. It
understands exactly the matches and targets our renderer emits: -p/! -p, -s/-d (+ !), -i/-o
(with "+" wildcards), -m set [!] --match-set NAME src|dst|src,src|dst,dst (FakeIpset
membership, hash:net and hash:net,port), -m multiport [!] --sports/--dports, --sport/--dport,
-m icmp [!] --icmp-type T[/C], -m icmp6 --icmpv6-type T (IPv6 packets: walk the ip6tables
fake), -m mark --mark V/M, -m conntrack --ctstate, -m comment;
targets ACCEPT, DROP, RETURN, LOG, NFLOG (recorded in `nflogged` as (group, prefix,
packet)), MARK --set-xmark V/M, CT --notrack (recorded in `untracked`), MASQUERADE (a
terminal verdict of the nat table), -j CHAIN, -g CHAIN. Any table
can be walked (`table=`). Anything else raises, so a renderer change that emits something
new cannot silently pass.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, replace

from tests.fakes.ipset import FakeIpset
from tests.fakes.iptables import FakeIptables

PROTO_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132, "udplite": 136, "ipv6-icmp": 58}


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    proto: int = 6
    sport: int = 40000
    dport: int = 80
    icmp_type: int | None = None
    icmp_code: int | None = None
    iif: str = ""
    oif: str = ""
    ctstate: str = "NEW"
    mark: int = 0


class WalkError(Exception):
    pass


class PacketWalker:
    def __init__(self, iptables: FakeIptables, ipset: FakeIpset) -> None:
        self.iptables = iptables
        self.ipset = ipset
        self.logged: list[Packet] = []
        self.nflogged: list[tuple[int, str, Packet]] = []
        self.untracked: list[Packet] = []
        self._table = iptables.chains

    def verdict(self, chain: str, packet: Packet, table: str = "filter") -> str:
        """ACCEPT or DROP (or MASQUERADE in nat) for a packet entering built-in `chain` of
        `table` (policy ACCEPT)."""
        result, _ = self.walk(chain, packet, table)
        return result

    def walk(self, chain: str, packet: Packet, table: str = "filter") -> tuple[str, Packet]:
        """(verdict, packet as it leaves: marks set by the rules) for built-in `chain`."""
        self._table = self.iptables.tables[table]
        result, packet = self._walk(chain, packet, depth=0)
        return ("ACCEPT" if result in ("ACCEPT", "RETURN", None) else result), packet

    # returns (terminal verdict or "RETURN" or None for falling off the end, packet)
    def _walk(self, chain: str, packet: Packet, depth: int) -> tuple[str | None, Packet]:
        if depth > 20:
            raise WalkError("chain recursion too deep")
        for rule in self._table[chain]:
            tokens = shlex.split(rule)
            if not self._matches(tokens, packet):
                continue
            kind, target, args = _target(tokens)
            if target in ("ACCEPT", "DROP", "MASQUERADE"):
                return target, packet
            if target == "CT" and "--notrack" in args:
                self.untracked.append(packet)
                continue
            if target == "RETURN":
                return "RETURN", packet
            if target == "LOG":
                self.logged.append(packet)
                continue
            if target == "NFLOG":
                self.nflogged.append((int(args[args.index("--nflog-group") + 1]),
                                      args[args.index("--nflog-prefix") + 1], packet))
                continue
            if target == "MARK":
                value, mask = (int(x, 16) for x in args[args.index("--set-xmark") + 1].split("/"))
                packet = replace(packet, mark=(packet.mark & ~mask) ^ value)
                continue
            if target not in self._table:
                raise WalkError(f"unknown target {target}")
            result, packet = self._walk(target, packet, depth + 1)
            if result in ("ACCEPT", "DROP", "MASQUERADE"):
                return result, packet
            if kind == "-g":  # goto: a RETURN returns from the calling chain
                return "RETURN", packet
        return None, packet

    def _matches(self, tokens: list[str], p: Packet) -> bool:
        i = 0
        negate = False
        while i < len(tokens):
            tok = tokens[i]
            if tok == "!":
                negate = True
                i += 1
                continue
            if tok in ("-j", "-g"):
                return True
            if tok == "-m":
                i += 2  # the module name; its options follow
                continue
            if tok == "--match-set":
                ok = self._set_member(tokens[i + 1], tokens[i + 2], p)
                step = 3
            else:
                ok = self._match_one(tok, tokens[i + 1], p)
                step = 2
            if ok == negate:
                return False
            negate = False
            i += step
        return True

    def _match_one(self, opt: str, value: str, p: Packet) -> bool:
        if opt == "-p":
            return p.proto == (PROTO_NUMBERS.get(value) or int(value))
        if opt in ("-s", "-d"):
            addr = p.src if opt == "-s" else p.dst
            return ipaddress.ip_address(addr) in ipaddress.ip_network(value)
        if opt in ("-i", "-o"):
            iface = p.iif if opt == "-i" else p.oif
            return iface.startswith(value[:-1]) if value.endswith("+") else iface == value
        if opt == "--comment":
            return True
        if opt == "--ctstate":
            return p.ctstate in value.split(",")
        if opt == "--mark":
            v, m = (int(x, 16) for x in value.split("/"))
            return (p.mark & m) == v
        if opt in ("--sport", "--dport"):
            port = p.sport if opt == "--sport" else p.dport
            lo, _, hi = value.partition(":")
            return int(lo) <= port <= int(hi or lo)
        if opt in ("--sports", "--dports"):
            port = p.sport if opt == "--sports" else p.dport
            for part in value.split(","):
                lo, _, hi = part.partition(":")
                if int(lo) <= port <= int(hi or lo):
                    return True
            return False
        if opt == "--icmpv6-type":
            return p.icmp_type == int(value)
        if opt == "--icmp-type":
            t, _, c = value.partition("/")
            return p.icmp_type == int(t) and (not c or p.icmp_code == int(c))
        raise WalkError(f"unsupported match option {opt}")

    def _set_member(self, name: str, direction: str, p: Packet) -> bool:
        kind, members = self.ipset.sets[name]
        addr = p.src if direction.startswith("src") else p.dst
        port = p.sport if direction.startswith("src") else p.dport
        for member in members:
            net, _, proto_port = member.partition(",")
            if ipaddress.ip_address(addr) not in ipaddress.ip_network(net):
                continue
            if kind == "hash:net":
                return True
            proto, _, mport = proto_port.partition(":")
            if PROTO_NUMBERS[proto] == p.proto and int(mport) == port:
                return True
        return False


def _target(tokens: list[str]) -> tuple[str, str, list[str]]:
    for i, tok in enumerate(tokens):
        if tok in ("-j", "-g"):
            return tok, tokens[i + 1], tokens[i + 2:]
    raise WalkError("rule without target")


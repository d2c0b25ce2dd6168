"""Agent configuration, as Felix does it: typed parameters from layered sources.

Inputs, lowest priority first (the order issue #8 asks for):

    defaults  <  config file (INI `[global]` or YAML mapping)  <  FELIX_<NAME> environment
              <  FelixConfiguration "default" (datastore, global)
              <  FelixConfiguration "node.<hostname>" (datastore, per node)

Output: a `Config` object with one typed attribute per parameter (`config.bpf_enabled`),
plus `changed_requiring_restart(new)` so the agent can exit cleanly (and be restarted by its
DaemonSet) when a parameter that cannot be applied live changes, as Felix does.

Invariants and easy mistakes:
- names are Felix's, matched case-insensitively (`FELIX_BPFENABLED`, spec key `bpfEnabled`);
- an unknown FELIX_ variable or config-file key, or a value that does not parse, is a
  `ConfigError` naming the source and the parameter: a typo must not silently run with the
  default (from the environment or file it stops the agent; from the datastore it is logged,
  counted and that one value ignored, so a bad resource cannot take every node down);
- datastore values can only be set for parameters marked `datastore=True` (bootstrap
  settings such as the datastore itself come from env/file only).

Every name Felix knows is accepted (`agent.felix_params` holds Felix's table). The ones in
`PARAMS` below are implemented; any other Felix name is parsed and validated with its Felix
kind, then accepted with one warning naming it (`Config.not_implemented()`, the status file,
the `pyfelix_config_not_implemented` gauge). A name Felix does not know either is a
`ConfigError`. As in Felix, an empty value means "not set" and `none` sets a parameter to its
zero value (refused for Felix's `non-zero` parameters).

Restart rule (Felix's): a change to any parameter restarts the agent (clean exit 0, the
supervisor restarts it, the dataplane stays programmed) except the ones marked
`restart=False` here (applied live: logging severities, DefaultEndpointToHostAction, the
failsafe ports, BPFEnforceRPF, HealthTimeoutOverrides) and the not-implemented names Felix
itself applies live (`felix_params.LIVE_IN_FELIX`).
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Counter, Gauge

from pyfelix.agent import felix_params
from pyfelix.agent.felix_params import FELIX_PARAMS, FELIX_PARAMS_BY_KEY, LIVE_IN_FELIX

log = logging.getLogger(__name__)

CONFIG_ERRORS = Counter(
    "pyfelix_config_errors",
    "Number of configuration values rejected because they were unknown or did not parse.",
    ["source"],
)
CONFIG_NOT_IMPLEMENTED = Gauge(
    "pyfelix_config_not_implemented",
    "Felix parameters set (env, config file or FelixConfiguration) that pyfelix accepts but "
    "does not implement: 1 per parameter.",
    ["parameter"],
)


class ConfigError(ValueError):
    def __init__(self, source: str, name: str, message: str) -> None:
        self.source = source
        self.name = name
        super().__init__(f"{source}: {name}: {message}")


# --- value parsers -------------------------------------------------------------------------


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "y", "t", "on"):
        return True
    if lowered in ("false", "0", "no", "n", "f", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def parse_port(text: str) -> int:
    port = parse_int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{port} is not a port number (1-65535)")
    return port


def parse_seconds(text: str) -> float:
    """Felix durations: a number of seconds, or Go-style `90s`, `5m`, `1h`, `250ms`."""
    value = felix_params.parse_duration(text)
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def parse_positive_int(text: str) -> int:
    value = parse_int(text)
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


def parse_positive_seconds(text: str) -> float:
    value = parse_seconds(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be longer than 0 s")
    return value


def _json_list_as_text(text: str, required: tuple[str, ...],
                       render: Callable[[dict[str, Any]], str], *,
                       expected: str | None = None) -> str:
    """A FelixConfiguration's JSON list of objects (each with `required` keys) turned into
    the env/file form (`render` each, comma-separated); any other text is returned as is."""
    text = text.strip()
    if not text.startswith("["):
        return text
    try:
        entries = json.loads(text)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a JSON list") from None
    if not isinstance(entries, list):
        raise ValueError(f"{text[:60]!r} is not a JSON list")
    items = []
    for entry in entries:
        if not isinstance(entry, dict) or any(key not in entry for key in required):
            raise ValueError(f"{entry!r}: expected {expected or '{' + ', '.join(required) + '}'}")
        items.append(render(entry))
    return ",".join(items)


def parse_health_timeout_overrides(text: str) -> tuple[tuple[str, float], ...]:
    """Felix's HealthTimeoutOverrides: `name=90s, other=10ms` (env/file form) or a
    FelixConfiguration's JSON list `[{"name": "dataplane", "timeout": "90s"}]`. 0 means the
    reporter never times out. Raises ValueError naming the bad entry."""
    text = _json_list_as_text(text, ("name", "timeout"),
                              lambda entry: f"{entry['name']}={entry['timeout']}")
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, duration = item.partition("=")
        name = name.strip()
        if not sep or not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError(f"{item!r}: expected name=duration")
        out[name] = parse_seconds(duration)
    return tuple(sorted(out.items()))


def parse_str(text: str) -> str:
    return text.strip()


def parse_regexp(text: str) -> str:
    """A Python regular expression (checked: it compiles)."""
    try:
        re.compile(text.strip())
    except re.error as exc:
        raise ValueError(f"{text!r} is not a valid regular expression: {exc}") from exc
    return text.strip()


def parse_optional_bool(text: str) -> str:
    """Felix's `*bool`: "" (unset: decided elsewhere), "true" or "false"."""
    return str(parse_bool(text)).lower() if text.strip() else ""


def parse_optional_ipv4(text: str) -> str:
    import ipaddress

    return str(ipaddress.IPv4Address(text.strip())) if text.strip() else ""


def parse_conntrack_timeouts(text: str) -> tuple[tuple[str, int], ...]:
    """BPFConntrackTimeouts: Felix's `TCPFinsSeen=30s,UDPTimeout=60s,...` as (key, whole
    seconds) pairs; `Auto` (and a key not given) keeps pyfelix's default for that timeout."""
    out = []
    for key, value in felix_params.parse_key_values(text):
        if key not in felix_params.BPF_CONNTRACK_TIMEOUT_KEYS:
            raise ValueError(f"unknown key {key!r} (known: "
                             f"{', '.join(felix_params.BPF_CONNTRACK_TIMEOUT_KEYS)})")
        if value.lower() == "auto":
            continue
        try:
            seconds = parse_seconds(value)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        if seconds < 1:
            raise ValueError(f"{key}: {value!r} is under the 1 s resolution of the timeouts")
        out.append((key, int(seconds)))
    return tuple(out)


def enum_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        for choice in choices:
            if text.strip().lower() == choice.lower():
                return choice
        raise ValueError(f"{text!r} is not one of {', '.join(choices)}")

    return parse


FAILSAFE_PROTOCOLS = ("tcp", "udp", "sctp")


def parse_proto_ports(text: str) -> tuple[tuple[str, int], ...]:
    """Felix's failsafe port lists: `tcp:22, udp:68, 179` (env/file form; tcp when no
    protocol) or a FelixConfiguration's JSON list `[{"protocol": "TCP", "port": 22}]`.
    Raises ValueError naming the bad entry."""
    text = _json_list_as_text(text, ("port",),
                              lambda entry: f"{entry.get('protocol', 'tcp')}:{entry['port']}",
                              expected="{protocol, port}")
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        proto, _, port = item.rpartition(":")
        proto = (proto or "tcp").lower()
        if proto not in FAILSAFE_PROTOCOLS:
            raise ValueError(f"{item!r}: protocol must be tcp, udp or sctp")
        out.append((proto, parse_port(port)))
    return tuple(out)


def parse_iface_prefixes(text: str) -> str:
    prefix = text.strip()
    if (not prefix or not all(c.isalnum() or c in "-_,." for c in prefix)
            or not all(prefix.split(","))):
        raise ValueError(f"{text!r} is not an interface prefix (or a comma-separated list)")
    return prefix


SEVERITIES = ("Trace", "Debug", "Info", "Warning", "Error", "Fatal")


def parse_severity(text: str) -> str:
    """Felix's log severities (any case); `none` (handled by the loader) turns a sink off."""
    return enum_of(*SEVERITIES)(text)


def parse_route_protocol(text: str) -> int:
    value = parse_int(text)
    if not 5 <= value <= 255:
        raise ValueError(f"{value} is not a route protocol number of 5-255 (0-4 belong to "
                         "the kernel and to routes added by hand)")
    return value


def parse_authority(text: str) -> str:
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if not sep or not host or "/" in host:
        raise ValueError(f"{text!r} is not HOST:PORT")
    parse_port(port)
    return value


parse_endpoint_list = felix_params.validator("endpoint-list")
parse_existing_file = felix_params.validator("file(must-exist)")


def parse_interface_names(text: str) -> str:
    """InterfaceExclude: interface names or /regex/ entries, comma-separated; every regex
    must compile (the dataplane matches with it)."""
    for entry in (part.strip() for part in text.split(",")):
        if len(entry) > 1 and entry.startswith("/") and entry.endswith("/"):
            try:
                re.compile(entry[1:-1])
            except re.error as exc:
                raise ValueError(f"{entry!r} is not a valid regular expression: {exc}") \
                    from None
    return text.strip()


def int_in(low: int, high: int, *, also: tuple[int, ...] = ()) -> Callable[[str], int]:
    """An integer in low..high (or one of `also`, e.g. 0 for "automatic")."""
    def parse(text: str) -> int:
        value = parse_int(text)
        if value not in also and not low <= value <= high:
            allowed = " or ".join([*(str(v) for v in also), f"{low}..{high}"])
            raise ValueError(f"{value} is not {allowed}")
        return value
    return parse


@dataclass(frozen=True)
class Param:
    name: str  # Felix's spelling
    default: Any
    parse: Callable[[str], Any]
    restart: bool = True  # a change restarts the agent (Felix's rule); False: applied live
    datastore: bool = True  # may come from a FelixConfiguration
    help: str = ""


DEFAULT_FAILSAFE_IN = "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"
DEFAULT_FAILSAFE_OUT = "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"

PARAMS: tuple[Param, ...] = (
    Param("DatastoreType", "etcdv3", enum_of("etcdv3", "kubernetes"), datastore=False,
          help="The datastore when no --datastore is given: etcdv3 (EtcdEndpoints, else "
               "EtcdAddr) or kubernetes; TyphaAddr/TyphaK8sServiceName put Typha in front."),
    Param("EtcdAddr", "127.0.0.1:2379", parse_authority, datastore=False,
          help="etcd's HOST:PORT when EtcdEndpoints is empty (with EtcdScheme)."),
    Param("EtcdScheme", "http", enum_of("http", "https"), datastore=False),
    Param("EtcdEndpoints", (), parse_endpoint_list, datastore=False,
          help="etcd's endpoints, http(s)://HOST:PORT, comma-separated."),
    Param("EtcdCaFile", "", parse_existing_file, datastore=False),
    Param("EtcdCertFile", "", parse_existing_file, datastore=False),
    Param("EtcdKeyFile", "", parse_existing_file, datastore=False),
    Param("BPFEnabled", True, parse_bool, restart=True,
          help="Enforce policy with tc/XDP BPF programs (else iptables)."),
    Param("BPFFallback", "none", enum_of("none", "iptables"), restart=True,
          help="What to do when the kernel cannot run BPF mode: exit, or use iptables."),
    Param("BPFPinDir", "/sys/fs/bpf/pyfelix", parse_str, restart=True, datastore=False,
          help="bpffs directory under which pyfelix pins its maps."),
    Param("BPFMapSizeConntrack", 512000, parse_int, restart=True),
    Param("BPFMapSizeIPSets", 1048576, parse_int, restart=True),
    Param("BPFMapSizeRules", 65536, parse_int, restart=True),
    Param("BPFMapSizeRoute", 262144, parse_int, restart=True),
    Param("BPFMapSizeEndpoints", 16384, parse_int, restart=True),
    Param("BPFMapSizeNATFrontend", 65536, parse_int, restart=True,
          help="Service frontends (VIP, port, protocol) the BPF NAT can hold."),
    Param("BPFMapSizeNATBackend", 262144, parse_int, restart=True,
          help="Service backends (all frontends together) the BPF NAT can hold."),
    Param("BPFMapSizeNATAffinity", 65536, parse_int, restart=True,
          help="ClientIP session affinity entries (service, client) the BPF NAT can hold."),
    Param("BPFMapSizeClassifierWords", 1048576, parse_int, restart=True,
          help="u64 words for the policy classifier's bitvectors (all chains; see "
               "bpf/README.md for the cost per rule)."),
    Param("BPFMapSizeClassifierTries", 1048576, parse_int, restart=True,
          help="Classifier trie entries: member prefixes of the sets each chain checks, "
               "per chain, plus port intervals."),
    Param("BPFMapSizeClassifierL4", 65536, parse_int, restart=True,
          help="Classifier protocol/ICMP entries (a few per protocol a chain names)."),
    Param("BPFConntrackCleanupInterval", 10.0, parse_seconds),
    Param("BPFConntrackTimeouts", (), parse_conntrack_timeouts, restart=True,
          help="Conntrack timeouts, Felix's keys (TCPSynSent, TCPEstablished, TCPFinsSeen, "
               "TCPResetSeen, UDPTimeout, ICMPTimeout, GenericTimeout; CreationGracePeriod "
               "accepted, no effect): compiled into the programs and used by the cleaner. "
               "Unset keys and `Auto`: 20s, 1h, 30s, 10s, 60s, 5s, 60s."),
    Param("XDPEnabled", True, parse_bool,
          help="BPF mode: calico_xdp drops untracked-denied sources early on host endpoint "
               "interfaces (iptables' raw chains enforce the same policy either way)."),
    Param("GenericXDPEnabled", False, parse_bool,
          help="Allow generic (skb) XDP where the driver has no native XDP."),
    Param("BPFEnforceRPF", "Strict", enum_of("Disabled", "Strict", "Loose"), restart=False,
          help="Reverse-path check of packets arriving on host endpoint interfaces (BPF "
               "mode): Strict (the route back leaves by the same interface), Loose (the "
               "source is routable), Disabled."),
    Param("BPFRedirectToPeer", "Enabled", enum_of("Disabled", "Enabled", "L2Only"),
          restart=False,
          help="BPF mode: an allowed packet from a pod to another pod of this node goes "
               "straight to the destination's host interface (its ingress policy still "
               "applies there), past the host's routing, iptables and kernel conntrack. "
               "L2Only behaves as Enabled (every pod interface is a veth). Disabled: the "
               "normal path."),
    Param("BPFConnectTimeLoadBalancing", "TCP", enum_of("TCP", "Enabled", "Disabled"),
          restart=True,
          help="BPF mode: host-networked clients' connects to a Service address are sent to "
               "a backend at the socket (cgroup programs, bpf/ctlb.c): TCP only, TCP and UDP "
               "(Enabled), or not at all."),
    Param("BPFDataIfacePattern", r"^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)",
          parse_regexp, restart=True,
          help="BPF mode: the node's data interfaces (a regular expression on the name): "
               "while NodePort Services exist, calico_from_host serves NodePorts at their tc "
               "ingress (host endpoint interfaces get it from calico_from_hep)."),
    Param("BPFCgroupV2", "", parse_str, restart=True,
          help="The cgroup v2 directory the connect-time load balancer attaches to; empty: "
               "the root of the first cgroup2 mount (every process of the node)."),
    Param("HealthEnabled", False, parse_bool, restart=True),
    Param("HealthHost", "localhost", parse_str, restart=True),
    Param("HealthPort", 9099, parse_port, restart=True),
    Param("HealthTimeoutOverrides", (), parse_health_timeout_overrides, restart=False,
          help="Liveness timeouts of individual reporters (calc-graph, dataplane, "
               "iface-monitor), e.g. 'dataplane=120s'; 0 never times out."),
    Param("DataplaneWatchdogTimeout", 90.0, parse_seconds, restart=True,
          help="Liveness timeout of the dataplane loop (Felix's; deprecated there in favour "
               "of HealthTimeoutOverrides, which wins); 0 never times out."),
    # pyfelix's own (Felix has no equivalent): bounds of the health and metrics servers
    Param("HealthMaxConnections", 32, parse_positive_int, restart=True,
          help="pyfelix: connections the health server serves at once; more are closed."),
    Param("HealthReadTimeout", 5.0, parse_positive_seconds, restart=True,
          help="pyfelix: a health connection must send its request within this time (and "
               "gets as long again for the response)."),
    Param("PrometheusMetricsEnabled", False, parse_bool, restart=True),
    Param("PrometheusMetricsHost", "", parse_str, restart=True),
    Param("PrometheusMetricsPort", 9091, parse_port, restart=True),
    Param("PrometheusMetricsMaxConnections", 32, parse_positive_int, restart=True,
          help="pyfelix: connections the metrics server serves at once; more are closed."),
    Param("PrometheusMetricsReadTimeout", 5.0, parse_positive_seconds, restart=True,
          help="pyfelix: a metrics connection must send its request within this time (and "
               "gets as long again for the response)."),
    Param("InterfacePrefix", "cali", parse_iface_prefixes, restart=True),
    Param("LogSeverityScreen", "Info", parse_severity, restart=False,
          help="Least severity logged to stderr; none: nothing."),
    Param("LogSeverityFile", "Info", parse_severity, restart=False,
          help="Least severity logged to LogFilePath; none: nothing."),
    Param("LogSeveritySys", "Info", parse_severity, restart=False,
          help="Least severity sent to syslog (LogSyslogAddress); none: nothing."),
    Param("LogFilePath", "/var/log/calico/felix.log", parse_str,
          help="Log file (rotated at LogFileMaxSizeMB, LogFileBackups kept); none: no file."),
    # pyfelix's own: the log file's rotation and the syslog socket (Felix has no equivalent)
    Param("LogFileMaxSizeMB", 100, parse_positive_int,
          help="pyfelix: LogFilePath is rotated when it reaches this size."),
    Param("LogFileBackups", 5, parse_int,
          help="pyfelix: rotated log files kept (felix.log.1 ... .N)."),
    Param("LogSyslogAddress", "/dev/log", parse_str,
          help="pyfelix: the syslog unix datagram socket LogSeveritySys logs to."),
    Param("DefaultEndpointToHostAction", "Drop", enum_of("Drop", "Return", "Accept"),
          restart=False),
    Param("Ipv6Support", True, parse_bool, restart=True,
          help="Police and route workload IPv6. false: workload IPv6 (but neighbour "
               "discovery) is dropped and counted, and nothing IPv6 is programmed."),
    Param("IptablesBackend", "Auto", enum_of("Auto", "NFT", "Legacy"), restart=True),
    Param("IptablesRefreshInterval", 180.0, parse_seconds),
    Param("RouteRefreshInterval", 90.0, parse_seconds),
    Param("RouteTableProtocol", 80, parse_route_protocol, restart=True,
          help="pyfelix: the rtnetlink protocol number that marks the workload routes as the "
               "agent's (every main-table route with it is managed). Not 0-4: those are "
               "the kernel's and ip route's own (Felix's DeviceRouteProtocol is accepted "
               "but not used for this)."),
    Param("FailsafeInboundHostPorts", parse_proto_ports(DEFAULT_FAILSAFE_IN), parse_proto_ports,
          restart=False),
    Param("FailsafeOutboundHostPorts", parse_proto_ports(DEFAULT_FAILSAFE_OUT),
          parse_proto_ports, restart=False),
    Param("InterfaceExclude", "kube-ipvs0", parse_interface_names, restart=True,
          help="Interfaces (names or /regex/, comma-separated) never treated as host IPs."),
    Param("VXLANVNI", 4096, int_in(1, (1 << 24) - 1), restart=True),
    Param("VXLANPort", 4789, parse_port, restart=True),
    Param("VXLANMTU", 0, int_in(68, 65535, also=(0,)), restart=True),
    Param("VXLANMTUV6", 0, int_in(1280, 65535, also=(0,)), restart=True,
          help="MTU of vxlan-v6.calico (0: the parent interface's MTU - 70)."),
    Param("IpInIpEnabled", "", parse_optional_bool, restart=True,
          help="tunl0 wanted: unset follows the IP pools (an IPIP pool and a host IP), true "
               "always, false never (IPIP routes are then not programmed)."),
    Param("IpInIpMtu", 0, int_in(68, 65535, also=(0,)), restart=True),
    Param("IpInIpTunnelAddr", "", parse_optional_ipv4, restart=True),
    Param("AllowVXLANPacketsFromWorkloads", False, parse_bool, restart=True),
    Param("AllowIPIPPacketsFromWorkloads", False, parse_bool, restart=True),
    Param("FloatingIPs", "Disabled", enum_of("Enabled", "Disabled"), restart=True,
          help="Program WorkloadEndpoint ipNATs (floating IPs): DNAT to the pod, a route."),
    # Flow logs: Calico Enterprise's names (Felix open source has only the interval)
    Param("FlowLogsFileEnabled", False, parse_bool, restart=True,
          help="pyfelix: write flow logs as JSON lines to FlowLogsFileDirectory (BPF: ring "
               "buffer events; iptables: NFLOG rules before each decision)."),
    Param("FlowLogsFileDirectory", "/var/log/calico/flowlogs", parse_str, restart=True,
          help="pyfelix: where flows.log (and its rotations) is written."),
    Param("FlowLogsFlushInterval", 300.0, parse_positive_seconds, restart=True),
    Param("FlowLogsFileMaxFileSizeMB", 100, parse_positive_int, restart=True,
          help="pyfelix: flows.log is rotated at this size."),
    Param("FlowLogsFileMaxFiles", 5, parse_positive_int, restart=True,
          help="pyfelix: rotated flow-log files kept."),
    Param("EndpointReportingEnabled", False, parse_bool),
    Param("ReportingTTLSecs", 90.0, parse_seconds),
    Param("DataplaneFailClosedAfter", 60.0, parse_seconds,
          help="Exit non-zero when policy could not be programmed for this long."),
    Param("StatusFile", "", parse_str, restart=False, datastore=False,
          help="Write sync/apply status as JSON to this file (used by the lab)."),
    Param("ConfdEnabled", False, parse_bool, restart=True,
          help="Run confd (BIRD config) inside the agent process."),
    # Typha client settings (Felix's names); bootstrap-only, like the datastore itself.
    Param("TyphaAddr", "", parse_str, restart=True, datastore=False),
    Param("TyphaK8sServiceName", "", parse_str, restart=True, datastore=False),
    Param("TyphaK8sNamespace", "kube-system", parse_str, restart=True, datastore=False),
    Param("TyphaCAFile", "", parse_str, restart=True, datastore=False),
    Param("TyphaCertFile", "", parse_str, restart=True, datastore=False),
    Param("TyphaKeyFile", "", parse_str, restart=True, datastore=False),
    Param("TyphaCN", "", parse_str, restart=True, datastore=False),
    Param("TyphaURISAN", "", parse_str, restart=True, datastore=False),
    Param("TyphaReadTimeout", 30.0, parse_seconds, restart=True, datastore=False),
    Param("TyphaWriteTimeout", 10.0, parse_seconds, restart=True, datastore=False),
    Param("FelixHostname", "", parse_str, restart=True, datastore=False,
          help="This node's name, when --hostname/NODENAME are not given."),
)
PARAMS_BY_KEY = {p.name.lower(): p for p in PARAMS}
# pyfelix's earlier spellings of Felix parameters
_ALIASES = {"bpfmapsizeroutes": "BPFMapSizeRoute"}
NOT_IMPLEMENTED: tuple[str, ...] = tuple(p.name for p in FELIX_PARAMS
                                         if p.name.lower() not in PARAMS_BY_KEY)
_NOT_IMPLEMENTED_DEFAULTS = {name: felix_params.default_value(FELIX_PARAMS_BY_KEY[name.lower()])
                             for name in NOT_IMPLEMENTED}
_warned_not_implemented: set[str] = set()


def _lookup(name: str) -> Param | felix_params.FelixParam | None:
    key = _ALIASES.get(name.lower(), name).lower()
    return PARAMS_BY_KEY.get(key) or FELIX_PARAMS_BY_KEY.get(key)


def attribute_name(felix_name: str) -> str:
    """`BPFEnabled` -> `bpf_enabled`, `PrometheusMetricsPort` -> `prometheus_metrics_port`."""
    out = []
    for i, ch in enumerate(felix_name):
        prev = felix_name[i - 1] if i else ""
        nxt = felix_name[i + 1] if i + 1 < len(felix_name) else ""
        if ch.isupper() and i and (prev.islower() or (nxt.islower() and prev.isupper())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class Config:
    """Effective configuration. Attributes are the snake_case of Felix's names."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
        self._values = dict(values)
        self._sources = dict(sources)
        for param in PARAMS:
            setattr(self, attribute_name(param.name), self._values[param.name])

    def __getattr__(self, name: str) -> Any:  # for type checkers: attributes are dynamic
        raise AttributeError(name)

    def _name(self, felix_name: str) -> str:
        param = _lookup(felix_name)
        if param is None:
            raise KeyError(felix_name)
        return param.name

    def get(self, felix_name: str) -> Any:
        """Any parameter's value, implemented or not (Felix's names, any case)."""
        return self._values[self._name(felix_name)]

    def source_of(self, felix_name: str) -> str:
        return self._sources[self._name(felix_name)]

    def as_strings(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, str(v)) for k, v in self._values.items()))

    def not_implemented(self) -> list[str]:
        """Felix parameters set by some source that pyfelix accepts but does not implement."""
        return [name for name in NOT_IMPLEMENTED if self._sources[name] != "default"]

    def changed_requiring_restart(self, new: Config) -> list[str]:
        """Felix's rule: every changed parameter restarts, except the ones applied live."""
        implemented = [p.name for p in PARAMS
                       if p.restart and self._values[p.name] != new._values[p.name]]
        others = [name for name in NOT_IMPLEMENTED if name not in LIVE_IN_FELIX
                  and self._values[name] != new._values[name]]
        return implemented + others

    def changed(self, new: Config) -> list[str]:
        return [name for name, value in self._values.items() if new._values[name] != value]


def _apply(layer: Mapping[str, str], source: str, values: dict[str, Any],
           sources: dict[str, str], *, strict: bool, from_datastore: bool) -> list[ConfigError]:
    errors = []
    for raw_name, raw_value in layer.items():
        if from_datastore and raw_name.lower() in felix_params.SPEC_FIELDS_NOT_PARAMETERS:
            continue
        name = felix_params.spec_key_to_name(raw_name) if from_datastore else raw_name
        param = _lookup(name)
        text = str(raw_value)
        if not text.strip():
            continue  # as Felix: an empty value leaves the parameter unset
        try:
            if param is None:
                raise ConfigError(source, raw_name, "unknown parameter (Felix has no parameter "
                                                    "of this name)")
            if from_datastore and not _from_datastore_ok(param):
                raise ConfigError(source, param.name, "cannot be set from the datastore "
                                                      "(env or config file only)")
            try:
                values[param.name] = _parse(param, text)
            except ValueError as exc:
                raise ConfigError(source, param.name, str(exc)) from None
            sources[param.name] = source
        except ConfigError as exc:
            CONFIG_ERRORS.labels(source.split(":")[0]).inc()
            if strict:
                raise
            log.warning("ignoring bad configuration value: %s", exc)
            errors.append(exc)
    return errors


def _from_datastore_ok(param: Param | felix_params.FelixParam) -> bool:
    if isinstance(param, Param):
        return param.datastore
    return not param.local


def _parse(param: Param | felix_params.FelixParam, text: str) -> Any:
    if isinstance(param, felix_params.FelixParam):
        return felix_params.parse_value(param, text)
    if text.strip().lower() == "none":
        felix = FELIX_PARAMS_BY_KEY.get(param.name.lower())
        if felix is None or felix.non_zero:
            raise ValueError("cannot be none")
        zero = felix_params.zero_value(felix.kind)
        return type(param.default)(zero) if isinstance(param.default, tuple | float) else zero
    value = param.parse(text)
    felix = FELIX_PARAMS_BY_KEY.get(param.name.lower())
    if felix is not None:
        felix_params.parse_value(felix, text)  # Felix's own type check as well
    return value


def note_not_implemented(config: Config) -> None:
    """One warning per process for each not-implemented Felix parameter that is set; the
    gauge holds the current set."""
    names = config.not_implemented()
    CONFIG_NOT_IMPLEMENTED.clear()
    for name in names:
        CONFIG_NOT_IMPLEMENTED.labels(name).set(1)
        if name not in _warned_not_implemented:
            _warned_not_implemented.add(name)
            log.warning("Felix parameter %s (from %s) is accepted but not implemented by "
                        "pyfelix; it has no effect", name, config.source_of(name))


def read_config_file(path: str | Path) -> dict[str, str]:
    """A Felix-style INI file (`[global]` section) or a YAML mapping of Name: value."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        parser = configparser.ConfigParser()
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(text)
        return {k: v for section in parser.sections() for k, v in parser[section].items()}
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "expected a mapping of parameter: value")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in data.items()}


def env_layer(environ: Mapping[str, str]) -> dict[str, str]:
    return {k[len("FELIX_"):]: v for k, v in environ.items() if k.upper().startswith("FELIX_")}


def load_config(*, environ: Mapping[str, str] | None = None, config_file: str | None = None,
                datastore_global: Mapping[str, str] | None = None,
                datastore_node: Mapping[str, str] | None = None) -> Config:
    """Build the effective config. Env/file errors raise ConfigError; datastore ones are
    logged, counted and skipped (the rest of that resource still applies)."""
    values = {p.name: p.default for p in PARAMS}
    values.update(_NOT_IMPLEMENTED_DEFAULTS)
    sources = dict.fromkeys(values, "default")
    if config_file:
        try:
            layer = read_config_file(config_file)
        except (OSError, configparser.Error, yaml.YAMLError) as exc:
            raise ConfigError(f"file:{config_file}", "", f"cannot read: {exc}") from None
        _apply(layer, f"file:{config_file}", values, sources, strict=True, from_datastore=False)
    env = env_layer(os.environ if environ is None else environ)
    _apply(env, "env", values, sources, strict=True, from_datastore=False)
    for name, layer in (("datastore:default", datastore_global),
                        ("datastore:node", datastore_node)):
        if layer:
            _apply(layer, name, values, sources, strict=False, from_datastore=True)
    return Config(values, sources)

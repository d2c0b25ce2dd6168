"""Felix's configuration parameters: every name Felix knows, its type, default and flags.

Role: the one table of facts about Felix's settings (from Felix's `config_params.go`:
name, parameter kind, default in Felix's text form, and the `local` / `non-zero` /
`die-on-fail` markers), plus a validator per Felix parameter kind so that a value of a
parameter pyfelix does not implement is still checked as Felix would check it.

Inputs: a parameter name (any case) and its raw text from env, a config file or a
FelixConfiguration. Outputs: `FELIX_PARAMS_BY_KEY[name.lower()] -> FelixParam`,
`validator(kind)(text) -> value` (raises ValueError with a message naming the problem),
`zero_value(kind)` (what Felix's `none` sets), `spec_key_to_name()` (FelixConfiguration
spec keys Felix spells differently from the parameter).

Restart rule (Felix's daemon): a change to any parameter restarts Felix except the few in
`LIVE_IN_FELIX`; `local` parameters are ignored when they come from the datastore.

Invariants: pure data and pure functions; no I/O except the `file(must-exist)` check.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FelixParam:
    name: str  # Felix's spelling
    kind: str  # Felix's parameter kind, with its arguments: "int(0:65535)", "oneof(A,B)"
    default: str  # Felix's default, in its text form ("" = the kind's zero value)
    flags: str = ""  # comma-separated: local, non-zero, die-on-fail, skip-default-validation

    @property
    def local(self) -> bool:
        """Only from env / config file: Felix ignores it in a FelixConfiguration."""
        return "local" in self.flags.split(",")

    @property
    def non_zero(self) -> bool:
        """Cannot be set to `none` (the kind's zero value)."""
        return "non-zero" in self.flags.split(",")

    @property
    def base_kind(self) -> str:
        return self.kind.partition("(")[0]

    @property
    def kind_args(self) -> str:
        return self.kind.partition("(")[2].rstrip(")")


_P = FelixParam

# One row per Felix parameter, in the order Felix declares them.
FELIX_PARAMS: tuple[FelixParam, ...] = (
    _P("UseInternalDataplaneDriver", "bool", "true"),
    _P("DataplaneDriver", "file(must-exist,executable)", "calico-iptables-plugin",
       "non-zero,die-on-fail,skip-default-validation"),
    _P("DataplaneWatchdogTimeout", "seconds", "90"),
    _P("WireguardEnabled", "bool", "false"),
    _P("WireguardEnabledV6", "bool", "false"),
    _P("WireguardListeningPort", "int", "51820"),
    _P("WireguardListeningPortV6", "int", "51821"),
    _P("WireguardRoutingRulePriority", "int", "99"),
    _P("WireguardInterfaceName", "iface-param", "wireguard.cali", "non-zero"),
    _P("WireguardInterfaceNameV6", "iface-param", "wg-v6.cali", "non-zero"),
    _P("WireguardMTU", "int", "0"),
    _P("WireguardMTUV6", "int", "0"),
    _P("WireguardHostEncryptionEnabled", "bool", "false"),
    _P("WireguardPersistentKeepAlive", "seconds", "0"),
    _P("WireguardThreadingEnabled", "bool", "false"),
    _P("NFTablesMode", "oneof(Enabled,Disabled,Auto)", "Auto"),
    _P("NFTablesFlowTableOffload", "oneof(All,Disabled)", "Disabled"),
    _P("NFTablesFlowTableDataIfacePattern", "regexp(nil-on-empty)", ""),
    _P("BPFEnabled", "bool", "false"),
    _P("BPFOverlayHostSourceIP", "oneof(TunnelAddress,HostAddress)", "TunnelAddress", "non-zero"),
    _P("BPFDisableUnprivileged", "bool", "true"),
    _P("BPFJITHardening", "oneof(Auto,Strict)", "Auto", "non-zero"),
    _P("BPFLogLevel", "oneof(off,info,debug)", "off", "non-zero"),
    _P("BPFConntrackLogLevel", "oneof(off,debug)", "off", "non-zero"),
    _P("BPFConntrackCleanupMode", "oneof(Auto,Userspace,BPFProgram)", "Auto"),
    _P("BPFConntrackTimeouts", "keyvaluelist",
       "CreationGracePeriod=10s,TCPSynSent=20s,TCPEstablished=1h,TCPFinsSeen=Auto,"
       "TCPResetSeen=40s,UDPTimeout=60s,GenericTimeout=10m,ICMPTimeout=5s"),
    _P("BPFIPFragTimeout", "seconds", "0"),
    _P("BPFLogFilters", "keyvaluelist", ""),
    _P("BPFCTLBLogFilter", "oneof(all)", ""),
    _P("BPFDataIfacePattern", "regexp", "^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)"),
    _P("BPFL3IfacePattern", "regexp", ""),
    _P("BPFConnectTimeLoadBalancingEnabled", "bool", ""),
    _P("BPFConnectTimeLoadBalancing", "oneof(TCP,Enabled,Disabled)", "TCP", "non-zero"),
    _P("BPFHostNetworkedNATWithoutCTLB", "oneof(Enabled,Disabled)", "Enabled", "non-zero"),
    _P("BPFExternalServiceMode", "oneof(tunnel,dsr)", "tunnel", "non-zero"),
    _P("BPFDSROptoutCIDRs", "cidr-list", ""),
    _P("BPFKubeProxyIptablesCleanupEnabled", "bool", "true"),
    _P("BPFKubeProxyMinSyncPeriod", "seconds", "1"),
    _P("BPFKubeProxyHealthzPort", "int", "10256"),
    _P("BPFExtToServiceConnmark", "int", "0"),
    _P("BPFPSNATPorts", "portrange", "20000:29999"),
    _P("BPFMapSizeNATFrontend", "int", "65536", "non-zero"),
    _P("BPFMapSizeNATBackend", "int", "262144", "non-zero"),
    _P("BPFMapSizeNATAffinity", "int", "65536", "non-zero"),
    _P("BPFMapSizeRoute", "int", "262144", "non-zero"),
    _P("BPFMapSizeConntrack", "int", "512000", "non-zero"),
    _P("BPFMapSizePerCPUConntrack", "int", "0"),
    _P("BPFMapSizeConntrackScaling", "oneof(Disabled,DoubleIfFull)", "DoubleIfFull", "non-zero"),
    _P("BPFMapSizeConntrackCleanupQueue", "int", "100000", "non-zero"),
    _P("BPFMapSizeIPSets", "int", "1048576", "non-zero"),
    _P("BPFMapSizeIfState", "int", "1000", "non-zero"),
    _P("BPFHostConntrackBypass", "bool", "false"),
    _P("BPFIPFragmentReassemblyEnabled", "bool", "true"),
    _P("BPFEnforceRPF", "oneof(Disabled,Strict,Loose)", "Loose", "non-zero"),
    _P("BPFPolicyDebugEnabled", "bool", "true"),
    _P("BPFForceTrackPacketsFromIfaces", "iface-filter-slice", "docker+"),
    _P("BPFDisableGROForIfaces", "regexp", ""),
    _P("BPFExcludeCIDRsFromNAT", "cidr-list", ""),
    _P("BPFRedirectToPeer", "oneof(Disabled,Enabled,L2Only)", "Enabled", "non-zero"),
    _P("BPFAttachType", "oneof(Netkit,TCX,TC)", "Netkit", "non-zero"),
    _P("BPFExportBufferSizeMB", "int", "1", "non-zero"),
    _P("BPFProfiling", "oneof(Disabled,Enabled)", "Disabled", "non-zero"),
    _P("IstioAmbientMode", "oneof(Disabled,Enabled)", "Disabled"),
    _P("IstioDSCPMark", "dscp", "23"),
    _P("CgroupV2Path", "string", ""),
    _P("DebugBPFCgroupV2", "string", "", "local"),
    _P("DatastoreType", "oneof(kubernetes,etcdv3)", "etcdv3", "non-zero,die-on-fail,local"),
    _P("FelixHostname", "hostname", "", "local,non-zero"),
    _P("EtcdAddr", "authority", "127.0.0.1:2379", "local"),
    _P("EtcdScheme", "oneof(http,https)", "http", "local"),
    _P("EtcdKeyFile", "file(must-exist)", "", "local"),
    _P("EtcdCertFile", "file(must-exist)", "", "local"),
    _P("EtcdCaFile", "file(must-exist)", "", "local"),
    _P("EtcdEndpoints", "endpoint-list", "", "local"),
    _P("TyphaAddr", "authority", "", "local"),
    _P("TyphaK8sServiceName", "string", "", "local"),
    _P("TyphaK8sNamespace", "string", "kube-system", "non-zero,local"),
    _P("TyphaReadTimeout", "seconds", "30", "local"),
    _P("TyphaWriteTimeout", "seconds", "10", "local"),
    _P("TyphaKeyFile", "file(must-exist)", "", "local"),
    _P("TyphaCertFile", "file(must-exist)", "", "local"),
    _P("TyphaCAFile", "file(must-exist)", "", "local"),
    _P("TyphaCN", "string", "", "local"),
    _P("TyphaURISAN", "string", "", "local"),
    _P("Ipv6Support", "bool", "true"),
    _P("IptablesBackend", "oneof(legacy,nft,auto)", "auto"),
    _P("RouteRefreshInterval", "seconds", "90"),
    _P("InterfaceRefreshInterval", "seconds", "90"),
    _P("DeviceRouteSourceAddress", "ipv4", ""),
    _P("DeviceRouteSourceAddressIPv6", "ipv6", ""),
    _P("DeviceRouteProtocol", "int", "3"),
    _P("RemoveExternalRoutes", "bool", "true"),
    _P("ProgramClusterRoutes", "oneof(Enabled,Disabled,EnabledIPIPOnly,EnabledNoEncapOnly)",
       "EnabledIPIPOnly"),
    _P("IPForwarding", "oneof(Enabled,Disabled)", "Enabled"),
    _P("IptablesRefreshInterval", "seconds", "180"),
    _P("IptablesPostWriteCheckIntervalSecs", "seconds", "5"),
    _P("IptablesLockProbeIntervalMillis", "millis", "50"),
    _P("FeatureDetectOverride", "keyvaluelist", ""),
    _P("FeatureGates", "keyvaluelist", ""),
    _P("IpsetsRefreshInterval", "seconds", "90"),
    _P("MaxIpsetSize", "int", "1048576", "non-zero"),
    _P("XDPRefreshInterval", "seconds", "90"),
    _P("PolicySyncPathPrefix", "file", ""),
    _P("NetlinkTimeoutSecs", "seconds", "10"),
    _P("MetadataAddr", "hostname", "127.0.0.1", "die-on-fail"),
    _P("MetadataPort", "int(0:65535)", "8775", "die-on-fail"),
    _P("OpenstackRegion", "region", "", "die-on-fail"),
    _P("InterfacePrefix", "iface-list", "cali", "non-zero,die-on-fail"),
    _P("InterfaceExclude", "iface-list-regexp", "kube-ipvs0"),
    _P("ChainInsertMode", "oneof(insert,append)", "insert", "non-zero,die-on-fail"),
    _P("DefaultEndpointToHostAction", "oneof(DROP,RETURN,ACCEPT)", "DROP", "non-zero,die-on-fail"),
    _P("IptablesFilterAllowAction", "oneof(ACCEPT,RETURN)", "ACCEPT", "non-zero,die-on-fail"),
    _P("IptablesMangleAllowAction", "oneof(ACCEPT,RETURN)", "ACCEPT", "non-zero,die-on-fail"),
    _P("IptablesFilterDenyAction", "oneof(DROP,REJECT)", "DROP", "non-zero,die-on-fail"),
    _P("LogPrefix", "string", "calico-packet"),
    _P("LogActionRateLimit", "log-rate", ""),
    _P("LogActionRateLimitBurst", "int(0,9999)", "5"),
    _P("LogFilePath", "file", "/var/log/calico/felix.log", "die-on-fail"),
    _P("LogSeverityFile", "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO"),
    _P("LogSeverityScreen", "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO"),
    _P("LogSeveritySys", "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO"),
    _P("LogDebugFilenameRegex", "regexp(nil-on-empty)", ""),
    _P("VXLANEnabled", "*bool", ""),
    _P("VXLANPort", "int", "4789"),
    _P("VXLANVNI", "int", "4096"),
    _P("VXLANMTU", "int", "0"),
    _P("VXLANMTUV6", "int", "0"),
    _P("IPv4VXLANTunnelAddr", "ipv4", ""),
    _P("IPv6VXLANTunnelAddr", "ipv6", ""),
    _P("VXLANTunnelMACAddr", "string", ""),
    _P("VXLANTunnelMACAddrV6", "string", ""),
    _P("IpInIpEnabled", "*bool", ""),
    _P("IpInIpMtu", "int", "0"),
    _P("IpInIpTunnelAddr", "ipv4", ""),
    _P("FloatingIPs", "oneof(Enabled,Disabled)", "Disabled"),
    _P("LocalSubnetL2Reachability", "oneof(Disabled,PodsAndLoadBalancers)", "Disabled"),
    _P("LocalSubnetL2ReachabilityRefreshInterval", "seconds", "120"),
    _P("WindowsManageFirewallRules", "oneof(Enabled,Disabled)", "Disabled"),
    _P("AllowVXLANPacketsFromWorkloads", "bool", "false"),
    _P("AllowIPIPPacketsFromWorkloads", "bool", "false"),
    _P("AWSSrcDstCheck", "oneof(DoNothing,Enable,Disable)", "DoNothing", "non-zero"),
    _P("ServiceLoopPrevention", "oneof(Drop,Reject,Disabled)", "Drop"),
    _P("WorkloadSourceSpoofing", "oneof(Disabled,Any)", "Disabled"),
    _P("ReportingIntervalSecs", "seconds", "30"),
    _P("ReportingTTLSecs", "seconds", "90"),
    _P("EndpointReportingEnabled", "bool", "false"),
    _P("EndpointReportingDelaySecs", "seconds", "1"),
    _P("EndpointStatusPathPrefix", "file", "/var/run/calico"),
    _P("IptablesMarkMask", "mark-bitmask", "0xffff0000", "non-zero,die-on-fail"),
    _P("DisableConntrackInvalidCheck", "bool", "false"),
    _P("HealthEnabled", "bool", "false"),
    _P("HealthPort", "int(0:65535)", "9099"),
    _P("HealthHost", "host-address", "localhost"),
    _P("HealthTimeoutOverrides", "keydurationlist", ""),
    _P("PrometheusMetricsEnabled", "bool", "false"),
    _P("PrometheusMetricsHost", "host-address", ""),
    _P("PrometheusMetricsPort", "int(0:65535)", "9091"),
    _P("PrometheusGoMetricsEnabled", "bool", "true"),
    _P("PrometheusProcessMetricsEnabled", "bool", "true"),
    _P("PrometheusWireGuardMetricsEnabled", "bool", "true"),
    _P("PrometheusMetricsCAFile", "string", ""),
    _P("PrometheusMetricsCertFile", "string", ""),
    _P("PrometheusMetricsKeyFile", "string", ""),
    _P("PrometheusMetricsClientAuth",
       "oneof(RequireAndVerifyClientCert,RequireAnyClientCert,VerifyClientCertIfGiven,"
       "NoClientCert)",
       "NoClientCert"),
    _P("FailsafeInboundHostPorts", "port-list",
       "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667",
       "die-on-fail"),
    _P("FailsafeOutboundHostPorts", "port-list",
       "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667",
       "die-on-fail"),
    _P("FlowLogsFlushInterval", "seconds", "300"),
    _P("FlowLogsCollectorDebugTrace", "bool", "false"),
    _P("FlowLogsGoldmaneServer", "string", ""),
    _P("FlowLogsLocalReporter", "oneof(Enabled,Disabled)", "Disabled"),
    _P("FlowLogsPolicyEvaluationMode", "oneof(None,Continuous)", "Continuous"),
    _P("KubeNodePortRanges", "portrange-list", "30000:32767"),
    _P("NATPortRange", "portrange", ""),
    _P("NATOutgoingAddress", "ipv4", ""),
    _P("NATOutgoingExclusions", "oneof(IPPoolsOnly,IPPoolsAndHostIPs)", "IPPoolsOnly"),
    _P("UsageReportingEnabled", "bool", "true"),
    _P("UsageReportingInitialDelaySecs", "seconds", "300"),
    _P("UsageReportingIntervalSecs", "seconds", "86400"),
    _P("ClusterGUID", "string", "baddecaf"),
    _P("ClusterType", "string", ""),
    _P("CalicoVersion", "string", ""),
    _P("ExternalNodesCIDRList", "cidr-list", "", "die-on-fail"),
    _P("DebugMemoryProfilePath", "file", ""),
    _P("DebugCPUProfilePath", "file", "/tmp/felix-cpu-<timestamp>.pprof"),
    _P("DebugDisableLogDropping", "bool", "false"),
    _P("DebugSimulateCalcGraphHangAfter", "seconds", "0"),
    _P("DebugSimulateDataplaneHangAfter", "seconds", "0"),
    _P("DebugSimulateDataplaneApplyDelay", "seconds", "0"),
    _P("DebugPanicAfter", "seconds", "0"),
    _P("DebugSimulateDataRace", "bool", "false"),
    _P("DebugHost", "host-address", "localhost"),
    _P("DebugPort", "int(0:65535)", ""),
    _P("RouteSource", "oneof(WorkloadIPs,CalicoIPAM)", "CalicoIPAM"),
    _P("RouteTableRange", "route-table-range", "", "die-on-fail"),
    _P("RouteTableRanges", "route-table-ranges", "", "die-on-fail"),
    _P("RouteSyncDisabled", "bool", "false"),
    _P("IPv4NormalRoutePriority", "int(1:2147483646)", "1024"),
    _P("IPv4ElevatedRoutePriority", "int(1:2147483646)", "512"),
    _P("IPv6NormalRoutePriority", "int(1:2147483646)", "1024"),
    _P("IPv6ElevatedRoutePriority", "int(1:2147483646)", "512"),
    _P("LiveMigrationRouteConvergenceTime", "seconds", "30"),
    _P("IptablesNATOutgoingInterfaceFilter", "iface-param", ""),
    _P("SidecarAccelerationEnabled", "bool", "false"),
    _P("XDPEnabled", "bool", "true"),
    _P("GenericXDPEnabled", "bool", "false"),
    _P("Variant", "string", "Calico"),
    _P("GoGCThreshold", "int(-1)", "40"),
    _P("GoMemoryLimitMB", "int(-1)", "-1"),
    _P("GoMaxProcs", "int(-1)", "-1"),
    _P("MTUIfacePattern", "regexp", "^((en|wl|ww|sl|ib)[Pcopsvx].*|(eth|wlan|wwan).*)"),
    _P("NftablesRefreshInterval", "seconds", "180"),
    _P("NftablesFilterAllowAction", "oneof(ACCEPT,RETURN)", "ACCEPT", "non-zero,die-on-fail"),
    _P("NftablesMangleAllowAction", "oneof(ACCEPT,RETURN)", "ACCEPT", "non-zero,die-on-fail"),
    _P("NftablesFilterDenyAction", "oneof(DROP,REJECT)", "DROP", "non-zero,die-on-fail"),
    _P("NftablesMarkMask", "mark-bitmask", "0xffff0000", "non-zero,die-on-fail"),
    _P("RequireMTUFile", "bool", "false"),
    _P("BPFMaglevMaxEndpointsPerService", "int(1:3000)", "100"),
    _P("BPFMaglevMaxServices", "int(1:3000)", "100"),
)
FELIX_PARAMS_BY_KEY: dict[str, FelixParam] = {p.name.lower(): p for p in FELIX_PARAMS}

# Felix's daemon restarts on a change of any parameter except these.
LIVE_IN_FELIX = frozenset({"CalicoVersion", "ClusterGUID", "ClusterType",
                           "HealthTimeoutOverrides"})

# FelixConfiguration spec keys whose parameter Felix names differently (matched
# case-insensitively; every other spec key is the parameter's name in camelCase).
_SPEC_ALIASES = {
    "ipipenabled": "IpInIpEnabled",
    "ipipmtu": "IpInIpMtu",
    "iptablespostwritecheckinterval": "IptablesPostWriteCheckIntervalSecs",
    "iptableslockprobeinterval": "IptablesLockProbeIntervalMillis",
    "netlinktimeout": "NetlinkTimeoutSecs",
    "reportinginterval": "ReportingIntervalSecs",
    "reportingttl": "ReportingTTLSecs",
    "endpointreportingdelay": "EndpointReportingDelaySecs",
    "usagereportinginitialdelay": "UsageReportingInitialDelaySecs",
    "usagereportinginterval": "UsageReportingIntervalSecs",
    "externalnodeslist": "ExternalNodesCIDRList",
    "wireguardkeepalive": "WireguardPersistentKeepAlive",
    "bpfconntrackmode": "BPFConntrackCleanupMode",
}


# FelixConfiguration spec fields that are not parameters (Felix's update processor skips them)
SPEC_FIELDS_NOT_PARAMETERS = frozenset({"nodeselector"})


def spec_key_to_name(key: str) -> str:
    """A FelixConfiguration spec key -> the parameter name it sets (unchanged if none)."""
    return _SPEC_ALIASES.get(key.lower(), key)


# --- validators per Felix parameter kind ---------------------------------------------------

_IFACE = r"[a-zA-Z0-9_-]{1,15}"
_IFACE_LIST_RE = re.compile(rf"^{_IFACE}(,{_IFACE})*$")
_IFACE_PARAM_RE = re.compile(r"^[a-zA-Z0-9:._+-]{1,15}$")
_IFACE_FILTER_RE = re.compile(r"^[a-zA-Z0-9:._+-]{1,15}$")
_AUTHORITY_RE = re.compile(r"^[^:/]+:\d+$")
_HOSTNAME_RE = re.compile(r"^[a-zA-Z0-9_.-]+$")
_HOST_ADDRESS_RE = re.compile(r"^[a-zA-Z0-9:._+-]{1,64}$")
_LOG_RATE_RE = re.compile(r"^([1-9]\d{0,3}/(?:second|minute|hour|day))?$")
_REGION_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}
_DSCP_NAMES = {"DF": 0, "EF": 46, **{f"CS{i}": i * 8 for i in range(8)},
               **{f"AF{c}{d}": c * 8 + d * 2 for c in range(1, 5) for d in range(1, 4)}}


def parse_felix_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "y", "t"):
        return True
    if lowered in ("false", "0", "no", "n", "f"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def parse_duration(text: str, unit: float = 1.0) -> float:
    """A plain number (in `unit` seconds, Felix's env/file form) or a Go duration such as
    `90s`, `1m30s`, `250ms` (a FelixConfiguration's form); returns seconds."""
    stripped = text.strip()
    try:
        value = float(stripped) * unit
    except ValueError:
        sign = -1.0 if stripped.startswith("-") else 1.0
        body = stripped.lstrip("+-")
        parts = _DURATION_PART_RE.findall(body)
        if not body or "".join(n + u for n, u in parts) != body:
            raise ValueError(f"{text!r} is not a duration (seconds, or 90s/1m30s/250ms)")\
                from None
        value = sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    return value


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not valid JSON") from None


def _split_list(text: str) -> list[str]:
    """Comma-separated items, or a FelixConfiguration's JSON list of strings."""
    stripped = text.strip()
    if stripped.startswith("["):
        items = _json(stripped)
        if not isinstance(items, list) or not all(isinstance(i, str | int) for i in items):
            raise ValueError(f"{stripped[:60]!r} is not a list of strings")
        return [str(i).strip() for i in items if str(i).strip()]
    return [item.strip() for item in stripped.split(",") if item.strip()]


def _int_range(args: str) -> tuple[int | None, int | None]:
    if not args:
        return None, None
    sep = ":" if ":" in args else ","
    lo, _, hi = args.partition(sep)
    return (int(lo) if lo else None), (int(hi) if hi else None)


def _check_range(value: float, lo: float | None, hi: float | None, text: str) -> None:
    if lo is not None and value < lo:
        raise ValueError(f"{text!r} is below the minimum {lo:g}")
    if hi is not None and value > hi:
        raise ValueError(f"{text!r} is above the maximum {hi:g}")


def _port_range(text: str) -> tuple[int, int]:
    lo_text, sep, hi_text = text.strip().partition(":")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if sep else lo
    except ValueError:
        raise ValueError(f"{text!r} is not a port or port range (N or N:M)") from None
    if not 0 <= lo <= hi <= 65535:
        raise ValueError(f"{text!r} is not a port range within 0-65535")
    return lo, hi


def _table_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)-(\d+)\s*", text)
    if match is None:
        raise ValueError(f"{text!r} is not a route table range (N-M)")
    lo, hi = int(match[1]), int(match[2])
    if not 1 <= lo <= hi <= 0xFFFFFFFF:
        raise ValueError(f"{text!r} is not a route table range (1 <= N <= M)")
    return lo, hi


def _range_entries(text: str) -> list[str]:
    """`1-250,300-400` or a FelixConfiguration's JSON {min, max} object / list of them."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return [item for item in stripped.split(",") if item.strip()]
    data = _json(stripped)
    entries = data if isinstance(data, list) else [data]
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not {"min", "max"} <= set(entry):
            raise ValueError(f"{entry!r}: expected {{min, max}}")
        out.append(f"{entry['min']}-{entry['max']}")
    return out


def parse_route_table_range(text: str) -> tuple[int, int]:
    """Felix's RouteTableRange: `N-M` within 1-250 (or a JSON {min, max})."""
    entries = _range_entries(text)
    if len(entries) != 1:
        raise ValueError(f"{text!r} is not one route table range")
    lo, hi = _table_range(entries[0])
    if hi > 250:
        raise ValueError(f"{text!r}: route table indices must be within 1-250")
    return lo, hi


def parse_route_table_ranges(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(_table_range(entry) for entry in _range_entries(text))


# BPFConntrackTimeouts' keys (Felix's), each a duration or `Auto`
BPF_CONNTRACK_TIMEOUT_KEYS = ("CreationGracePeriod", "TCPSynSent", "TCPEstablished",
                              "TCPFinsSeen", "TCPResetSeen", "UDPTimeout", "GenericTimeout",
                              "ICMPTimeout")


def parse_key_values(text: str) -> tuple[tuple[str, str], ...]:
    """Felix's keyvaluelist: `k=v,k2=v2` or a JSON object; sorted (key, value) pairs."""
    return _key_values(text)


def _key_values(text: str) -> tuple[tuple[str, str], ...]:
    stripped = text.strip()
    if stripped.startswith("{"):
        data = _json(stripped)
        if not isinstance(data, dict):
            raise ValueError(f"{stripped[:60]!r} is not a JSON object")
        return tuple(sorted((str(k), str(v)) for k, v in data.items()))
    out = {}
    for item in stripped.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item.strip()!r}: expected key=value")
        out[key.strip()] = value.strip()
    return tuple(sorted(out.items()))


def _key_durations(text: str) -> tuple[tuple[str, float], ...]:
    stripped = text.strip()
    if stripped.startswith("["):
        data = _json(stripped)
        if not isinstance(data, list) or not all(
                isinstance(e, dict) and {"name", "timeout"} <= set(e) for e in data):
            raise ValueError(f"{stripped[:60]!r}: expected a list of {{name, timeout}}")
        stripped = ",".join(f"{e['name']}={e['timeout']}" for e in data)
    return tuple((k, parse_duration(v)) for k, v in _key_values(stripped))


def _port_list(text: str) -> tuple[tuple[str, int], ...]:
    stripped = text.strip()
    if stripped.startswith("["):
        data = _json(stripped)
        if not isinstance(data, list) or not all(isinstance(e, dict) and "port" in e
                                                 for e in data):
            raise ValueError(f"{stripped[:60]!r}: expected a list of {{protocol, port}}")
        stripped = ",".join(f"{e.get('protocol', 'tcp')}:{e['port']}" for e in data)
    out = []
    for item in stripped.split(","):
        item = item.strip()
        if not item:
            continue
        proto, _, port = item.rpartition(":")
        proto = (proto or "tcp").lower()
        if proto not in ("tcp", "udp", "sctp"):
            raise ValueError(f"{item!r}: protocol must be tcp, udp or sctp")
        lo, hi = _port_range(port)
        if lo != hi:
            raise ValueError(f"{item!r}: expected one port")
        out.append((proto, lo))
    return tuple(out)


def _regexp_checked(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if not pattern.fullmatch(value):
            raise ValueError(f"{text[:60]!r} is not {what}")
        return value

    return parse


def _compiles(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"{text[:60]!r} is not a regular expression: {exc}") from None
    return text


def _iface_list_regexp(text: str) -> tuple[str, ...]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("/") and item.endswith("/") and len(item) > 2:
            _compiles(item[1:-1])
        elif not re.fullmatch(_IFACE, item):
            raise ValueError(f"{item!r} is neither an interface name nor a /regex/")
        out.append(item)
    return tuple(out)


def _ip(version: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            address = ipaddress.ip_address(text.strip())
        except ValueError:
            raise ValueError(f"{text[:60]!r} is not an IPv{version} address") from None
        if address.version != version:
            raise ValueError(f"{text[:60]!r} is not an IPv{version} address")
        return str(address)

    return parse


def _cidr_list(text: str) -> tuple[str, ...]:
    out = []
    for item in _split_list(text):
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(f"{item[:60]!r} is not a CIDR") from None
    return tuple(out)


def _endpoint_list(text: str) -> tuple[str, ...]:
    out = []
    for item in _split_list(text):
        match = re.fullmatch(r"(https?)://([^/:]+|\[[0-9a-fA-F:]+\]):(\d+)/?", item)
        if match is None or not 0 < int(match[3]) < 65536:
            raise ValueError(f"{item[:60]!r} is not an endpoint URL (http(s)://HOST:PORT)")
        out.append(item.rstrip("/"))
    return tuple(out)


def _file(args: str) -> Callable[[str], str]:
    must_exist = "must-exist" in args
    executable = "executable" in args

    def parse(text: str) -> str:
        path = text.strip()
        if executable and shutil.which(path) is None:
            raise ValueError(f"{path!r} is not an executable file (absolute or on PATH)")
        if must_exist and not executable and not os.path.exists(path):
            raise ValueError(f"{path!r} does not exist")
        return path

    return parse


def _one_of(args: str) -> Callable[[str], str]:
    choices = [c for c in args.split(",") if c]

    def parse(text: str) -> str:
        for choice in choices:
            if text.strip().lower() == choice.lower():
                return choice
        raise ValueError(f"{text[:60]!r} is not one of {', '.join(choices)}")

    return parse


def _int(args: str) -> Callable[[str], int]:
    lo, hi = _int_range(args)

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 0) if text.strip().lower().startswith("0x") \
                else int(text.strip())
        except ValueError:
            raise ValueError(f"{text[:60]!r} is not an integer") from None
        _check_range(value, lo, hi, text)
        return value

    return parse


def _seconds(args: str, unit: float = 1.0) -> Callable[[str], float]:
    lo, hi = _int_range(args)

    def parse(text: str) -> float:
        value = parse_duration(text, unit)
        _check_range(value, lo, hi, text)
        return value

    return parse


def _mark_bitmask(text: str) -> int:
    try:
        value = int(text.strip(), 0)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a 32-bit mark mask (e.g. 0xffff0000)") from None
    if not 0 < value <= 0xFFFFFFFF:
        raise ValueError(f"{text[:60]!r} is not a non-zero 32-bit mask")
    return value


def _dscp(text: str) -> int:
    stripped = text.strip()
    if stripped.upper() in _DSCP_NAMES:
        return _DSCP_NAMES[stripped.upper()]
    try:
        value = int(stripped)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a DSCP value (0-63 or a name such as AF11)")\
            from None
    _check_range(value, 0, 63, text)
    return value


def validator(kind: str) -> Callable[[str], Any]:
    """The parser of a Felix parameter kind (`int(0:65535)`, `oneof(A,B)`, ...)."""
    base, _, rest = kind.partition("(")
    args = rest.rstrip(")")
    simple: dict[str, Callable[[str], Any]] = {
        "bool": parse_felix_bool,
        "*bool": parse_felix_bool,
        "string": lambda text: text.strip(),
        "iface-list": _regexp_checked(_IFACE_LIST_RE, "a list of interface names"),
        "iface-list-regexp": _iface_list_regexp,
        "iface-param": _regexp_checked(_IFACE_PARAM_RE, "an interface name or pattern"),
        "log-rate": _regexp_checked(_LOG_RATE_RE, "a rate such as 10/second"),
        "authority": _regexp_checked(_AUTHORITY_RE, "HOST:PORT"),
        "hostname": _regexp_checked(_HOSTNAME_RE, "a hostname"),
        "host-address": _regexp_checked(_HOST_ADDRESS_RE, "a host name or address"),
        "region": _regexp_checked(_REGION_RE, "a region name (lower-case, digits, -)"),
        "ipv4": _ip(4),
        "ipv6": _ip(6),
        "cidr-list": _cidr_list,
        "endpoint-list": _endpoint_list,
        "port-list": _port_list,
        "portrange": _port_range,
        "portrange-list": lambda text: tuple(_port_range(i) for i in _split_list(text)),
        "iface-filter-slice": lambda text: tuple(
            _regexp_checked(_IFACE_FILTER_RE, "an interface name or prefix+")(i)
            for i in _split_list(text)),
        "route-table-range": parse_route_table_range,
        "route-table-ranges": parse_route_table_ranges,
        "keyvaluelist": _key_values,
        "keydurationlist": _key_durations,
        "dscp": _dscp,
        "mark-bitmask": _mark_bitmask,
        "regexp": _compiles,
    }
    if base in simple:
        return simple[base]
    if base == "int":
        return _int(args)
    if base == "seconds":
        return _seconds(args)
    if base == "millis":
        return _seconds(args, unit=0.001)
    if base == "oneof":
        return _one_of(args)
    if base == "file":
        return _file(args)
    raise KeyError(f"unknown Felix parameter kind {kind!r}")


def zero_value(kind: str) -> Any:
    """What Felix's `none` sets a parameter of this kind to (its Go zero value)."""
    base = kind.partition("(")[0]
    if base in ("bool",):
        return False
    if base in ("*bool",):
        return None
    if base in ("int", "dscp", "mark-bitmask"):
        return 0
    if base in ("seconds", "millis"):
        return 0.0
    if base in ("cidr-list", "endpoint-list", "port-list", "portrange-list",
                "iface-filter-slice", "route-table-ranges", "keyvaluelist",
                "keydurationlist", "iface-list-regexp"):
        return ()
    if base in ("portrange", "route-table-range"):
        return (0, 0)
    return ""


def parse_value(param: FelixParam, text: str) -> Any:
    """`text` parsed as Felix would parse it for `param` (`none` -> the zero value)."""
    if text.strip().lower() == "none":
        if param.non_zero:
            raise ValueError("cannot be none (Felix requires a value)")
        return zero_value(param.kind)
    if "skip-default-validation" in param.flags and text.strip() == param.default:
        return text.strip()
    return validator(param.kind)(text)


def default_value(param: FelixParam) -> Any:
    """Felix's default, parsed (the kind's zero value when Felix has none)."""
    if not param.default:
        return zero_value(param.kind)
    return parse_value(param, param.default)

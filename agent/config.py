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
from prometheus_client import Counter

log = logging.getLogger(__name__)

CONFIG_ERRORS = Counter(
    "pyfelix_config_errors",
    "Number of configuration values rejected because they were unknown or did not parse.",
    ["source"],
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
    stripped = text.strip()
    units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
    for suffix, factor in units:
        if stripped.endswith(suffix) and stripped[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(stripped[: -len(suffix)]) * factor
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (seconds, or 90s/5m/1h/250ms)") from None
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
    restart: bool = False  # a change needs an agent restart
    datastore: bool = True  # may come from a FelixConfiguration
    help: str = ""


DEFAULT_FAILSAFE_IN = "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"
DEFAULT_FAILSAFE_OUT = "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667"

PARAMS: tuple[Param, ...] = (
    Param("DatastoreType", "file", enum_of("file", "etcdv3", "kubernetes", "typha"),
          restart=True, datastore=False, help="Which datastore backend to use."),
    Param("BPFEnabled", True, parse_bool, restart=True,
          help="Enforce policy with tc/XDP BPF programs (else iptables)."),
    Param("BPFFallback", "none", enum_of("none", "iptables"), restart=True,
          help="What to do when the kernel cannot run BPF mode: exit, or use iptables."),
    Param("BPFPinDir", "/sys/fs/bpf/pyfelix", parse_str, restart=True, datastore=False,
          help="bpffs directory under which pyfelix pins its maps."),
    Param("BPFMapSizeConntrack", 512000, parse_int, restart=True),
    Param("BPFMapSizeIPSets", 1048576, parse_int, restart=True),
    Param("BPFMapSizeRules", 65536, parse_int, restart=True),
    Param("BPFMapSizeRoutes", 262144, parse_int, restart=True),
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
    Param("BPFEnforceRPF", "Strict", enum_of("Disabled", "Strict", "Loose"),
          help="Reverse-path check of packets arriving on host endpoint interfaces (BPF "
               "mode): Strict (the route back leaves by the same interface), Loose (the "
               "source is routable), Disabled."),
    Param("HealthEnabled", False, parse_bool, restart=True),
    Param("HealthHost", "localhost", parse_str, restart=True),
    Param("HealthPort", 9099, parse_port, restart=True),
    Param("HealthTimeoutOverrides", (), parse_health_timeout_overrides, restart=True,
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
    Param("LogSeverityScreen", "Info", enum_of("Debug", "Info", "Warning", "Error", "Fatal")),
    Param("DefaultEndpointToHostAction", "Drop", enum_of("Drop", "Return", "Accept")),
    Param("IptablesBackend", "Auto", enum_of("Auto", "NFT", "Legacy"), restart=True),
    Param("IptablesRefreshInterval", 90.0, parse_seconds),
    Param("RouteRefreshInterval", 90.0, parse_seconds),
    Param("RouteTableProtocol", 80, parse_int, restart=True),
    Param("FailsafeInboundHostPorts", parse_proto_ports(DEFAULT_FAILSAFE_IN), parse_proto_ports),
    Param("FailsafeOutboundHostPorts", parse_proto_ports(DEFAULT_FAILSAFE_OUT),
          parse_proto_ports),
    Param("InterfaceExclude", "kube-ipvs0", parse_interface_names, restart=True,
          help="Interfaces (names or /regex/, comma-separated) never treated as host IPs."),
    Param("VXLANVNI", 4096, int_in(1, (1 << 24) - 1), restart=True),
    Param("VXLANPort", 4789, parse_port, restart=True),
    Param("VXLANMTU", 0, int_in(68, 65535, also=(0,)), restart=True),
    Param("EndpointReportingEnabled", False, parse_bool),
    Param("ReportingTTLSecs", 90.0, parse_seconds),
    Param("DataplaneFailClosedAfter", 60.0, parse_seconds,
          help="Exit non-zero when policy could not be programmed for this long."),
    Param("StatusFile", "", parse_str, datastore=False,
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

    def get(self, felix_name: str) -> Any:
        return self._values[PARAMS_BY_KEY[felix_name.lower()].name]

    def source_of(self, felix_name: str) -> str:
        return self._sources[PARAMS_BY_KEY[felix_name.lower()].name]

    def as_strings(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, str(v)) for k, v in self._values.items()))

    def changed_requiring_restart(self, new: Config) -> list[str]:
        return [p.name for p in PARAMS
                if p.restart and self._values[p.name] != new._values[p.name]]


def _apply(layer: Mapping[str, str], source: str, values: dict[str, Any],
           sources: dict[str, str], *, strict: bool, from_datastore: bool) -> list[ConfigError]:
    errors = []
    for raw_name, raw_value in layer.items():
        param = PARAMS_BY_KEY.get(raw_name.lower())
        try:
            if param is None:
                raise ConfigError(source, raw_name, "unknown parameter")
            if from_datastore and not param.datastore:
                raise ConfigError(source, param.name, "cannot be set from the datastore")
            try:
                values[param.name] = param.parse(str(raw_value))
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
    sources = {p.name: "default" for p in PARAMS}
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

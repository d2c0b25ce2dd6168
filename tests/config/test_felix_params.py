"""Felix's parameter table: every name accepted, validated with its Felix kind; the
not-implemented ones listed and counted; Felix's restart rule; `none` and empty values."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from pyfelix.agent import config as config_module
from pyfelix.agent.config import (
    NOT_IMPLEMENTED,
    PARAMS,
    ConfigError,
    load_config,
    note_not_implemented,
)
from pyfelix.agent.felix_params import (
    FELIX_PARAMS,
    FELIX_PARAMS_BY_KEY,
    LIVE_IN_FELIX,
    default_value,
    parse_value,
    validator,
)

FELIX_SAMPLE_ENV = {
    "FELIX_IPV6SUPPORT": "false",
    "FELIX_IPINIPMTU": "1440",
    "FELIX_ETCDENDPOINTS": "",
    "FELIX_ETCDADDR": "127.0.0.1:2379",
    "FELIX_DEFAULTENDPOINTTOHOSTACTION": "ACCEPT",
    "FELIX_LOGFILEPATH": "none",
    "FELIX_LOGSEVERITYSCREEN": "info",
    "FELIX_HEALTHENABLED": "true",
    "FELIX_IPINIPENABLED": "false",
    "FELIX_POLICYSYNCPATHPREFIX": "/var/run/nodeagent",
}


def _defaults_as_text() -> dict[str, str]:
    """Every Felix name set to Felix's default (names with no default left out: an empty
    value means unset)."""
    return {p.name: p.default for p in FELIX_PARAMS if p.default}


def test_table_is_felixs_and_every_default_parses() -> None:
    assert len(FELIX_PARAMS) == len(FELIX_PARAMS_BY_KEY) > 200
    for param in FELIX_PARAMS:
        default_value(param)  # raises on a default Felix itself would not parse
    assert FELIX_PARAMS_BY_KEY["datastoretype"].local
    assert FELIX_PARAMS_BY_KEY["interfaceprefix"].non_zero
    assert "HealthTimeoutOverrides" in LIVE_IN_FELIX


def test_every_name_at_its_default_is_accepted_from_env_and_file(tmp_path) -> None:
    env = {f"FELIX_{name.upper()}": value for name, value in _defaults_as_text().items()}
    env["FELIX_LOGFILEPATH"] = str(tmp_path / "felix.log")
    config = load_config(environ=env)
    assert config.datastore_type == "etcdv3"
    assert set(config.not_implemented()) == {n for n in NOT_IMPLEMENTED
                                             if FELIX_PARAMS_BY_KEY[n.lower()].default}
    conf = tmp_path / "felix.cfg"
    conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in
                                          _defaults_as_text().items()
                                          if k != "LogFilePath"))
    from_file = load_config(environ={}, config_file=str(conf))
    assert from_file.source_of("ChainInsertMode").startswith("file:")
    assert from_file.get("ChainInsertMode") == "insert"


def test_felix_sample_environment_loads() -> None:
    config = load_config(environ=FELIX_SAMPLE_ENV)
    assert config.default_endpoint_to_host_action == "Accept"
    assert config.etcd_endpoints == ()  # empty: unset
    assert config.log_file_path == ""  # none: no log file
    assert {"PolicySyncPathPrefix"} <= set(config.not_implemented())
    assert "Ipv6Support" not in config.not_implemented()  # implemented: a restart setting
    assert config.get("IpInIpMtu") == 1440 and config.ipv6support is False
    assert config.ip_in_ip_enabled == "false"  # implemented (IPIP manager)


def test_only_names_felix_does_not_know_are_errors() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"FELIX_IPINIPMTUU": "1440"})
    assert info.value.name == "IPINIPMTUU" and str(info.value).startswith("env: ")
    assert "unknown parameter" in str(info.value)


@pytest.mark.parametrize(("name", "value", "fragment"), [
    ("IpInIpMtu", "big", "not an integer"),
    ("ChainInsertMode", "middle", "not one of insert, append"),
    ("MetadataPort", "70000", "above the maximum 65535"),
    ("NATOutgoingAddress", "10.0.0.300", "not an IPv4 address"),
    ("ExternalNodesCIDRList", "10.0.0.0/33", "not a CIDR"),
    ("IptablesMarkMask", "0", "non-zero 32-bit mask"),
    ("RouteTableRange", "1-300", "within 1-250"),
    ("KubeNodePortRanges", "30000:70000", "port range"),
    ("LogActionRateLimit", "fast", "rate"),
    ("BPFDataIfacePattern", "(unclosed", "regular expression"),
    ("InterfacePrefix", "none", "cannot be none"),
    ("XDPRefreshInterval", "soon", "not a duration"),
    ("RouteTableProtocol", "3", "5-255"),
    # implemented, and checked against Felix's own type too
    ("HealthHost", "bad host!", "not a host name or address"),
    ("TyphaAddr", "typha", "HOST:PORT"),
])
def test_bad_values_name_the_parameter(name, value, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={f"FELIX_{name.upper()}": value})
    assert info.value.name == name
    assert fragment in str(info.value)


def test_bad_datastore_value_is_counted_and_the_rest_applies() -> None:
    def count() -> float:
        return REGISTRY.get_sample_value("pyfelix_config_errors_total",
                                         {"source": "datastore"}) or 0.0

    before = count()
    config = load_config(environ={}, datastore_global={
        "ipipMTU": "lots", "chainInsertMode": "append", "etcdAddr": "10.0.0.1:2379"})
    assert count() == before + 2  # the bad value and the local-only one
    assert config.get("ChainInsertMode") == "append"
    assert config.get("IpInIpMtu") == 0 and config.etcd_addr == "127.0.0.1:2379"


def test_felixconfiguration_spec_spellings() -> None:
    config = load_config(environ={}, datastore_global={
        "ipipMTU": "1400", "reportingInterval": "1m30s", "iptablesLockProbeInterval": "50ms",
        "routeTableRange": '{"max": 250, "min": 1}', "bpfConntrackMode": "Userspace",
        "healthTimeoutOverrides": '[{"name": "dataplane", "timeout": "2m"}]',
        "externalNodesList": '["10.1.0.0/16"]', "xdpEnabled": "false",
        "nodeSelector": "all()"})  # a spec field, not a parameter: skipped
    assert config.get("IpInIpMtu") == 1400
    assert config.get("ReportingIntervalSecs") == 90.0
    assert config.get("IptablesLockProbeIntervalMillis") == pytest.approx(0.05)
    assert config.get("RouteTableRange") == (1, 250)
    assert config.get("BPFConntrackCleanupMode") == "Userspace"
    assert config.health_timeout_overrides == (("dataplane", 120.0),)
    assert config.get("ExternalNodesCIDRList") == ("10.1.0.0/16",)


def test_none_sets_the_zero_value() -> None:
    config = load_config(environ={"FELIX_USAGEREPORTINGENABLED": "none",
                                  "FELIX_LOGSEVERITYSYS": "none",
                                  "FELIX_FAILSAFEINBOUNDHOSTPORTS": "none"})
    assert config.get("UsageReportingEnabled") is False
    assert config.log_severity_sys == ""
    assert config.failsafe_inbound_host_ports == ()


def test_restart_rule_is_felixs() -> None:
    base = load_config(environ={})
    # not implemented, but Felix restarts on it: so does pyfelix
    assert base.changed_requiring_restart(load_config(environ={"FELIX_WIREGUARDMTU": "1400"})) \
        == ["WireguardMTU"]
    # Felix applies these live
    assert base.changed_requiring_restart(load_config(environ={"FELIX_CLUSTERGUID": "x"})) == []
    live = {p.name for p in PARAMS if not p.restart}
    assert {"LogSeverityScreen", "LogSeverityFile", "LogSeveritySys",
            "DefaultEndpointToHostAction", "FailsafeInboundHostPorts",
            "FailsafeOutboundHostPorts", "BPFEnforceRPF", "BPFRedirectToPeer",
            "HealthTimeoutOverrides",
            "StatusFile"} == live
    # every implemented Felix parameter not applied live restarts
    assert base.changed_requiring_restart(load_config(environ={
        "FELIX_ROUTEREFRESHINTERVAL": "30"})) == ["RouteRefreshInterval"]


def test_not_implemented_warned_once_and_counted(caplog) -> None:
    config_module._warned_not_implemented.discard("WireguardMTU")
    config = load_config(environ={"FELIX_WIREGUARDMTU": "1440"})
    with caplog.at_level(logging.WARNING, logger="pyfelix.agent.config"):
        note_not_implemented(config)
        note_not_implemented(config)
    warnings = [r for r in caplog.records if "WireguardMTU" in r.getMessage()]
    assert len(warnings) == 1 and "not implemented" in warnings[0].getMessage()
    assert REGISTRY.get_sample_value("pyfelix_config_not_implemented",
                                     {"parameter": "WireguardMTU"}) == 1.0


def test_kind_validators_accept_felix_forms() -> None:
    assert validator("portrange")("20000:29999") == (20000, 29999)
    assert validator("keyvaluelist")("a=1,b=2") == (("a", "1"), ("b", "2"))
    assert validator("dscp")("AF11") == 10
    assert validator("endpoint-list")("http://a:2379,https://b:2379") == (
        "http://a:2379", "https://b:2379")


def test_seconds_range_is_checked() -> None:
    with pytest.raises(ValueError, match="above the maximum"):
        validator("seconds(0:30)")("1m")


def test_parse_value_skips_validating_an_unvalidated_default() -> None:
    driver = FELIX_PARAMS_BY_KEY["dataplanedriver"]
    assert parse_value(driver, "calico-iptables-plugin") == "calico-iptables-plugin"
    with pytest.raises(ValueError):
        parse_value(driver, "/no/such/plugin")

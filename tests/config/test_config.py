"""Layering, parsing and error reporting of agent.config."""

from __future__ import annotations

import pytest

from pyfelix.agent.config import ConfigError, attribute_name, load_config


def test_defaults_are_felixs() -> None:
    config = load_config(environ={})
    assert config.health_port == 9099
    assert config.prometheus_metrics_port == 9091
    assert config.interface_prefix == "cali"
    assert config.bpf_enabled is True
    assert ("tcp", 22) in config.failsafe_inbound_host_ports
    assert config.source_of("HealthPort") == "default"


def test_layers_in_priority_order(tmp_path) -> None:
    conf = tmp_path / "felix.cfg"
    conf.write_text(
        "[global]\nHealthPort = 9100\nLogSeverityScreen = Debug\nInterfacePrefix = tap\n"
    )
    config = load_config(
        environ={"FELIX_HEALTHPORT": "9200", "FELIX_INTERFACEPREFIX": "veth", "PATH": "/bin"},
        config_file=str(conf),
        datastore_global={"healthPort": "9300", "logSeverityScreen": "Warning"},
        datastore_node={"logSeverityScreen": "Error"},
    )
    assert config.health_port == 9300 and config.source_of("HealthPort") == "datastore:default"
    assert config.log_severity_screen == "Error"
    assert config.interface_prefix == "veth" and config.source_of("interfaceprefix") == "env"


def test_yaml_config_file(tmp_path) -> None:
    conf = tmp_path / "felix.yaml"
    conf.write_text("BPFEnabled: false\nRouteRefreshInterval: 30s\n")
    config = load_config(environ={}, config_file=str(conf))
    assert config.bpf_enabled is False
    assert config.route_refresh_interval == 30.0


@pytest.mark.parametrize(
    ("env", "name", "fragment"),
    [
        ({"FELIX_HEALTHPORT": "99999"}, "HealthPort", "not a port"),
        ({"FELIX_HEALTHPORT": "nine"}, "HealthPort", "not an integer"),
        ({"FELIX_BPFENABLED": "maybe"}, "BPFEnabled", "not a boolean"),
        ({"FELIX_NOSUCHTHING": "1"}, "NOSUCHTHING", "unknown parameter"),
        ({"FELIX_DEFAULTENDPOINTTOHOSTACTION": "Explode"}, "DefaultEndpointToHostAction",
         "not one of"),
        ({"FELIX_FAILSAFEINBOUNDHOSTPORTS": "icmp:1"}, "FailsafeInboundHostPorts", "protocol"),
        ({"FELIX_BPFCONNTRACKTIMEOUTS": "TCPFinSeen=5s"}, "BPFConntrackTimeouts",
         "unknown key 'TCPFinSeen'"),
        ({"FELIX_BPFCONNTRACKTIMEOUTS": "UDPTimeout=soon"}, "BPFConntrackTimeouts",
         "UDPTimeout"),
        ({"FELIX_BPFCONNTRACKTIMEOUTS": "ICMPTimeout=500ms"}, "BPFConntrackTimeouts",
         "1 s resolution"),
    ],
)
def test_bad_env_values_name_the_parameter(env, name, fragment) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ=env)
    assert info.value.name == name
    assert fragment in str(info.value)
    assert str(info.value).startswith("env: ")


def test_bad_datastore_value_is_skipped_not_fatal() -> None:
    config = load_config(environ={}, datastore_global={"healthPort": "0", "logSeverityScreen":
                                                      "Debug", "datastoreType": "kubernetes"})
    assert config.health_port == 9099
    assert config.log_severity_screen == "Debug"
    assert config.datastore_type == "etcdv3"  # Felix's default; local-only


def test_restart_required_changes() -> None:
    old = load_config(environ={})
    new = load_config(environ={"FELIX_BPFENABLED": "false", "FELIX_LOGSEVERITYSCREEN": "Debug"})
    assert old.changed_requiring_restart(new) == ["BPFEnabled"]


def test_attribute_names() -> None:
    assert attribute_name("BPFEnabled") == "bpf_enabled"
    assert attribute_name("PrometheusMetricsPort") == "prometheus_metrics_port"
    assert attribute_name("ReportingTTLSecs") == "reporting_ttl_secs"
    assert attribute_name("BPFMapSizeIPSets") == "bpf_map_size_ip_sets"


def test_health_settings_defaults_and_both_override_forms() -> None:
    config = load_config(environ={})
    assert config.health_timeout_overrides == ()
    assert config.dataplane_watchdog_timeout == 90.0
    assert (config.health_max_connections, config.health_read_timeout) == (32, 5.0)
    assert (config.prometheus_metrics_max_connections,
            config.prometheus_metrics_read_timeout) == (32, 5.0)
    env = load_config(environ={"FELIX_HEALTHTIMEOUTOVERRIDES": "dataplane=120s, calc-graph=0"})
    assert env.health_timeout_overrides == (("calc-graph", 0.0), ("dataplane", 120.0))
    # a FelixConfiguration spec carries Felix's list of {name, timeout}
    ds = load_config(environ={}, datastore_global={
        "healthTimeoutOverrides": '[{"name": "InternalDataplaneMainLoop", "timeout": "2m"}]'})
    assert ds.health_timeout_overrides == (("InternalDataplaneMainLoop", 120.0),)


@pytest.mark.parametrize(("env", "fragment"), [
    ({"FELIX_HEALTHTIMEOUTOVERRIDES": "dataplane"}, "expected name=duration"),
    ({"FELIX_HEALTHTIMEOUTOVERRIDES": "dataplane=soon"}, "not a duration"),
    ({"FELIX_HEALTHMAXCONNECTIONS": "0"}, "at least 1"),
    ({"FELIX_PROMETHEUSMETRICSREADTIMEOUT": "0s"}, "longer than 0 s"),
])
def test_bad_health_settings_are_clear_errors(env, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(environ=env)


def test_bpf_conntrack_timeouts_felix_keys_over_the_defaults() -> None:
    from pyfelix.agent.bpf.maps import conntrack as ct_map
    from pyfelix.agent.dataplane.bpf_dataplane import build_config

    assert load_config(environ={}).get("BPFConntrackTimeouts") == ()
    felix_default = ("CreationGracePeriod=10s,TCPSynSent=20s,TCPEstablished=1h,"
                     "TCPFinsSeen=Auto,TCPResetSeen=40s,UDPTimeout=60s,GenericTimeout=10m,"
                     "ICMPTimeout=5s")
    config = load_config(environ={"FELIX_BPFCONNTRACKTIMEOUTS": felix_default})
    timeouts = ct_map.timeouts_from_felix(config.get("BPFConntrackTimeouts"))
    assert timeouts == ct_map.Timeouts(tcp_syn=20, tcp_est=3600, tcp_fin=30, tcp_rst=40,
                                       udp=60, icmp=5, other=600)
    short = load_config(environ={"FELIX_BPFCONNTRACKTIMEOUTS": "TCPFinsSeen=2s"})
    build = build_config(short)
    assert build.ct_timeouts == ct_map.Timeouts(tcp_fin=2)
    assert "-DCT_TIMEOUT_TCP_FIN=2" in build.cflags()

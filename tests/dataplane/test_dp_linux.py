"""LinuxDataplane wiring: manager order per mode, and Felix-named settings parsed clearly."""

from __future__ import annotations

import pytest

from pyfelix.agent.config import ConfigError, load_config
from pyfelix.agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig
from pyfelix.agent.dataplane.managers.iptables import IptablesManager


def test_manager_order_in_both_modes_and_bpf_mode_iptables_for_host_endpoints_only() -> None:
    dp = LinuxDataplane(netns="unused-not-opened")
    names = ["ipsets", "host-ips", "iptables", "nat-outgoing", "routes", "vxlan", "vxlan-v6",
             "ipip", "sysctls"]
    assert [m.name for m in dp.loop.managers] == names
    iptables = dp.loop.managers[2]
    assert isinstance(iptables, IptablesManager) and not iptables.host_endpoints_only
    dp = LinuxDataplane(netns="unused", config=LinuxDataplaneConfig(bpf_mode=True))
    # BPF mode: the same Linux managers; iptables for host endpoints and failsafes only
    assert [m.name for m in dp.loop.managers] == names
    iptables = dp.loop.managers[2]
    assert isinstance(iptables, IptablesManager) and iptables.host_endpoints_only
    # Ipv6Support false: no vxlan-v6.calico manager (nothing IPv6 programmed)
    dp = LinuxDataplane(netns="unused", config=LinuxDataplaneConfig(ipv6_support=False))
    assert "vxlan-v6" not in [m.name for m in dp.loop.managers]


def _from_felix(settings: dict[str, str], *, bpf_mode: bool = False) -> LinuxDataplaneConfig:
    """Felix-named settings as the agent takes them: parsed by agent.config, then handed to
    the dataplane's config."""
    config = load_config(environ={f"FELIX_{k.upper()}": v for k, v in settings.items()})
    return LinuxDataplaneConfig.from_config(config, bpf_mode=bpf_mode)


def test_config_from_felix_names() -> None:
    cfg = _from_felix({
        "InterfacePrefix": "cali,tap", "BPFMapSizeIPSets": "1000",
        "DefaultEndpointToHostAction": "Accept", "IptablesBackend": "Legacy",
        "IptablesRefreshInterval": "10"}, bpf_mode=True)
    assert cfg.interface_prefixes == ("cali", "tap") and cfg.bpf_mode
    assert cfg.max_ipset_size == 1000 and cfg.resync_interval == 10.0
    assert cfg.endpoint_to_host_action == "Accept" and cfg.iptables_backend == "legacy"
    assert _from_felix({}) == LinuxDataplaneConfig(bpf_pin_dir="/sys/fs/bpf/pyfelix")
    assert ("tcp", 22) in LinuxDataplaneConfig().failsafe_inbound  # Felix's defaults
    assert ("udp", 53) in LinuxDataplaneConfig().failsafe_outbound
    cfg = _from_felix({"FailsafeInboundHostPorts": "tcp:2222, udp:5000",
                       "InterfaceExclude": "kube-ipvs0,/dummy[0-9]+/"})
    assert cfg.failsafe_inbound == (("tcp", 2222), ("udp", 5000))


@pytest.mark.parametrize(("key", "value"), [
    ("BPFEnabled", "maybe"), ("BPFMapSizeIPSets", "lots"), ("IptablesRefreshInterval", "-1"),
    ("InterfacePrefix", " , "), ("RouteRefreshInterval", "soon"),
    ("FailsafeInboundHostPorts", "icmp:1"), ("FailsafeOutboundHostPorts", "tcp:99999"),
    ("InterfaceExclude", "/[unclosed/"), ("VXLANVNI", "x"), ("VXLANVNI", "0"),
    ("VXLANPort", "65536"), ("VXLANMTU", "10")])
def test_bad_settings_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _from_felix({key: value})

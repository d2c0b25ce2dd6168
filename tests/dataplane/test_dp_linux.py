"""LinuxDataplane wiring: manager order per mode, and Felix-named settings parsed clearly."""

from __future__ import annotations

import pytest

from agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig


def test_iptables_mode_order_and_bpf_mode_without_iptables() -> None:
    dp = LinuxDataplane(netns="unused-not-opened")
    assert [m.name for m in dp.loop.managers] == ["ipsets", "iptables", "routes", "sysctls"]
    dp = LinuxDataplane(netns="unused", config=LinuxDataplaneConfig(bpf_mode=True))
    assert [m.name for m in dp.loop.managers] == ["routes", "sysctls"]


def test_config_from_felix_names() -> None:
    cfg = LinuxDataplaneConfig.from_felix({
        "InterfacePrefix": "cali, tap", "BPFEnabled": "True", "MaxIpsetSize": "1000",
        "DefaultEndpointToHostAction": "Accept", "IptablesBackend": "Legacy",
        "IptablesRefreshInterval": "10s"})
    assert cfg.interface_prefixes == ("cali", "tap") and cfg.bpf_mode
    assert cfg.max_ipset_size == 1000 and cfg.resync_interval == 10.0
    assert LinuxDataplaneConfig.from_felix({}) == LinuxDataplaneConfig()


@pytest.mark.parametrize(("key", "value"), [
    ("BPFEnabled", "yes"), ("MaxIpsetSize", "lots"), ("IptablesRefreshInterval", "-1"),
    ("InterfacePrefix", " , "), ("InterfaceRefreshInterval", "soon")])
def test_bad_settings_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=key):
        LinuxDataplaneConfig.from_felix({key: value})

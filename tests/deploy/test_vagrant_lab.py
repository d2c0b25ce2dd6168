"""vagrant/: the multi-VM lab's Vagrantfile, scripts, systemd units and policy demo.

The lab boots only under `make vm-box && make vm-test` (minutes under TCG); these tests check,
without VM tooling, what can be checked without booting:
- the Vagrantfile parses (`ruby -c`) and, loaded against a stub of Vagrant's configuration
  API (vagrant_stub.rb; both skipped when ruby is not installed), configures the lab as
  documented (a text check of the same facts runs without ruby): the locally built Debian 12
  box booted by its own kernel, libvirt's driver as kvm-check.sh found it (TCG without an
  answer), isolated management and underlay networks, etcd + 2..3 nodes on 198.18.0.0/15, the
  repository synced to /opt/pyfelix without the box, every VM provisioned by provision.sh
  (which runs scripts/setup.sh) with its role, name, address and the etcd URL;
- the shell scripts parse (`bash -n`) and every pyfelix / vmlab.py command line they run is
  accepted by the real CLI parsers;
- every systemd unit has its required sections, runs real pyfelix subcommands or binaries
  the set-up installs, uses only variables its EnvironmentFile defines, and passes
  `systemd-analyze verify` (skipped when systemd-analyze is absent) except for the venv
  binary, which exists only inside a VM; confd, BIRD and the path unit agree on the files;
- the node settings equal the Kubernetes ConfigMap's;
- the demo resources pass pyfelix's resource validation, the pods' plumbing plan is sound
  (addresses, names, routes), and confd renders, for each node, a BIRD config that
  `bird -p` accepts and that peers with the other node.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_checks import (
    DEPLOY_DIR,
    REPO,
    VAGRANT_DIR,
    command_problems,
    find,
    load_documents,
    load_vmlab,
)

from pyfelix.agent.config import load_config
from pyfelix.agent.model import parse_resource
from pyfelix.agent.syncer.file import load_path, load_text
from pyfelix.confd.bird import BirdTools
from pyfelix.confd.render import render_from_updates

UNITS_DIR = VAGRANT_DIR / "systemd"
DEMO_DIR = VAGRANT_DIR / "demo"
UNDERLAY = ipaddress.IPv4Network("198.18.0.0/15")
VENV_PYFELIX = "/opt/pyfelix/.venv/bin/pyfelix"
UNIT_FILES = sorted(p for p in UNITS_DIR.iterdir() if p.suffix in {".service", ".path"})


vmlab = load_vmlab()


# --------------------------------------------------------------------------------------------
# Vagrantfile


def _vagrantfile() -> str:
    return (VAGRANT_DIR / "Vagrantfile").read_text()


def _ruby_string_constant(name: str) -> str:
    match = re.search(rf'^{name} = "([^"]*)"', _vagrantfile(), re.MULTILINE)
    assert match, f"Vagrantfile: no {name} constant"
    return match.group(1)


@pytest.mark.skipif(shutil.which("ruby") is None,
                    reason="ruby is not installed (Debian package `ruby`): syntax not checked")
def test_vagrantfile_is_valid_ruby() -> None:
    result = subprocess.run(["ruby", "-c", str(VAGRANT_DIR / "Vagrantfile")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def _load_with_stub(nodes: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ruby", str(Path(__file__).with_name("vagrant_stub.rb")),
                           str(VAGRANT_DIR / "Vagrantfile")],
                          env={"PATH": "/usr/bin:/bin", "PYFELIX_NODES": nodes, **env},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("ruby") is None,
                    reason="ruby is not installed (Debian package `ruby`): not evaluated")
@pytest.mark.parametrize("node_count", [2, 3])
def test_vagrantfile_evaluates_to_the_documented_lab(node_count: int) -> None:
    loaded = _load_with_stub(str(node_count))
    assert loaded.returncode == 0, loaded.stderr
    (config,) = json.loads(loaded.stdout)["configs"]
    assert config["box"] == "pyfelix/bookworm-local"  # built here by `make vm-box`
    folders = {f["destination"]: f for f in config["synced_folders"]}
    assert folders["/vagrant"]["disabled"] is True
    assert folders["/opt/pyfelix"]["source"] == ".." and folders["/opt/pyfelix"]["type"] == "rsync"
    # the box, its 6 GB image and the lab's state must never be copied into a VM
    excluded = folders["/opt/pyfelix"]["rsync__exclude"]
    # (".venv" without a slash: in a work tree it may be a link, and links are kept)
    assert {".venv", ".git/", "vagrant/.box/", "vagrant/.lab/"} <= set(excluded)
    # the package's links (pyfelix/agent -> ../agent, ...) must arrive as links: copied as
    # directories, the agent looked for /opt/pyfelix/pyfelix/bpf/tc.c in the first booted lab
    args = folders["/opt/pyfelix"]["rsync__args"]
    assert "--archive" in args and not {"--copy-links", "-L"} & set(args)
    machines = config["machines"]
    assert set(machines) == {"etcd", *(f"node{i}" for i in range(1, node_count + 1))}
    (etcd_network,) = machines["etcd"]["networks"]
    etcd_url = f"etcd3://{etcd_network['ip']}:2379"
    addresses = []
    for name, machine in machines.items():
        (network,) = machine["networks"]
        assert network["type"] == "private_network"
        interface = ipaddress.IPv4Interface(f"{network['ip']}/{network['netmask']}")
        assert interface.network == UNDERLAY
        addresses.append(interface.ip)
        (provisioner,) = machine["provisioners"]
        assert provisioner["type"] == "shell" and provisioner["path"] == "provision.sh"
        role = "etcd" if name == "etcd" else "node"
        assert provisioner["args"] == [role, name, network["ip"], etcd_url]
        assert machine["hostname"] == name
        # the underlay is an isolated libvirt network: no forwarding, no DHCP
        assert network["libvirt__forward_mode"] == "none"
        assert network["libvirt__dhcp_enabled"] is False
        (serial,) = machine["providers"]["libvirt"]["serials"]
        assert serial["type"] == "file" and serial["source"]["path"].endswith(f"console-{name}.log")
    assert len(set(addresses)) == len(addresses)


@pytest.mark.skipif(shutil.which("ruby") is None,
                    reason="ruby is not installed (Debian package `ruby`): not evaluated")
@pytest.mark.parametrize("driver", ["kvm", "qemu"])
def test_vagrantfile_boots_the_local_box_with_the_checked_driver(driver: str,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "accel").write_text(f"{driver}\n")  # what kvm-check.sh wrote at `make vm-box`
    loaded = _load_with_stub("2", PYFELIX_BOX_DIR=str(tmp_path))
    assert loaded.returncode == 0, loaded.stderr
    (config,) = json.loads(loaded.stdout)["configs"]
    libvirt = config["providers"]["libvirt"]
    assert libvirt["driver"] == driver
    assert libvirt["cpu_mode"] == ("host-passthrough" if driver == "kvm" else "custom")
    # no boot loader in the box: its own kernel, booted directly
    assert libvirt["kernel"] == str(tmp_path / "vmlinuz")
    assert libvirt["initrd"] == str(tmp_path / "initrd.img")
    assert "root=/dev/vda" in libvirt["cmd_line"]
    # the management network is isolated too, and not in a private range
    assert libvirt["management_network_mode"] == "none"
    management = ipaddress.IPv4Network(libvirt["management_network_address"])
    assert management.subnet_of(ipaddress.IPv4Network("198.51.100.0/24"))
    assert not management.overlaps(UNDERLAY)
    assert config["ssh"]["private_key_path"] == str(tmp_path / "id_ed25519")
    assert config["ssh"]["insert_key"] is False


@pytest.mark.skipif(shutil.which("ruby") is None,
                    reason="ruby is not installed (Debian package `ruby`): not evaluated")
def test_vagrantfile_uses_tcg_without_a_kvm_check_and_refuses_an_unknown_driver(
        tmp_path: Path) -> None:
    loaded = _load_with_stub("2", PYFELIX_BOX_DIR=str(tmp_path))  # no accel file
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["configs"][0]["providers"]["libvirt"]["driver"] == "qemu"
    refused = _load_with_stub("2", PYFELIX_BOX_DIR=str(tmp_path), PYFELIX_VM_DRIVER="xen")
    assert refused.returncode != 0
    assert "PYFELIX_VM_DRIVER must be kvm or qemu, got xen" in refused.stderr


@pytest.mark.skipif(shutil.which("ruby") is None,
                    reason="ruby is not installed (Debian package `ruby`): not evaluated")
def test_vagrantfile_refuses_an_unsupported_node_count() -> None:
    loaded = _load_with_stub("4")
    assert loaded.returncode != 0
    assert "PYFELIX_NODES must be 2 or 3, got 4" in loaded.stderr


def _node_ips(count: int) -> list[ipaddress.IPv4Address]:
    match = re.search(r'def node_ip\(index\)\s+"([\d.]+)\.#\{(\d+) \+ index\}"', _vagrantfile())
    assert match, "Vagrantfile: node_ip(index) is not '\"A.B.C.#{N + index}\"'"
    prefix, offset = match.group(1), int(match.group(2))
    return [ipaddress.IPv4Address(f"{prefix}.{offset + i}") for i in range(1, count + 1)]


def test_vagrantfile_lays_out_etcd_and_nodes_on_the_underlay() -> None:
    text = _vagrantfile()
    assert re.search(r'^BOX = ENV\.fetch\("PYFELIX_BOX", "pyfelix/bookworm-local"\)', text, re.M)
    netmask = _ruby_string_constant("UNDERLAY_NETMASK")
    assert ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen == UNDERLAY.prefixlen
    etcd_ip = ipaddress.IPv4Address(_ruby_string_constant("ETCD_IP"))
    node_ips = _node_ips(3)
    assert all(ip in UNDERLAY for ip in [etcd_ip, *node_ips])
    assert len({etcd_ip, *node_ips}) == 4
    assert re.search(r"\(2\.\.3\)\.cover\?\(NODE_COUNT\)", text)  # 2 or 3 nodes
    assert re.search(r'synced_folder "\.\.", "/opt/pyfelix", type: "rsync"', text)
    assert re.search(r'synced_folder "\.", "/vagrant", disabled: true', text)
    assert text.count('provision "shell", path: "provision.sh"') == 2
    provision = VAGRANT_DIR / "provision.sh"
    assert provision.stat().st_mode & 0o111, "provision.sh is not executable"
    assert 'bash "$project/scripts/setup.sh"' in provision.read_text()
    assert (REPO / "scripts" / "setup.sh").exists()


def test_datastore_url_is_the_same_everywhere() -> None:
    etcd_url = f"etcd3://{_ruby_string_constant('ETCD_IP')}:2379"
    assert 'ETCD_URL = "etcd3://#{ETCD_IP}:2379"' in _vagrantfile()
    assert f"PYFELIX_DATASTORE:-{etcd_url}" in (DEMO_DIR / "run-demo.sh").read_text()
    assert etcd_url in (DEMO_DIR / "cluster.yaml").read_text()


# --------------------------------------------------------------------------------------------
# Shell scripts


@pytest.mark.parametrize("script", [VAGRANT_DIR / "provision.sh", DEMO_DIR / "run-demo.sh"],
                         ids=lambda p: p.name)
def test_shell_script_parses(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def _substitute(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace(f"${name}", value).replace(f"${{{name}}}", value)
    return text.replace('"', "")


def test_run_demo_runs_real_pyfelix_and_vmlab_commands() -> None:
    script = (DEMO_DIR / "run-demo.sh").read_text()
    values = {"DATASTORE": "etcd3://198.18.0.10:2379", "DEMO": str(DEMO_DIR),
              "node": "node1", "NODES[0]": "node1"}
    pyfelix_calls = re.findall(r"\$PYFELIX ([^\"]+)\"", script)
    vmlab_calls = re.findall(r"\$PY \$DEMO/vmlab\.py ([^\"]+)\"", script)
    assert len(pyfelix_calls) >= 4 and len(vmlab_calls) >= 4
    for call in pyfelix_calls:
        argv = ["pyfelix", *shlex.split(_substitute(call, values))]
        assert command_problems(argv) == [], call
        for option in ("-f",):
            if option in argv:
                assert Path(argv[argv.index(option) + 1]).exists(), call
    for call in vmlab_calls:
        vmlab._parser().parse_args(shlex.split(_substitute(call, values)))


def test_provision_runs_real_commands() -> None:
    script = (VAGRANT_DIR / "provision.sh").read_text()
    joined = script.replace("\\\n", " ")
    node_resource = re.search(r'vmlab\.py" (node-resource[^|]+)\|', joined)
    assert node_resource
    vmlab._parser().parse_args(shlex.split(_substitute(node_resource.group(1), {
        "name": "node1", "ip": "198.18.0.11", "underlay_prefix_len": "15"})))
    apply = re.search(r'/bin/pyfelix" (apply [^\n]+)', joined)
    assert apply
    argv = ["pyfelix", *shlex.split(_substitute(apply.group(1), {"datastore": "etcd3://x:1"}))]
    assert command_problems(argv) == []
    installed = set(re.findall(r"pyfelix-[a-z]+\.(?:service|path)", joined))
    assert installed == {p.name for p in UNIT_FILES}


# --------------------------------------------------------------------------------------------
# systemd units


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (systemd keys may repeat); comments and blanks dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}:{number}: not `Key=value`: {raw}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_unit_parser_rejects_a_line_outside_sections(tmp_path: Path) -> None:
    broken = tmp_path / "broken.service"
    broken.write_text("ExecStart=/bin/true\n[Unit]\nDescription=x\n")
    with pytest.raises(AssertionError):
        parse_unit(broken)


@pytest.mark.parametrize("unit", UNIT_FILES, ids=lambda p: p.name)
def test_unit_has_required_sections(unit: Path) -> None:
    sections = parse_unit(unit)
    assert sections.get("Unit", {}).get("Description"), "[Unit] Description="
    assert sections.get("Install", {}).get("WantedBy") == ["multi-user.target"]
    if unit.suffix == ".service":
        assert len(sections.get("Service", {}).get("ExecStart", [])) == 1
    else:
        path_section = sections.get("Path", {})
        assert path_section.get("PathExists")
        assert (UNITS_DIR / path_section["Unit"][0]).exists()


def _environment_names(environment_file: str) -> set[str]:
    if environment_file == "/etc/pyfelix/pyfelix.env":
        text = (VAGRANT_DIR / "pyfelix.env.in").read_text()
        return set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", text, re.MULTILINE))
    if environment_file == "/etc/pyfelix/etcd.env":
        provision = (VAGRANT_DIR / "provision.sh").read_text()
        return set(re.findall(r"printf '([A-Z_]+)=%s\\n' \"\$ip\" >/etc/pyfelix/etcd\.env",
                              provision))
    raise AssertionError(f"unknown EnvironmentFile {environment_file}")


@pytest.mark.parametrize("unit", [u for u in UNIT_FILES if u.suffix == ".service"],
                         ids=lambda p: p.name)
def test_service_runs_a_real_command_with_defined_variables(unit: Path) -> None:
    service = parse_unit(unit)["Service"]
    argv = shlex.split(service["ExecStart"][0])
    if argv[0] == VENV_PYFELIX:
        assert command_problems(argv) == []
    else:
        assert Path(argv[0]).is_absolute() and Path(argv[0]).exists(), argv[0]
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)\}", service["ExecStart"][0]))
    defined = set().union(*(_environment_names(f) for f in service.get("EnvironmentFile", [])))
    assert used <= defined, f"undefined: {used - defined}"


def test_confd_bird_and_path_unit_agree_on_files() -> None:
    confd = shlex.split(parse_unit(UNITS_DIR / "pyfelix-confd.service")["Service"]["ExecStart"][0])
    bird_service = parse_unit(UNITS_DIR / "pyfelix-bird.service")
    bird = shlex.split(bird_service["Service"]["ExecStart"][0])
    birdc = shlex.split(bird_service["Service"]["ExecReload"][0])
    config_file = confd[confd.index("--config-file") + 1]
    socket = confd[confd.index("--bird-socket") + 1]
    assert bird[bird.index("-c") + 1] == config_file
    assert bird[bird.index("-s") + 1] == socket == birdc[birdc.index("-s") + 1]
    assert f"/run/{bird_service['Service']['RuntimeDirectory'][0]}/" in socket
    assert bird_service["Unit"]["ConditionPathExists"] == [config_file]
    assert parse_unit(UNITS_DIR / "pyfelix-bird.path")["Path"]["PathExists"] == [config_file]
    config_dir = str(Path(config_file).parent)
    assert f"install -d -m 0700 {config_dir}" in (VAGRANT_DIR / "provision.sh").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    for unit in UNIT_FILES:
        shutil.copy(unit, tmp_path / unit.name)
    result = subprocess.run(["systemd-analyze", "verify",
                             *(str(tmp_path / u.name) for u in UNIT_FILES)],
                            capture_output=True, text=True, timeout=60, check=False,
                            cwd=tmp_path)
    venv_missing = f"Command {VENV_PYFELIX} is not executable"
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and venv_missing not in line]
    assert problems == []


# --------------------------------------------------------------------------------------------
# Settings and demo resources


def test_node_settings_equal_the_kubernetes_config_map() -> None:
    text = (VAGRANT_DIR / "pyfelix.env.in").read_text()
    settings = dict(re.findall(r"^(FELIX_[A-Z0-9]+)=(.*)$", text, re.MULTILINE))
    config_map = find(load_documents(DEPLOY_DIR / "base" / "configmap.yaml"), "ConfigMap",
                      "pyfelix-config")
    assert settings == config_map["data"]
    load_config(environ=settings)  # the agent accepts them (raises ConfigError otherwise)


@pytest.mark.parametrize("name", ["cluster.yaml", "policy.yaml"])
def test_demo_resources_are_valid(name: str) -> None:
    documents = load_documents(DEMO_DIR / name)
    assert documents
    for doc in documents:
        parse_resource(doc)
    updates, errors = load_path(str(DEMO_DIR / name))
    assert errors == [] and len(updates) == len(documents)


def _demo_pods() -> list[Any]:
    return vmlab.load_cluster(DEMO_DIR / "cluster.yaml")


def test_demo_pods_are_planned_on_the_vagrant_nodes() -> None:
    pods = _demo_pods()
    cluster = load_documents(DEMO_DIR / "cluster.yaml")
    pool = ipaddress.IPv4Network(find(cluster, "IPPool", "demo-pool")["spec"]["cidr"])
    assert {p.node for p in pods} == {"node1", "node2"}  # the demo needs two nodes
    for pod in pods:
        node_number = int(pod.node.removeprefix("node"))
        assert pod.ip in pool
        assert pod.ip in ipaddress.IPv4Network(f"10.65.{node_number}.0/24")
        assert pod.netns.startswith(vmlab.NETNS_PREFIX)
        assert len(pod.host_ifname) <= 15 and pod.host_ifname.startswith("cali")
        assert pod.ports
    for attribute in ("ip", "netns", "host_ifname"):
        assert len({getattr(p, attribute) for p in pods}) == len(pods), attribute


def test_pod_plumbing_connects_the_pod_as_calico_cni_does() -> None:
    pod = _demo_pods()[0]
    commands = vmlab.plumbing_commands(pod)
    assert commands[0] == ["ip", "netns", "add", pod.netns]
    joined = [" ".join(c) for c in commands]
    assert f"ip -n {pod.netns} addr add {pod.ip}/32 dev eth0" in joined
    assert (f"ip -n {pod.netns} route add default via {vmlab.POD_GATEWAY} dev eth0"
            in joined)
    host_route = [c for c in commands if c[:3] == ["ip", "route", "replace"]]
    assert host_route and host_route[0][3:6] == [f"{pod.ip}/32", "dev", pod.host_ifname]
    assert f"net.ipv4.conf.{pod.host_ifname}.proxy_arp=1" in joined[3]
    assert all(pod.netns in c or pod.host_ifname in c for c in joined)  # nothing else touched
    assert vmlab.teardown_commands(pod) == [["ip", "netns", "delete", pod.netns]]


def test_cluster_pods_rejects_a_pod_without_address() -> None:
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"},
           "spec": {"nodeName": "node1", "containers": []}, "status": {}}
    with pytest.raises(vmlab.DemoError, match="Pod x/p"):
        vmlab.cluster_pods([doc])


def test_node_resource_is_a_valid_calico_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert vmlab.main(["node-resource", "--name", "node1", "--ipv4-address",
                       "198.18.0.11/15"]) == 0
    node = yaml.safe_load(capsys.readouterr().out)
    parsed = parse_resource(node)
    assert parsed.bgp.ipv4_address == "198.18.0.11/15"
    assert vmlab.main(["node-resource", "--name", "node1", "--ipv4-address", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("bird") is None, reason="bird (Debian bird2) not installed")
@pytest.mark.parametrize("node", ["node1", "node2"])
def test_demo_bgp_config_for_each_node_is_accepted_by_bird(node: str, tmp_path: Path) -> None:
    node_ips = {f"node{i}": ip for i, ip in enumerate(_node_ips(2), start=1)}
    nodes = [vmlab.node_resource(name, f"{ip}/15") for name, ip in node_ips.items()]
    text = (DEMO_DIR / "cluster.yaml").read_text() + "\n---\n" + yaml.safe_dump_all(nodes)
    updates, errors = load_text("demo", text)
    assert errors == []
    bird_conf, config = render_from_updates(updates, node)
    assert not config.notes, config.notes
    staged = tmp_path / "bird.conf"
    staged.write_text(bird_conf)
    result = BirdTools().check(str(staged))
    assert result.ok, result.message
    (other,) = set(node_ips) - {node}
    assert f"neighbor {node_ips[other]}" in bird_conf

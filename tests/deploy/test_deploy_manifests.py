"""deploy/: the Kubernetes manifests and the Dockerfile, checked offline.

What is measured:
- every manifest, and what each kustomization renders (base, and the Typha overlay), passes
  the Kubernetes OpenAPI schemas of the oldest and newest supported Kubernetes versions in
  STRICT mode (unknown fields fail), using the schemas shipped inside the
  `kubernetes-validate` package (no cluster, no network);
- deliberately broken copies of the real DaemonSet fail that same validation (so the
  validation can fail at all), each at the field that was broken;
- what the schemas cannot see: commands name real pyfelix subcommands and options (parsed by
  the real click CLI), the health probes hit the port/host the ConfigMap configures, the
  node agent's shape (privileged, hostNetwork, bpffs Bidirectional, read-only kernel headers,
  tolerations that tolerate any taint), volumes and mounts agree, confd and BIRD share the
  config file and control socket, the ClusterRole grants exactly the rules derived from the
  Kubernetes backend's kind tables (`node_rbac_rules()`: no rule missing, none extra; no
  wildcard, no write verb without a listed reason), and the Typha Service/Deployment/PDB/
  agent URL agree;
- the kustomize-free renderer used here agrees with `kubectl kustomize` when kubectl exists.

No image is built and nothing is applied: there is no Docker engine or kube-apiserver here.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_checks import (
    DEPLOY_DIR,
    KUSTOMIZATION_FILE,
    REPO,
    Document,
    command_problems,
    find,
    kustomization_files,
    load_documents,
    pod_templates,
    render_kustomization,
)
from kubernetes_validate.utils import all_versions

from pyfelix.agent.config import ConfigError, load_config
from pyfelix.agent.model import KNOWN_KINDS
from pyfelix.agent.syncer.kube_resources import (
    DERIVED_KINDS,
    NAMESPACE_READ_TYPES,
    NODE_READ_TYPES,
    RESOURCE_TYPES,
    namespace_rbac_rules,
    node_rbac_rules,
)

# The oldest Kubernetes minor version the manifests promise to work with (deploy/README.md).
OLDEST_SUPPORTED = "1.28"
VERSIONS = (OLDEST_SUPPORTED, all_versions()[-1])
OVERLAYS = (DEPLOY_DIR, DEPLOY_DIR / "typha")

READ_VERBS = frozenset({"get", "list", "watch"})
# Write rights the node's ClusterRole may hold, each with the reason (mirrored as a comment in
# deploy/base/clusterrole.yaml). pyfelix writes nothing into the datastore, so: none.
WRITE_RULES: dict[tuple[str, str, str], str] = {}
def _strategic_patches() -> set[Path]:
    patches: set[Path] = set()
    for directory in OVERLAYS:
        kustomization = load_documents(directory / KUSTOMIZATION_FILE)[0]
        patches |= {(directory / p["path"]).resolve() for p in kustomization.get("patches", [])}
    return patches


def _manifest_files(*, with_patches: bool = False) -> list[Path]:
    """deploy/**/*.yaml but kustomizations (and, unless asked, the partial patch objects)."""
    return sorted(p for p in DEPLOY_DIR.rglob("*.yaml") if p.name != KUSTOMIZATION_FILE
                  and (with_patches or p.resolve() not in _strategic_patches()))


def _validate(doc: Document, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(scope="module")
def base() -> list[Document]:
    return render_kustomization(DEPLOY_DIR)


@pytest.fixture(scope="module")
def with_typha() -> list[Document]:
    return render_kustomization(DEPLOY_DIR / "typha")


@pytest.fixture(scope="module")
def config(base: list[Document]) -> dict[str, str]:
    return find(base, "ConfigMap", "pyfelix-config")["data"]


def _containers(documents: list[Document]) -> list[tuple[str, Document]]:
    return [(f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}", c)
            for doc, spec in pod_templates(documents) for c in spec["containers"]]


def _container(documents: list[Document], workload: str, name: str) -> Document:
    for where, container in _containers(documents):
        if where.split("/")[1:] == [workload, name]:
            return container
    raise AssertionError(f"no container {name} in {workload}")


# --------------------------------------------------------------------------------------------
# Schema validation


def test_every_manifest_is_applied_by_a_kustomization() -> None:
    used = set().union(*(kustomization_files(d) for d in OVERLAYS))
    orphans = [p for p in _manifest_files(with_patches=True) if p.resolve() not in used]
    assert orphans == [], f"manifests no kustomization applies (and so never checked): {orphans}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(DEPLOY_DIR)))
def test_manifest_passes_strict_schema(path: Path, version: str) -> None:
    documents = load_documents(path)
    assert documents, f"{path} holds no document"
    for doc in documents:
        _validate(doc, version)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_rendered_kustomization_passes_strict_schema(overlay: Path, version: str) -> None:
    documents = render_kustomization(overlay)
    assert {d["kind"] for d in documents} >= {"DaemonSet", "ClusterRole", "ConfigMap"}
    for doc in documents:
        _validate(doc, version)


def _first_container(doc: Document) -> Document:
    return doc["spec"]["template"]["spec"]["containers"][0]


BREAKAGES: dict[str, tuple[Callable[[Document], None], list[Any]]] = {
    "typo in a pod field": (
        lambda d: d["spec"]["template"]["spec"].update(hostNetwrok=True),
        ["spec", "template", "spec"]),
    "string where an integer belongs": (
        lambda d: _first_container(d)["ports"][0].update(containerPort="9099"),
        ["spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"]),
    "unknown probe field": (
        lambda d: _first_container(d)["livenessProbe"]["httpGet"].update(pth="/liveness"),
        ["spec", "template", "spec", "containers", 0, "livenessProbe", "httpGet"]),
    "missing required container name": (
        lambda d: _first_container(d).pop("name"),
        ["spec", "template", "spec", "containers", 0]),
    "list where a map belongs": (
        lambda d: d["spec"]["template"]["metadata"].update(labels=["app=pyfelix"]),
        ["spec", "template", "metadata", "labels"]),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_broken_daemonset_fails_validation(base: list[Document], breakage: str) -> None:
    daemonset = copy.deepcopy(find(base, "DaemonSet", "pyfelix-node"))
    _validate(daemonset, VERSIONS[-1])  # the unbroken copy passes
    breaker, path = BREAKAGES[breakage]
    breaker(daemonset)
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        _validate(daemonset, VERSIONS[-1])
    assert list(caught.value.absolute_path) == path


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl is not installed: the renderer cannot be compared with it")
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_renderer_agrees_with_kubectl_kustomize(overlay: Path) -> None:
    printed = subprocess.run(["kubectl", "kustomize", str(overlay)], check=True,
                             capture_output=True, text=True, timeout=60).stdout
    expected = [d for d in yaml.safe_load_all(printed) if d]

    def normalised(docs: list[Document]) -> list[str]:
        def canonical(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: canonical(value[k]) for k in sorted(value)}
            if isinstance(value, list):
                items = [canonical(v) for v in value]
                return sorted(items, key=repr) if all(isinstance(i, dict) for i in items) \
                    else items
            return value
        return sorted(yaml.safe_dump(canonical(d), sort_keys=True) for d in docs)

    assert normalised(render_kustomization(overlay)) == normalised(expected)


# --------------------------------------------------------------------------------------------
# Command lines


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_commands_are_real_pyfelix_commands(overlay: Path) -> None:
    documents = render_kustomization(overlay)
    checked = 0
    for where, container in _containers(documents):
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv and Path(argv[0]).name == "pyfelix":
            checked += 1
            assert command_problems(argv) == [], where
    assert checked >= 2  # at least the agent and confd


@pytest.mark.parametrize("argv", [
    ["pyfelix", "agnet", "--datastore", "kubernetes"],
    ["pyfelix", "confd", "--datastore", "kubernetes", "--bird-sock", "/run/bird/bird.ctl"],
    ["pyfelix", "confd", "rendr"],
    ["pyfelix", "apply", "--datastore", "kubernetes"],
    ["felix", "agent"],
])
def test_command_check_rejects_bad_command_lines(argv: list[str]) -> None:
    assert command_problems(argv) != []


def test_daemonset_runs_agent_and_confd_against_kubernetes(base: list[Document]) -> None:
    for name in ("agent", "confd"):
        command = _container(base, "pyfelix-node", name)["command"]
        assert command[:2] == ["pyfelix", name]
        assert command[command.index("--datastore") + 1] == "kubernetes"
        assert command[command.index("--hostname") + 1] == "$(NODENAME)"


def test_typha_overlay_switches_agent_and_confd_to_the_typha_service(
        with_typha: list[Document]) -> None:
    service = find(with_typha, "Service", "pyfelix-typha")
    port = service["spec"]["ports"][0]["port"]
    address = f"typha://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}"
    for name in ("agent", "confd"):
        command = _container(with_typha, "pyfelix-node", name)["command"]
        assert command[command.index("--datastore") + 1] == address


# --------------------------------------------------------------------------------------------
# The node DaemonSet


def _tolerates(tolerations: list[Document], taint: Document) -> bool:
    def matches(tol: Document) -> bool:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            return False
        if tol.get("operator", "Equal") == "Exists":
            return not tol.get("key") or tol["key"] == taint["key"]
        return tol.get("key") == taint["key"] and tol.get("value") == taint.get("value")
    return any(matches(t) for t in tolerations)


def test_toleration_matcher_is_not_vacuous() -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    assert not _tolerates([{"key": "other", "operator": "Exists"}], taint)
    assert not _tolerates([{"operator": "Exists", "effect": "NoExecute"}], taint)
    assert _tolerates([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}], taint)


def test_node_pod_runs_on_every_node_with_host_network(base: list[Document]) -> None:
    spec = find(base, "DaemonSet", "pyfelix-node")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec.get("hostPID", False) is False
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["priorityClassName"] == "system-node-critical"
    for effect in ("NoSchedule", "NoExecute"):
        for key in ("node.kubernetes.io/not-ready", "node-role.kubernetes.io/control-plane",
                    "example.com/anything"):
            assert _tolerates(spec["tolerations"], {"key": key, "value": "x", "effect": effect})
    assert _tolerates(spec["tolerations"],
                      {"key": "CriticalAddonsOnly", "value": "true", "effect": "PreferNoSchedule"})


def test_agent_container_has_the_node_access_it_needs(base: list[Document]) -> None:
    spec = find(base, "DaemonSet", "pyfelix-node")["spec"]["template"]["spec"]
    agent = _container(base, "pyfelix-node", "agent")
    assert agent["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}

    def host_path(mount_path: str) -> Document:
        return volumes[mounts[mount_path]["name"]]["hostPath"]

    assert host_path("/sys/fs/bpf")["path"] == "/sys/fs/bpf"
    assert mounts["/sys/fs/bpf"]["mountPropagation"] == "Bidirectional"
    for headers in ("/lib/modules", "/usr/src"):
        assert host_path(headers)["path"] == headers
        assert mounts[headers]["readOnly"] is True
    assert host_path("/run/xtables.lock") == {"path": "/run/xtables.lock", "type": "FileOrCreate"}
    for calico_dir in ("/var/run/calico", "/var/lib/calico"):
        assert host_path(calico_dir)["path"] == calico_dir
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODENAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_volumes_mounts_and_propagation_agree(overlay: Path) -> None:
    for doc, spec in pod_templates(render_kustomization(overlay)):
        declared = {v["name"] for v in spec.get("volumes", [])}
        used: set[str] = set()
        for container in spec["containers"]:
            where = f"{doc['metadata']['name']}/{container['name']}"
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in declared, f"{where}: undeclared volume {mount['name']}"
                used.add(mount["name"])
                propagation = mount.get("mountPropagation", "None")
                # The apiserver (not the schema) enforces these two rules.
                assert propagation in {"None", "HostToContainer", "Bidirectional"}, where
                if propagation == "Bidirectional":
                    assert container["securityContext"]["privileged"] is True, where
        assert used == declared, f"{doc['metadata']['name']}: unused volumes {declared - used}"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_non_root_containers_can_read_their_secrets(overlay: Path) -> None:
    for doc, spec in pod_templates(render_kustomization(overlay)):
        secrets = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
        for container in spec["containers"]:
            uid = container.get("securityContext", {}).get("runAsUser", 0)
            for mount in container.get("volumeMounts", []):
                if uid == 0 or mount["name"] not in secrets:
                    continue
                mode = secrets[mount["name"]].get("defaultMode", 0o644)
                group = spec.get("securityContext", {}).get("fsGroup")
                readable = mode & 0o004 or (group is not None and mode & 0o040)
                assert readable, f"{doc['metadata']['name']}/{container['name']}: uid {uid} " \
                                 f"cannot read secret volume {mount['name']} (mode {mode:o})"


def test_every_container_requests_resources(base: list[Document],
                                            with_typha: list[Document]) -> None:
    for where, container in _containers(base) + _containers(with_typha):
        requests = container.get("resources", {}).get("requests", {})
        assert {"cpu", "memory"} <= set(requests), where


def test_probes_hit_the_health_endpoint_the_config_enables(
        base: list[Document], config: dict[str, str]) -> None:
    assert config["FELIX_HEALTHENABLED"] == "true"
    agent = _container(base, "pyfelix-node", "agent")
    assert {"configMapRef": {"name": "pyfelix-config"}} in agent["envFrom"]
    declared_ports = {p["containerPort"] for p in agent["ports"]}
    for probe_name, path in (("livenessProbe", "/liveness"), ("readinessProbe", "/readiness")):
        http = agent[probe_name]["httpGet"]
        assert http["path"] == path
        assert str(http["port"]) == config["FELIX_HEALTHPORT"]
        assert http["host"] == config["FELIX_HEALTHHOST"]
        assert http["port"] in declared_ports
    if config.get("FELIX_PROMETHEUSMETRICSENABLED") == "true":
        assert int(config["FELIX_PROMETHEUSMETRICSPORT"]) in declared_ports


def test_config_map_holds_only_felix_settings_as_strings(config: dict[str, str]) -> None:
    for name, value in config.items():
        assert re.fullmatch(r"FELIX_[A-Z0-9]+", name), name
        assert isinstance(value, str), name


def test_agent_environment_is_accepted_by_the_agent_config(
        base: list[Document], config: dict[str, str]) -> None:
    agent = _container(base, "pyfelix-node", "agent")
    environ = {**config, **{e["name"]: e["value"] for e in agent["env"] if "value" in e}}
    settings = load_config(environ=environ)  # raises ConfigError naming a bad setting
    http = agent["readinessProbe"]["httpGet"]
    assert settings.health_enabled is True
    assert (settings.health_host, settings.health_port) == (http["host"], http["port"])
    if settings.prometheus_metrics_enabled:
        assert settings.prometheus_metrics_port in {p["containerPort"] for p in agent["ports"]}


def test_agent_config_check_rejects_a_misspelt_setting(config: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="HEALTHPROT"):
        load_config(environ={**config, "FELIX_HEALTHPROT": "9099"})


def _option(command: list[str], option: str) -> str:
    return command[command.index(option) + 1]


def test_confd_and_bird_share_config_file_and_socket(base: list[Document]) -> None:
    confd = _container(base, "pyfelix-node", "confd")
    bird = _container(base, "pyfelix-node", "bird")
    config_file = _option(confd["command"], "--config-file")
    socket = _option(confd["command"], "--bird-socket")
    bird_script = bird["command"][-1]
    assert f"-c {config_file}" in bird_script and f"-s {socket}" in bird_script
    assert f"[ -s {config_file} ]" in bird_script  # waits for confd's first render

    def volume_holding(container: Document, path: str) -> str:
        mounts = [m for m in container["volumeMounts"]
                  if path.startswith(m["mountPath"].rstrip("/") + "/")]
        assert len(mounts) == 1, f"{container['name']}: {path} is not under one mount"
        return str(mounts[0]["name"])

    for path in (config_file, socket):
        assert volume_holding(confd, path) == volume_holding(bird, path)
    assert confd["securityContext"]["privileged"] is False
    assert bird["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_BIND_SERVICE"]


# --------------------------------------------------------------------------------------------
# RBAC


def _grants(role: Document) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_cluster_role_is_read_only_and_has_no_wildcards(base: list[Document]) -> None:
    grants = _grants(find(base, "ClusterRole", "pyfelix-node"))
    assert all("*" not in part for grant in grants for part in grant), "wildcard in the role"
    writes = {g for g in grants if g[2] not in READ_VERBS}
    unexplained = writes - set(WRITE_RULES)
    assert unexplained == set(), f"write rights without a listed reason: {sorted(unexplained)}"


def _rules_text(grants: set[tuple[str, str, str]]) -> list[str]:
    return [f"{verb} {group or 'core'}/{resource}" for group, resource, verb in sorted(grants)]


def test_cluster_role_grants_exactly_what_the_kind_tables_need(base: list[Document]) -> None:
    """The rules are derived from the Kubernetes backend's own tables (the types its syncer
    lists and watches, plus Services and EndpointSlices) and must match the role exactly:
    nothing missing, nothing the code does not read."""
    needed = node_rbac_rules()
    grants = _grants(find(base, "ClusterRole", "pyfelix-node"))
    assert _rules_text(needed - grants) == [], "rights the node needs but is not granted"
    assert _rules_text(grants - needed) == [], "rights granted that no table of the code needs"


def test_secret_role_grants_exactly_the_namespaced_reads(base: list[Document]) -> None:
    """BGP password Secrets are read in the DaemonSet's own namespace only: a Role there
    (bound to the node's service account) grants exactly `namespace_rbac_rules()`, the
    ClusterRole nothing on secrets, and confd is told its namespace (NAMESPACE)."""
    role = find(base, "Role", "pyfelix-bgp-secrets")
    assert _grants(role) == namespace_rbac_rules() == {
        ("", "secrets", verb) for verb in READ_VERBS}
    cluster = _grants(find(base, "ClusterRole", "pyfelix-node"))
    assert not {g for g in cluster if g[1] == "secrets"}
    daemonset = next(d for d in base if d["kind"] == "DaemonSet")
    assert role["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    binding = find(base, "RoleBinding", "pyfelix-bgp-secrets")
    assert binding["roleRef"]["name"] == "pyfelix-bgp-secrets"
    assert binding["subjects"][0]["namespace"] == daemonset["metadata"]["namespace"]
    confd = next(c for c in daemonset["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "confd")
    env = {e["name"]: e for e in confd["env"]}
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_kind_tables_cover_every_kind_pyfelix_parses() -> None:
    """Every kind the model parses comes from a watched type or is derived from one, so the
    role derived from the tables lets the agent see all of its input."""
    watched = {rtype.kind for rtype in RESOURCE_TYPES}
    derived = {kind for kind, sources in DERIVED_KINDS.items() if set(sources) <= watched}
    assert KNOWN_KINDS - watched - derived == set()
    assert {rtype.kind for rtype in NODE_READ_TYPES + NAMESPACE_READ_TYPES} >= watched
    granted_types = {(t.api_group, t.plural) for t in NODE_READ_TYPES}
    assert {("", "services"), ("discovery.k8s.io", "endpointslices")} <= granted_types


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_bindings_and_service_accounts_exist(overlay: Path) -> None:
    documents = render_kustomization(overlay)
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in documents
                if d["kind"] == "ServiceAccount"}
    roles = {d["metadata"]["name"] for d in documents if d["kind"] == "ClusterRole"}
    for binding in (d for d in documents if d["kind"] == "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts
    for doc, spec in pod_templates(documents):
        assert (doc["metadata"]["namespace"], spec["serviceAccountName"]) in accounts


# --------------------------------------------------------------------------------------------
# Typha


def test_typha_service_deployment_and_budget_agree(with_typha: list[Document]) -> None:
    deployment = find(with_typha, "Deployment", "pyfelix-typha")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = find(with_typha, "Service", "pyfelix-typha")
    budget = find(with_typha, "PodDisruptionBudget", "pyfelix-typha")
    node_labels = find(with_typha, "DaemonSet", "pyfelix-node")["spec"]["template"]["metadata"][
        "labels"]
    for selector in (service["spec"]["selector"], budget["spec"]["selector"]["matchLabels"],
                     deployment["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= pod_labels.items()
        assert not selector.items() <= node_labels.items()  # never selects the node pods
    typha = _container(with_typha, "pyfelix-typha", "typha")
    ports = {p["name"]: p["containerPort"] for p in typha["ports"]}
    service_port = service["spec"]["ports"][0]
    listen_port = int(_option(typha["command"], "--listen").rsplit(":", 1)[1])
    assert ports[service_port["targetPort"]] == listen_port == service_port["port"]
    assert deployment["spec"]["template"]["spec"]["hostNetwork"] is True


def test_typha_probes_hit_the_health_endpoint_its_environment_enables(
        with_typha: list[Document]) -> None:
    typha = _container(with_typha, "pyfelix-typha", "typha")
    env = {e["name"]: e["value"] for e in typha["env"] if "value" in e}
    assert env["TYPHA_HEALTHENABLED"] == "true"
    for probe_name, path in (("readinessProbe", "/readiness"), ("livenessProbe", "/liveness")):
        http = typha[probe_name]["httpGet"]  # readiness = in sync, not "the port is open"
        assert http["path"] == path
        assert str(http["port"]) == env["TYPHA_HEALTHPORT"]
        assert http["host"] == env["TYPHA_HEALTHHOST"]
    # every TYPHA_* setting in the manifest is one `pyfelix typha` reads
    from pyfelix.cli.main import cli

    command = cli.get_command(cli.make_context("pyfelix", [], resilient_parsing=True), "typha")
    assert command is not None
    read = {param.envvar for param in command.params if isinstance(param.envvar, str)}
    assert {name for name in env if name.startswith("TYPHA_")} <= read


# --------------------------------------------------------------------------------------------
# Dockerfile


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY_DIR / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    instructions = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_builds_the_project_on_bookworm_with_bcc() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0][0] == "FROM" and "bookworm" in instructions[0][1]
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    for package in ("python3-bpfcc", "python3-venv", "iproute2", "iptables", "ipset", "nftables",
                    "bird2"):
        assert re.search(rf"\b{re.escape(package)}\b", runs), package
    assert re.search(r"venv --system-site-packages", runs)
    assert ("COPY", ". /src") in instructions
    assert re.search(r"pip install [^&]*/src", runs)
    assert ("ENTRYPOINT", '["pyfelix"]') in instructions
    # The agent must find bpf/*.c outside the Python packages through this variable.
    env = " ".join(rest for keyword, rest in instructions if keyword == "ENV")
    variable = re.search(r"(PYFELIX_BPF_DIR)=/src/bpf", env)
    assert variable and (REPO / "bpf" / "tc.c").exists()
    assert variable.group(1) in (REPO / "agent" / "bpf" / "loader.py").read_text()

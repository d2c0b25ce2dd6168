"""Kubernetes Services in the lab: the EndpointSlice controller, and kube-proxy's iptables
rules for the iptables dataplane.

Role: what a cluster's control plane and kube-proxy do for Services, so one scenario runs
the same on both dataplanes (in BPF mode the agent's own NAT serves Services; in iptables
mode Services are kube-proxy's job, as in Felix).

- `generated_slices(documents)`: for every Service with a selector and no EndpointSlice
  labelled with its name (other than ours), one slice `<service>-pyfelix-lab` as the
  endpoint slice controller makes it: the Running pods of the Service's namespace whose
  labels match the selector, ready, with their node; per Service port, the slice port of
  the same name and protocol, its number the port's numeric targetPort or the pod's
  container port of that name (pods resolving a named port differently get one slice per
  port number, as Kubernetes does). A Service without matching pods gets a slice with no
  endpoints. Generated slices carry the label `endpointslice.kubernetes.io/managed-by:
  pyfelix-lab`, so they are replaced, never mistaken for given ones.
- `frontends_for(documents, node)`: the node's service frontends, computed by the agent's
  own `ServiceIndex` from the same documents (invalid ones skipped), so both dataplanes
  serve exactly the same backends.
- `kube_proxy_restore(frontends)`: kube-proxy's iptables layout for those frontends, as
  `iptables-restore --noflush` input: nat `KUBE-SERVICES` (`-d VIP -p P --dport N -j
  KUBE-SVC-<hash>`), `KUBE-SVC-<hash>` choosing among its endpoints with `statistic
  --mode random --probability 1/(n-i)`, `KUBE-SEP-<hash>` DNATing to one endpoint;
  ClientIP affinity with `recent` (`--rcheck --seconds T --reap` then `--set`), as
  kube-proxy renders it; hairpin (an endpoint reaching itself) marked in its KUBE-SEP
  chain and masqueraded in KUBE-POSTROUTING; a frontend without endpoints becomes the
  filter `KUBE-SERVICES` REJECT (icmp-port-unreachable). NodePorts (frontends of kind
  "nodeport"): the last rule of nat `KUBE-SERVICES` sends packets to a local address to
  `KUBE-NODEPORTS`, which matches the node port and jumps to `KUBE-EXT-<hash>`: marked for
  MASQUERADE unless externalTrafficPolicy is Local (`traffic_local`: the client address
  is kept), then the frontend's own `KUBE-SVC-<hash>`; a node port without (local)
  endpoints is the filter `KUBE-EXTERNAL-SERVICES` REJECT for local destinations, reached
  from INPUT. (kube-proxy REJECTs a Service without endpoints but DROPs external traffic
  of an externalTrafficPolicy: Local Service without local endpoints; the lab rejects
  both, as the BPF dataplane does, so a probe is refused at once on both.) Chains of
  frontends that went are flushed and deleted.
- IPv6: a Service whose `ipFamilies` (else cluster IPs) include IPv6 also gets IPv6
  slices (`<service>-pyfelix-lab-v6`, addressType IPv6, the pods' IPv6 `podIPs`), and
  `kube_proxy_restore(..., family=6)` renders the IPv6 frontends for ip6tables-restore,
  as kube-proxy's IPv6 proxier does, NodePorts included (the frontends with
  `proto.NODEPORT_VIP6`: the same KUBE-NODEPORTS / KUBE-EXT / MASQUERADE layout, REJECT with
  icmp6-port-unreachable).
- `KubeProxyRules.sync(netns, frontends)`: writes that into a node namespace and makes sure
  the base chains jump to it: nat PREROUTING and OUTPUT, and filter FORWARD and OUTPUT
  (`--ctstate NEW`), and filter INPUT to `KUBE-EXTERNAL-SERVICES`, at the TOP, re-inserted
  at every sync. The agent's own inserts are put
  first by its iptables manager, and its cali-FORWARD accepts what policy allowed (Calico
  before 3.21 had the same layout and so never reached kube-proxy's REJECT, projectcalico
  issue 3650); the lab puts the REJECT first, as Calico's later layout lets it run.

Inputs: raw documents (dicts) as the lab's datastore holds them. Outputs: documents,
proto frontends, restore text; the only kernel writes are in `KubeProxyRules.sync`, in the
namespace given.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.calc.dispatcher import CalcUpdate
from pyfelix.agent.calc.services import ServiceIndex
from pyfelix.agent.model import EndpointSlice, Service, ValidationError, parse_resource

MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY_LAB = "pyfelix-lab"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
GENERATED_SUFFIX = "-pyfelix-lab"
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}
MASQ_MARK = "0x4000"  # kube-proxy's masquerade mark


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_port(pod: dict[str, Any], name: str, protocol: str) -> int | None:
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports", []) or []:
            if port.get("name") == name and port.get("protocol", "TCP") == protocol:
                return int(port["containerPort"])
    return None


def generated_slices(documents: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The EndpointSlices the controller would make (see the module docstring)."""
    docs = list(documents)
    given = {(d["metadata"].get("namespace", "default"),
              (d["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL))
             for d in docs if d.get("kind") == "EndpointSlice"
             and (d["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY_LAB}
    pods = [d for d in docs if d.get("kind") == "Pod"]
    out = []
    for svc in (d for d in docs if d.get("kind") == "Service"):
        namespace = svc["metadata"].get("namespace", "default")
        name = svc["metadata"]["name"]
        selector = (svc.get("spec") or {}).get("selector")
        if not isinstance(selector, dict) or (namespace, name) in given:
            continue
        ports = (svc.get("spec") or {}).get("ports") or []
        for family in _service_families(svc):
            out += _slices_of(svc, ports, [p for p in pods if _pod_ip(p, family)], family)
    return out


def _service_families(svc: dict[str, Any]) -> list[str]:
    """The address types of a Service's slices, as the controller makes them: its
    `ipFamilies`, else the families of its cluster IPs, else IPv4 alone."""
    spec = svc.get("spec") or {}
    listed = [f for f in spec.get("ipFamilies") or [] if f in ("IPv4", "IPv6")]
    if listed:
        return list(dict.fromkeys(listed))
    texts = [*(spec.get("clusterIPs") or []), spec.get("clusterIP")]
    found = [f"IPv{_version(t)}" for t in texts if isinstance(t, str) and _version(t)]
    return list(dict.fromkeys(found)) or ["IPv4"]


def _version(text: str) -> int:
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        return 0


def _pod_ip(pod: dict[str, Any], family: str) -> str | None:
    """The pod's address of `family` ("IPv4"/"IPv6") from status.podIPs (or podIP)."""
    status = pod.get("status") or {}
    texts = [e.get("ip") for e in status.get("podIPs") or [] if isinstance(e, dict)]
    for text in [*texts, status.get("podIP")]:
        if isinstance(text, str) and _version(text) == int(family[-1]):
            return text
    return None


def _slices_of(svc: dict[str, Any], ports: list[dict[str, Any]], pods: list[dict[str, Any]],
               family: str) -> list[dict[str, Any]]:
    """A Service's generated slices of one family (IPv4 ones named as before; IPv6 ones
    get `-v6` after the lab suffix)."""
    namespace = svc["metadata"].get("namespace", "default")
    name = svc["metadata"]["name"]
    selector = (svc.get("spec") or {}).get("selector") or {}
    suffix = GENERATED_SUFFIX + ("-v6" if family == "IPv6" else "")
    out: list[dict[str, Any]] = []
    # pod -> resolved port numbers; pods with the same numbers share a slice
    groups: dict[tuple[tuple[str, str, int], ...], list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("namespace", "default") != namespace or not _matches(
                selector, meta.get("labels") or {}):
            continue
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        resolved = []
        for port in ports:
            protocol = port.get("protocol", "TCP")
            target = port.get("targetPort", port.get("port"))
            number = (_pod_port(pod, target, protocol) if isinstance(target, str)
                      and not target.isdigit() else int(target))
            if number is not None:
                resolved.append((port.get("name", ""), protocol, number))
        groups[tuple(resolved)].append(pod)
    if not groups:
        groups[()] = []
    for i, (resolved, members) in enumerate(sorted(groups.items(), key=lambda g: g[0])):
        out.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}{suffix}{'-' + str(i) if i else ''}",
                         "namespace": namespace,
                         "labels": {SERVICE_NAME_LABEL: name,
                                    MANAGED_BY_LABEL: MANAGED_BY_LAB}},
            "addressType": family,
            "endpoints": [{"addresses": [_pod_ip(p, family)],
                           "conditions": {"ready": True, "serving": True,
                                          "terminating": False},
                           "nodeName": p["spec"]["nodeName"],
                           "targetRef": {"kind": "Pod", "namespace": namespace,
                                         "name": p["metadata"]["name"]}}
                          for p in sorted(members, key=lambda p: p["metadata"]["name"])],
            "ports": [{"name": n, "protocol": pr, "port": num} for n, pr, num in resolved],
        })
    return out


class _Collect:
    def __init__(self) -> None:
        self.frontends: dict[str, proto.ServiceFrontendUpdate] = {}

    def on_service_frontend_update(self, fid: str,
                                   frontend: proto.ServiceFrontendUpdate | None) -> None:
        if frontend is None:
            self.frontends.pop(fid, None)
        else:
            self.frontends[fid] = frontend


def frontends_for(documents: Iterable[dict[str, Any]], node: str
                  ) -> list[proto.ServiceFrontendUpdate]:
    """This node's service frontends, as the agent's ServiceIndex computes them."""
    sink = _Collect()
    index = ServiceIndex(node, sink)
    for doc in documents:
        if doc.get("kind") not in ("Service", "EndpointSlice"):
            continue
        try:
            resource = parse_resource(doc)
        except ValidationError:
            continue
        if isinstance(resource, Service):
            index.on_service_update(CalcUpdate("Service", resource.key, resource))
        elif isinstance(resource, EndpointSlice):
            index.on_slice_update(CalcUpdate("EndpointSlice", resource.key, resource))
    return [sink.frontends[k] for k in sorted(sink.frontends)]


def _chain(prefix: str, *parts: object) -> str:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:16].upper()
    return f"{prefix}-{digest}"


def kube_proxy_restore(frontends: Iterable[proto.ServiceFrontendUpdate],
                       existing_chains: Iterable[str] = (), family: int = 4) -> str:
    """iptables-restore --noflush input for kube-proxy's rules (module docstring); with
    `family=6`, ip6tables-restore input for the frontends with an IPv6 VIP (kube-proxy's
    IPv6 proxier: /128 matches, `[addr]:port` DNAT targets, icmp6-port-unreachable)."""
    frontends = [fe for fe in frontends if (_version(fe.vip) or 4) == family]
    host_len = 128 if family == 6 else 32
    unreachable = "icmp6-port-unreachable" if family == 6 else "icmp-port-unreachable"
    nat_chains: list[str] = ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"]
    nat_rules: list[str] = [
        f"-A KUBE-MARK-MASQ -j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}",
        f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --set-xmark 0x0/{MASQ_MARK}",
        "-A KUBE-POSTROUTING -j MASQUERADE"]
    reject_rules: list[str] = []
    external_rejects: list[str] = []
    node_ports = False
    for fe in frontends:
        proto_name = PROTOCOL_NAMES.get(fe.protocol, str(fe.protocol))
        is_node_port = fe.kind == "nodeport"
        node_ports |= is_node_port
        match = (f"-p {proto_name} -m {proto_name} --dport {fe.port}" if is_node_port
                 else f"-d {fe.vip}/{host_len} -p {proto_name} -m {proto_name} "
                 f"--dport {fe.port}")
        comment = f'-m comment --comment "{fe.service}:{fe.port_name or fe.port}"'
        if not fe.backends:
            if is_node_port:
                external_rejects.append(f"-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type "
                                        f"LOCAL {match} {comment} -j REJECT "
                                        f"--reject-with {unreachable}")
            else:
                reject_rules.append(f"-A KUBE-SERVICES {match} {comment} -j REJECT "
                                    f"--reject-with {unreachable}")
            continue
        svc_chain = _chain("KUBE-SVC", fe.id)
        nat_chains.append(svc_chain)
        if is_node_port:
            ext_chain = _chain("KUBE-EXT", fe.id)
            nat_chains.append(ext_chain)
            nat_rules.append(f"-A KUBE-NODEPORTS {match} {comment} -j {ext_chain}")
            if not fe.traffic_local:
                nat_rules.append(f"-A {ext_chain} -j KUBE-MARK-MASQ")
            nat_rules.append(f"-A {ext_chain} -j {svc_chain}")
        else:
            nat_rules.append(f"-A KUBE-SERVICES {match} {comment} -j {svc_chain}")
        seps = [_chain("KUBE-SEP", fe.id, b.addr, b.port) for b in fe.backends]
        nat_chains += seps
        if fe.affinity_timeout:
            for sep in seps:
                nat_rules.append(f"-A {svc_chain} -m recent --name {sep} --rcheck --seconds "
                                 f"{fe.affinity_timeout} --reap -j {sep}")
        count = len(seps)
        for i, (sep, backend) in enumerate(zip(seps, fe.backends, strict=True)):
            left = count - i
            chance = "" if left == 1 else (f"-m statistic --mode random --probability "
                                           f"{1 / left:.11f} ")
            nat_rules.append(f"-A {svc_chain} {chance}-j {sep}")
            recent = f"-m recent --name {sep} --set " if fe.affinity_timeout else ""
            nat_rules.append(f"-A {sep} -s {backend.addr}/{host_len} -j KUBE-MARK-MASQ")
            to = (f"[{backend.addr}]:{backend.port}" if family == 6
                  else f"{backend.addr}:{backend.port}")
            nat_rules.append(f"-A {sep} -p {proto_name} {recent}-m {proto_name} -j DNAT "
                             f"--to-destination {to}")
    nat_chains.append("KUBE-NODEPORTS")
    if node_ports:  # kube-proxy's last KUBE-SERVICES rule
        nat_rules.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
    stale = sorted(set(existing_chains) - set(nat_chains))
    lines = ["*nat", *(f":{c} - [0:0]" for c in [*nat_chains, *stale]), *nat_rules,
             *(f"-X {c}" for c in stale), "COMMIT",
             "*filter", ":KUBE-SERVICES - [0:0]", ":KUBE-EXTERNAL-SERVICES - [0:0]",
             *reject_rules, *external_rejects, "COMMIT", ""]
    return "\n".join(lines)


NAT_JUMPS = (("PREROUTING", "-j KUBE-SERVICES"), ("OUTPUT", "-j KUBE-SERVICES"),
             ("POSTROUTING", "-j KUBE-POSTROUTING"))
FILTER_JUMPS = (("FORWARD", "-m conntrack --ctstate NEW -j KUBE-SERVICES"),
                ("OUTPUT", "-m conntrack --ctstate NEW -j KUBE-SERVICES"),
                ("INPUT", "-m conntrack --ctstate NEW -j KUBE-EXTERNAL-SERVICES"))


class KubeProxyRules:
    """Writes kube-proxy's rules into node namespaces (`ip netns exec NS iptables...`);
    `KubeProxyRules("ip6tables")` writes the IPv6 frontends' with ip6tables."""

    def __init__(self, iptables: str = "iptables") -> None:
        self.iptables = iptables
        self.family = 6 if iptables.startswith("ip6tables") else 4

    def _run(self, netns: str, *args: str, stdin: str | None = None, check: bool = True,
             timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", netns, *args], input=stdin, text=True,
                              capture_output=True, check=check, timeout=timeout)

    def sync(self, netns: str, frontends: Iterable[proto.ServiceFrontendUpdate]) -> None:
        saved = self._run(netns, f"{self.iptables}-save", "-t", "nat", timeout=600).stdout
        existing = [line[1:].split()[0] for line in saved.splitlines()
                    if line.startswith((":KUBE-SVC-", ":KUBE-SEP-", ":KUBE-EXT-"))]
        # 10,000 Services are ~100,000 rules: minutes on a loaded machine
        self._run(netns, f"{self.iptables}-restore", "--noflush",
                  stdin=kube_proxy_restore(frontends, existing, self.family), timeout=600)
        for base, rule in NAT_JUMPS:
            if self._run(netns, self.iptables, "-t", "nat", "-C", base, *rule.split(),
                         check=False).returncode != 0:
                self._run(netns, self.iptables, "-t", "nat", "-A", base, *rule.split())
        for base, rule in FILTER_JUMPS:
            while self._run(netns, self.iptables, "-D", base, *rule.split(),
                            check=False).returncode == 0:
                pass
            self._run(netns, self.iptables, "-I", base, "1", *rule.split())

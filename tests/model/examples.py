"""Realistic example documents of every kind pyfelix reads (Calico v3 and Kubernetes).

Used by the model, conversion, validator and fuzz tests. `documents()` returns fresh dicts
each call, so tests may mutate them.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from pyfelix.agent.syncer.api import key_of

EXAMPLES_YAML = r"""
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100, defaultAction: Pass}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata:
  name: security.allow-dns
  labels: {owner: platform}
spec:
  tier: security
  order: 10
  selector: all()
  namespaceSelector: kubernetes.io/metadata.name != "kube-system"
  types: [Egress]
  egress:
    - action: Allow
      protocol: UDP
      destination:
        selector: k8s-app == "kube-dns"
        namespaceSelector: projectcalico.org/name == "kube-system"
        ports: [53, "dns"]
    - action: Allow
      protocol: TCP
      destination:
        nets: [10.96.0.10/32]
        ports: ["53", "8053:8060"]
    - action: Pass
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: host-protect}
spec:
  order: 5
  selector: has(host-endpoint)
  doNotTrack: true
  applyOnForward: true
  ingress:
    - action: Deny
      protocol: TCP
      source: {nets: [198.51.100.0/24], notNets: [198.51.100.7]}
      destination: {notPorts: [22]}
    - action: Log
      protocol: ICMP
      icmp: {type: 8, code: 0}
    - action: Allow
      protocol: 1
      notICMP: {type: 5}
    - action: Allow
      notProtocol: udplite
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: api-ingress, namespace: prod}
spec:
  order: 200.5
  selector: role == 'api'
  ingress:
    - action: Allow
      protocol: TCP
      source:
        selector: role == 'frontend'
        notSelector: quarantine == 'true'
      destination: {ports: [http, 8443]}
    - action: Allow
      protocol: TCP
      source:
        serviceAccounts: {names: [monitoring, prometheus], selector: team == 'ops'}
      destination: {ports: ["9090:9099"]}
    - action: Deny
      ipVersion: 6
      protocol: ICMPv6
      source: {nets: ["2001:db8::/32"]}
  egress:
    - action: Allow
      protocol: SCTP
      destination: {namespaceSelector: global(), ports: [3868]}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata:
  name: cloud-metadata
  labels: {kind: metadata-service}
spec:
  nets: [169.254.169.254/32, "fd00:ec2::254"]
---
apiVersion: projectcalico.org/v3
kind: NetworkSet
metadata:
  name: partners
  namespace: prod
  labels: {partner: "yes"}
spec:
  nets: [203.0.113.0/24, 192.0.2.5]
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: node1-k8s-legacy--vm-eth0
  namespace: prod
  labels: {app: legacy}
spec:
  node: node1
  orchestrator: k8s
  pod: legacy-vm
  endpoint: eth0
  containerID: 1234abcd
  interfaceName: cali0123456789a
  mac: "ee:ee:ee:ee:ee:ee"
  ipNetworks: [10.65.0.20/32, "fd00:65::20"]
  ipNATs: [{internalIP: 10.65.0.20, externalIP: 172.16.0.20}]
  profiles: [kns.prod, ksa.prod.default]
  serviceAccountName: default
  ports:
    - {name: http, protocol: TCP, port: 8080}
    - {name: metrics, protocol: UDP, port: 9125, hostPort: 19125}
---
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: node1-eth0
  labels: {host-endpoint: "true", node: node1}
spec:
  node: node1
  interfaceName: eth0
  expectedIPs: [198.18.0.1]
  profiles: [host-defaults]
  ports:
    - {name: bgp, protocol: TCP, port: 179}
---
apiVersion: projectcalico.org/v3
kind: Profile
metadata: {name: host-defaults}
spec:
  ingress:
    - action: Allow
      source: {selector: has(host-endpoint)}
  egress:
    - action: Allow
  labelsToApply: {zone: dc1}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pods-v4}
spec:
  cidr: 10.65.0.0/16
  blockSize: 24
  ipipMode: Never
  vxlanMode: CrossSubnet
  natOutgoing: true
  nodeSelector: all()
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pods-v6}
spec:
  cidr: "fd00:65::/48"
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node1}
spec:
  bgp:
    ipv4Address: 198.18.0.1/15
    asNumber: 64512
    routeReflectorClusterID: 224.0.0.1
  ipv4VXLANTunnelAddr: 10.65.3.0
  addresses:
    - {address: 198.18.0.1/15, type: CalicoNodeIP}
---
apiVersion: projectcalico.org/v3
kind: BGPConfiguration
metadata: {name: default}
spec:
  asNumber: 64512
  nodeToNodeMeshEnabled: true
  logSeverityScreen: Info
  serviceClusterIPs: [{cidr: 10.96.0.0/12}]
  communities: [{name: bgp-large-community, value: "64512:300:100"}]
  prefixAdvertisements:
    - {cidr: 10.65.0.0/16, communities: [bgp-large-community, "64512:120"]}
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: rack1-tor}
spec:
  nodeSelector: rack == 'rack-1'
  peerIP: 198.18.255.1:1179
  asNumber: "64513.1"
  keepaliveTime: 30s
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: mesh-rr}
spec:
  peerSelector: route-reflector == 'true'
  password:
    secretKeyRef: {name: bgp-secrets, key: rr-password}
---
apiVersion: projectcalico.org/v3
kind: BGPFilter
metadata: {name: edge-in}
spec:
  importV4:
    - {action: Accept, matchOperator: In, cidr: 44.0.0.0/16, prefixLength: {min: 20}}
    - {action: Reject, source: RemotePeers, interface: "eth*"}
  exportV6:
    - {action: Reject, matchOperator: NotEqual, cidr: "fd00:9::/64"}
---
apiVersion: v1
kind: Secret
metadata: {name: bgp-secrets, namespace: kube-system}
type: Opaque
data: {rr-password: dmVyeS1zZWNyZXQ=}
stringData: {tor-password: another-secret}
---
apiVersion: projectcalico.org/v3
kind: FelixConfiguration
metadata: {name: default}
spec:
  bpfEnabled: true
  logSeverityScreen: Info
  healthPort: 9099
  failsafeInboundHostPorts: [{protocol: tcp, port: 22}]
---
apiVersion: projectcalico.org/v3
kind: ClusterInformation
metadata: {name: default}
spec:
  datastoreReady: true
  clusterGUID: 0f3c0ffee
  clusterType: k8s,bgp,kubeadm
  calicoVersion: v3.30.0
---
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  uid: 8e0b7cd6-0c63-4c3e-9d3f-2a56d5e0a001
  resourceVersion: "4711"
  labels: {env: prod, kubernetes.io/metadata.name: prod}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: api
  namespace: prod
  labels: {team: backend}
automountServiceAccountToken: false
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7d9f8-abcde
  namespace: prod
  uid: 3c1a9f0e-1111-4c3e-9d3f-2a56d5e0a002
  resourceVersion: "12345"
  labels: {app: api, role: api, pod-template-hash: 7d9f8}
  annotations: {cni.projectcalico.org/containerID: abc}
spec:
  nodeName: node1
  serviceAccountName: api
  restartPolicy: Always
  containers:
    - name: api
      image: registry.example/api:1.2
      ports:
        - {name: http, containerPort: 8080, protocol: TCP}
        - {containerPort: 9999}
        - {name: dns-udp, containerPort: 5353, protocol: UDP}
      resources: {limits: {cpu: 500m}}
  initContainers:
    - name: init
      image: busybox
      ports: [{name: init-sctp, containerPort: 7777, protocol: SCTP}]
status:
  phase: Running
  podIP: 10.65.0.10
  podIPs: [{ip: 10.65.0.10}, {ip: "fd00:65::10"}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata:
  name: node2
  annotations:
    projectcalico.org/IPv4Address: 198.18.0.2/15
    projectcalico.org/ASNumber: "64512"
spec:
  podCIDRs: [10.65.2.0/24]
status:
  addresses:
    - {type: InternalIP, address: 198.18.0.2}
    - {type: Hostname, address: node2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-web, namespace: db}
spec:
  podSelector:
    matchLabels: {app: postgres}
    matchExpressions:
      - {key: tier, operator: In, values: [db, cache]}
  policyTypes: [Ingress, Egress]
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {team: web}}
          podSelector: {matchExpressions: [{key: app, operator: Exists}]}
        - ipBlock: {cidr: 172.17.0.0/16, except: [172.17.1.0/24]}
      ports:
        - {protocol: TCP, port: pg}
        - {protocol: TCP, port: 6000, endPort: 6010}
  egress:
    - to: [{namespaceSelector: {}}]
      ports: [{protocol: UDP, port: 53}]
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: prod
  uid: 5d2e7a10-2222-4c3e-9d3f-2a56d5e0a003
  resourceVersion: "2001"
spec:
  type: ClusterIP
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  selector: {app: api}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  internalTrafficPolicy: Cluster
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: http}
    - {name: dns, protocol: UDP, port: 53, targetPort: 5353}
status: {loadBalancer: {}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-x7k2p
  namespace: prod
  labels:
    kubernetes.io/service-name: api
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
  generateName: api-
  ownerReferences:
    - {apiVersion: v1, kind: Service, name: api, uid: 5d2e7a10-2222-4c3e-9d3f-2a56d5e0a003}
addressType: IPv4
endpoints:
  - addresses: [10.65.0.7]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node1
    targetRef:
      {kind: Pod, namespace: prod, name: api-7d9f8-abcde, uid: 3c1a9f0e-1111-4c3e-9d3f-2a56d5e0a002}
  - addresses: [10.65.1.9]
    conditions: {ready: false, serving: true, terminating: true}
    nodeName: node2
ports:
  - {name: http, protocol: TCP, port: 8080}
  - {name: dns, protocol: UDP, port: 5353}
"""


def documents() -> list[dict[str, Any]]:
    """Every example document, freshly parsed (safe to mutate)."""
    return [copy.deepcopy(d) for d in _PARSED]


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    """The first example of `kind` (as keyed: `KubernetesNetworkPolicy` for Kubernetes'
    NetworkPolicy) and `name`, if given, freshly copied."""
    for doc in _PARSED:
        if key_of(doc).kind == kind and (name is None or doc["metadata"]["name"] == name):
            return copy.deepcopy(doc)
    raise KeyError((kind, name))


def load(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict)
    return doc


_PARSED: list[dict[str, Any]] = [d for d in yaml.safe_load_all(EXAMPLES_YAML) if d]

"""Model endpoints -> their `proto` identity and message, as the dataplane sees them.

Role: pure functions used by the event sequencer (and by `pyfelix calc` to name endpoints).

- `workload_id(wep)`: Calico's v1 identity (orchestrator, workload, endpoint). The workload
  part is the model's `endpoint_id`, `<namespace>/<workload>` (the workload name defaults
  to the pod name, then the resource name), as `pyfelix calc` names endpoints.
- `workload_message(wep, tiers)` / `host_message(hep, tiers)`: the endpoint with its
  addresses (and a workload's ipNATs: `ipv4_nat` / `ipv6_nat`, each sorted) split by IP
  version and its resolved tiers. A host endpoint's `name` is its
  `interfaceName` as given: "*" for every host interface, "" when only `expectedIPs` name
  it (the dataplane applies it to the interfaces carrying those addresses, as Felix does).
"""

from __future__ import annotations

from pyfelix.agent import proto
from pyfelix.agent.calc.policy_resolver import EndpointTiers
from pyfelix.agent.model import HostEndpoint, WorkloadEndpoint


def workload_id(wep: WorkloadEndpoint) -> proto.WorkloadEndpointID:
    return proto.WorkloadEndpointID(orchestrator=wep.orchestrator, workload=wep.endpoint_id,
                                    endpoint=wep.endpoint)


def host_id(hep: HostEndpoint) -> proto.HostEndpointID:
    return proto.HostEndpointID(endpoint=hep.key.name)


def _split_by_version(nets: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(n for n in nets if ":" not in n), tuple(n for n in nets if ":" in n))


def workload_message(wep: WorkloadEndpoint, tiers: EndpointTiers) -> proto.WorkloadEndpointUpdate:
    v4, v6 = _split_by_version(wep.ip_networks)
    nats = sorted(proto.NatInfo(ext_ip=n.external_ip, int_ip=n.internal_ip)
                  for n in wep.ip_nats)
    return proto.WorkloadEndpointUpdate(
        id=workload_id(wep),
        endpoint=proto.WorkloadEndpoint(
            state="active", name=wep.interface_name, mac=wep.mac,
            profile_ids=tuple(wep.profiles), ipv4_nets=v4, ipv6_nets=v6, tiers=tiers.tiers,
            allow_spoofed_source_prefixes=wep.allow_spoofed_source_prefixes,
            ipv4_nat=tuple(n for n in nats if ":" not in n.ext_ip),
            ipv6_nat=tuple(n for n in nats if ":" in n.ext_ip)),
    )


def host_message(hep: HostEndpoint, tiers: EndpointTiers) -> proto.HostEndpointUpdate:
    v4, v6 = _split_by_version(hep.expected_ips)
    return proto.HostEndpointUpdate(
        id=host_id(hep),
        endpoint=proto.HostEndpoint(
            name=hep.interface_name, profile_ids=tuple(hep.profiles),
            expected_ipv4_addrs=v4, expected_ipv6_addrs=v6, tiers=tiers.tiers,
            untracked_tiers=tiers.untracked, pre_dnat_tiers=tiers.pre_dnat,
            forward_tiers=tiers.forward),
    )

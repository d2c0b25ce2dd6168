"""Agent-level Prometheus metrics, with Felix's names where Felix has an equivalent.

Metrics that belong to one component live beside it (the dataplane loop's
`felix_int_dataplane_*`, the validator's `pyfelix_validation_errors_total`, ...); the ones
here describe the whole agent and are updated by `agent.daemon` from the messages it
forwards and the state of its loops. `serve_metrics()` exposes the default registry.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

ACTIVE_LOCAL_ENDPOINTS = Gauge(
    "felix_active_local_endpoints",
    "Number of active endpoints on this host.",
)
ACTIVE_LOCAL_POLICIES = Gauge(
    "felix_active_local_policies",
    "Number of active policies on this host.",
)
ACTIVE_LOCAL_PROFILES = Gauge(
    "pyfelix_active_local_profiles",
    "Number of active profiles on this host.",
)
IPSETS = Gauge(
    "felix_ipsets_calico",
    "Number of active IP sets.",
)
IPSET_MEMBERS = Gauge(
    "pyfelix_ipset_members",
    "Total number of members across the active IP sets.",
)
CALC_GRAPH_UPDATE_TIME = Histogram(
    "felix_calc_graph_update_time_seconds",
    "Seconds to update the calculation graph for each datastore batch and flush it.",
)
CALC_GRAPH_OUTPUT_EVENTS = Counter(
    "felix_calc_graph_output_events",
    "Number of events emitted by the calculation graph to the dataplane.",
)
RESYNC_STATE = Gauge(
    "felix_resync_state",
    "Datastore sync state: 1 waiting for datastore, 2 resyncing, 3 in sync.",
)
CLUSTER_NUM_HOSTS = Gauge(
    "felix_cluster_num_hosts",
    "Number of hosts in the cluster (from host metadata).",
)
DATAPLANE_IN_SYNC = Gauge(
    "pyfelix_dataplane_in_sync",
    "1 once the dataplane has been fully programmed after the datastore was in sync.",
)


def serve_metrics(host: str, port: int) -> None:
    """Start the Prometheus HTTP endpoint in a daemon thread."""
    start_http_server(port, addr=host or "0.0.0.0")

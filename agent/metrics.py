"""Agent-level Prometheus metrics, with Felix's names where Felix has an equivalent.

Metrics that belong to one component live beside it (the dataplane loop's
`felix_int_dataplane_*`, the validator's `pyfelix_validation_errors_total`, ...); the ones
here describe the whole agent and are updated by `agent.daemon` from the messages it
forwards and the state of its loops. `serve_metrics()` exposes the default registry on an
`agent.httpserver.BoundedHTTPServer` (prometheus_client's own server starts a thread per
connection with no cap or timeout): at most PrometheusMetricsMaxConnections connections at
once, each cut off after PrometheusMetricsReadTimeout s without a complete request.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.exposition import MetricsHandler

from pyfelix.agent.httpserver import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT,
    BoundedHTTPServer,
)

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


def serve_metrics(host: str, port: int, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                  read_timeout: float = DEFAULT_READ_TIMEOUT) -> BoundedHTTPServer:
    """Start the Prometheus HTTP endpoint (default registry) in a daemon thread; the caller
    stops it with `.stop()`."""
    server = BoundedHTTPServer("metrics", host or "0.0.0.0", port, MetricsHandler,
                               max_connections=max_connections, read_timeout=read_timeout)
    server.serve_in_thread()
    return server

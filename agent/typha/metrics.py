"""Prometheus metrics of the Typha server (module-level, registered once per process).

Names follow Calico Typha's where one exists (`typha_connections_active`,
`typha_connections_accepted`, `typha_connections_dropped`, `typha_snapshots_generated`,
`typha_ping_latency`, `typha_updates_total`...) so existing dashboards keep working. Every
metric carries the `syncer_type` label ("felix", "bgp") except where noted.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONNECTIONS_ACTIVE = Gauge(
    "typha_connections_active",
    "Number of client connections that completed the hello exchange and are open now.",
    ["syncer_type"],
)
CONNECTIONS_ACCEPTED = Counter(
    "typha_connections_accepted",
    "Number of client connections that completed the hello exchange since the server started.",
    ["syncer_type"],
)
CONNECTIONS_DROPPED = Counter(
    "typha_connections_dropped",
    "Number of client connections the server closed on its own initiative, by reason: slow "
    "(its send queue went over the bound or a write timed out), behind (it fell out of the "
    "bounded update log), ping-timeout (no pong in time), malformed (a protocol error), "
    "handshake (an invalid hello), hello-timeout (no TLS handshake and hello within the "
    "handshake timeout of connecting), pending-limit (refused at once: the server already had "
    "its limit of connections waiting for their hello), tls (the TLS handshake failed), "
    "unauthorized (TLS identity refused), full (connection limit) and shutdown. No "
    "syncer_type label: the type is unknown before the hello.",
    ["reason"],
)
CONNECTIONS_PENDING = Gauge(
    "typha_connections_pending",
    "Number of client connections accepted that have not completed their hello yet (TLS "
    "handshake and client_hello); bounded by the pending-handshake limit. No syncer_type "
    "label: the type is unknown before the hello.",
)
SNAPSHOT_SIZE = Gauge(
    "typha_snapshot_size",
    "Number of key/value pairs in the server's current snapshot cache.",
    ["syncer_type"],
)
SNAPSHOT_BYTES = Gauge(
    "typha_snapshot_bytes",
    "Encoded size in bytes of the last snapshot the server generated, by compression.",
    ["syncer_type", "compression"],
)
SNAPSHOTS_GENERATED = Counter(
    "typha_snapshots_generated",
    "Number of snapshots the server encoded for new clients (clients connecting close "
    "together share one).",
    ["syncer_type"],
)
UPDATES_TOTAL = Counter(
    "typha_updates_total",
    "Number of key/value updates the server received from its datastore syncer and added to "
    "the update log.",
    ["syncer_type"],
)
UPDATES_SKIPPED = Counter(
    "typha_updates_skipped",
    "Number of key/value updates from the datastore syncer that changed nothing in the cache "
    "(same value again, or a delete of an absent key) and were not sent to clients.",
    ["syncer_type"],
)
UPDATE_LOG_ENTRIES = Gauge(
    "typha_update_log_entries",
    "Number of entries (batches of updates or status changes) kept in the bounded update log.",
    ["syncer_type"],
)
FANOUT_LATENCY = Histogram(
    "typha_updates_fanout_latency",
    "Seconds from the server receiving an update from its datastore syncer to the update "
    "being written to a client's socket (one observation per write to a client: the "
    "oldest update in that write).",
    ["syncer_type"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
PING_LATENCY = Histogram(
    "typha_ping_latency",
    "Seconds between the server sending a ping and receiving the client's pong.",
    ["syncer_type"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0),
)
DATASTORE_SYNCERS = Gauge(
    "typha_datastore_syncers",
    "Number of datastore syncers (list + watch) the server holds: one per syncer type it "
    "serves, however many clients it has. Without Typha, every client holds its own.",
)
DATASTORE_ERRORS = Counter(
    "typha_datastore_errors",
    "Number of errors the datastore syncer reported (unparsable or unkeyable input); the "
    "syncer kept the last good state and the server logged each one.",
    ["syncer_type"],
)

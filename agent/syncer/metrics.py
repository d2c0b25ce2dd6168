"""Prometheus metrics shared by every datastore backend (module-level, registered once).

Each backend labels its samples with `backend` ("file", "etcd3", "kubernetes", "typha").
"""

from __future__ import annotations

from prometheus_client import Counter

DATASTORE_PARSE_ERRORS = Counter(
    "pyfelix_datastore_parse_errors_total",
    "Number of datastore inputs that could not be parsed or keyed (a YAML or JSON syntax "
    "error, or a document without kind or metadata.name). The file backend keeps the last "
    "good state of such a file; key-value backends (etcd3) treat the key as deleted.",
    ["backend"],
)

DATASTORE_RESYNCS = Counter(
    "pyfelix_datastore_resyncs_total",
    "Number of full resyncs: times a syncer listed every resource (etcd3) or a resource "
    "type (kubernetes) again after its first list. Reasons: compacted = the etcd revision "
    "it was watching from had been compacted; expired = the Kubernetes API answered 410 "
    "Gone; error = an unexpected failure made it start over. A reconnect that resumes the "
    "watch where it stopped is not a resync.",
    ["backend", "reason"],
)
RESYNC_COMPACTED = "compacted"
RESYNC_EXPIRED = "expired"
RESYNC_ERROR = "error"

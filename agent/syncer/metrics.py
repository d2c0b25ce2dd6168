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

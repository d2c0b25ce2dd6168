"""Felix's datastore settings -> the agent's `DatastoreLocation` (when no --datastore).

Role: an agent configured only as Felix is (DatastoreType, EtcdEndpoints / EtcdAddr /
EtcdScheme, EtcdCaFile / EtcdCertFile / EtcdKeyFile, TyphaAddr / TyphaK8sServiceName) finds
its datastore. Inputs: the local `Config` (env + config file: these settings are `local` in
Felix, never from a FelixConfiguration). Outputs: `felix_datastore_location()` (the existing
`agent.datastore.DatastoreLocation` that `open_datastore`/`make_syncer` take) and
`etcd_tls_environ()` (the TLS files as the etcd backend reads them: ETCD_CA_CERT_FILE,
ETCD_CERT_FILE, ETCD_KEY_FILE).

Felix's precedence: Typha when TyphaAddr (or TyphaK8sServiceName, discovered) is set, with
the datastore behind it; else DatastoreType: `kubernetes`, or `etcdv3` at EtcdEndpoints
(when set) or EtcdScheme://EtcdAddr. Errors: `DatastoreURLError` naming the setting.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.config import Config
from agent.datastore import DatastoreLocation
from agent.syncer.client import DatastoreURLError


def _host_port(endpoint: str, setting: str) -> str:
    """`http://HOST:PORT` (EtcdEndpoints) or `HOST:PORT` (EtcdAddr, TyphaAddr) -> HOST:PORT."""
    netloc = urlsplit(endpoint).netloc if "//" in endpoint else endpoint
    host, sep, port = netloc.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DatastoreURLError(f"{setting}: {endpoint!r} is not [SCHEME://]HOST:PORT")
    return netloc


def felix_datastore_location(config: Config) -> DatastoreLocation:
    """Where Felix, configured as `config` is, would read its datastore."""
    if config.typha_addr:
        return DatastoreLocation("typha", endpoints=(_host_port(config.typha_addr,
                                                                "TyphaAddr"),))
    if config.typha_k8s_service_name:
        return DatastoreLocation("typha")
    if config.datastore_type == "kubernetes":
        return DatastoreLocation("kubernetes")
    if config.etcd_endpoints:
        return DatastoreLocation("etcd3", endpoints=tuple(
            _host_port(e, "EtcdEndpoints") for e in config.etcd_endpoints))
    return DatastoreLocation("etcd3", endpoints=(_host_port(config.etcd_addr, "EtcdAddr"),))


def etcd_tls_environ(config: Config) -> dict[str, str]:
    """EtcdCaFile/EtcdCertFile/EtcdKeyFile under the names the etcd backend reads; https
    endpoints (EtcdScheme or EtcdEndpoints) need the CA."""
    tls = {"ETCD_CA_CERT_FILE": config.etcd_ca_file, "ETCD_CERT_FILE": config.etcd_cert_file,
           "ETCD_KEY_FILE": config.etcd_key_file}
    https = (any(e.startswith("https://") for e in config.etcd_endpoints)
             if config.etcd_endpoints else config.etcd_scheme == "https")
    if https and not config.etcd_ca_file and config.datastore_type == "etcdv3":
        raise DatastoreURLError("EtcdScheme/EtcdEndpoints: https needs EtcdCaFile (the CA "
                                "that signed etcd's certificate)")
    return {name: path for name, path in tls.items() if path}

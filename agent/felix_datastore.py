"""Felix's datastore settings -> the agent's `DatastoreLocation` (when no --datastore).

Role: an agent configured only as Felix is (DatastoreType, EtcdEndpoints / EtcdAddr /
EtcdScheme, EtcdCaFile / EtcdCertFile / EtcdKeyFile, TyphaAddr / TyphaK8sServiceName) finds
its datastore. Inputs: the local `Config` (env + config file: these settings are `local` in
Felix, never from a FelixConfiguration). Outputs: `felix_datastore_location()` (the existing
`agent.datastore.DatastoreLocation` that `open_datastore`/`make_syncer` take) and
`etcd_tls_environ()` (the TLS files as the etcd backend reads them: ETCD_CA_CERT_FILE,
ETCD_CERT_FILE, ETCD_KEY_FILE).

Felix's precedence: Typha when TyphaAddr (or TyphaK8sServiceName, discovered) is set, with
the datastore behind it; else libcalico-go's client environment (DATASTORE_TYPE,
ETCD_ENDPOINTS) overridden by the Felix settings that are set: DatastoreType, EtcdEndpoints,
else EtcdScheme://EtcdAddr (either of the two selects etcdv3). Errors: `DatastoreURLError`
naming the setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from pyfelix.agent.config import Config
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.syncer.client import DatastoreURLError


def _host_port(endpoint: str, setting: str) -> str:
    """`http://HOST:PORT` (EtcdEndpoints) or `HOST:PORT` (EtcdAddr, TyphaAddr) -> HOST:PORT."""
    netloc = urlsplit(endpoint).netloc if "//" in endpoint else endpoint
    host, sep, port = netloc.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DatastoreURLError(f"{setting}: {endpoint!r} is not [SCHEME://]HOST:PORT")
    return netloc


def _calico_env(environ: Mapping[str, str], name: str) -> str:
    """A libcalico-go client setting: CALICO_<NAME>, else <NAME> ("" when neither)."""
    return (environ.get(f"CALICO_{name}") or environ.get(name) or "").strip()


def _set(config: Config, name: str) -> bool:
    return config.source_of(name) != "default"


def felix_datastore_location(config: Config,
                             environ: Mapping[str, str] | None = None) -> DatastoreLocation:
    """Where Felix, configured as `config` is, would read its datastore.

    As Felix: the libcalico-go client's environment first (DATASTORE_TYPE, default etcdv3;
    ETCD_ENDPOINTS, default http://127.0.0.1:2379; each also as CALICO_<NAME>), then the
    Felix settings that are set (env or config file) override it: DatastoreType; a
    non-empty EtcdEndpoints, else EtcdAddr (with EtcdScheme), which also select etcdv3."""
    env = {} if environ is None else environ
    if config.typha_addr:
        return DatastoreLocation("typha", endpoints=(_host_port(config.typha_addr,
                                                                "TyphaAddr"),))
    if config.typha_k8s_service_name:
        return DatastoreLocation("typha")
    backend = _calico_env(env, "DATASTORE_TYPE") or "etcdv3"
    if backend not in ("etcdv3", "kubernetes"):
        raise DatastoreURLError(f"DATASTORE_TYPE: {backend!r} is not etcdv3 or kubernetes")
    endpoints = [e.strip() for e in (_calico_env(env, "ETCD_ENDPOINTS")
                                     or "http://127.0.0.1:2379").split(",") if e.strip()]
    setting = "ETCD_ENDPOINTS"
    if _set(config, "DatastoreType"):
        backend = config.datastore_type
    if _set(config, "EtcdEndpoints") and config.etcd_endpoints:
        backend, endpoints, setting = "etcdv3", list(config.etcd_endpoints), "EtcdEndpoints"
    elif _set(config, "EtcdAddr"):
        backend, setting = "etcdv3", "EtcdAddr"
        endpoints = [f"{config.etcd_scheme}://{config.etcd_addr}"]
    if backend == "kubernetes":
        return DatastoreLocation("kubernetes")
    return DatastoreLocation("etcd3", endpoints=tuple(_host_port(e, setting)
                                                       for e in endpoints))


def etcd_tls_environ(config: Config, environ: Mapping[str, str] | None = None
                     ) -> dict[str, str]:
    """EtcdCaFile/EtcdCertFile/EtcdKeyFile under the names the etcd backend reads (which
    also takes ETCD_CA_CERT_FILE... from the environment itself); https endpoints
    (EtcdScheme or EtcdEndpoints) need a CA from one or the other."""
    tls = {"ETCD_CA_CERT_FILE": config.etcd_ca_file, "ETCD_CERT_FILE": config.etcd_cert_file,
           "ETCD_KEY_FILE": config.etcd_key_file}
    https = (any(e.startswith("https://") for e in config.etcd_endpoints)
             if config.etcd_endpoints else config.etcd_scheme == "https")
    env_ca = _calico_env({} if environ is None else environ, "ETCD_CA_CERT_FILE")
    if https and not (config.etcd_ca_file or env_ca) and config.datastore_type == "etcdv3":
        raise DatastoreURLError("EtcdScheme/EtcdEndpoints: https needs EtcdCaFile (the CA "
                                "that signed etcd's certificate)")
    return {name: path for name, path in tls.items() if path}

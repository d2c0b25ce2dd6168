"""Felix's datastore settings -> DatastoreLocation (agent.felix_datastore)."""

from __future__ import annotations

import pytest

from pyfelix.agent.config import load_config
from pyfelix.agent.datastore import DatastoreLocation, parse_datastore_url
from pyfelix.agent.felix_datastore import etcd_tls_environ, felix_datastore_location
from pyfelix.agent.syncer.client import DatastoreURLError


def _location(env: dict[str, str]) -> DatastoreLocation:
    return felix_datastore_location(load_config(environ=env))


def test_felixs_default_is_local_etcd() -> None:
    assert _location({}) == DatastoreLocation("etcd3", endpoints=("127.0.0.1:2379",))


def test_etcd_endpoints_win_over_etcd_addr() -> None:
    env = {"FELIX_DATASTORETYPE": "etcdv3", "FELIX_ETCDADDR": "10.0.0.9:2379",
           "FELIX_ETCDENDPOINTS": "http://10.0.0.1:2379,http://10.0.0.2:22379"}
    location = _location(env)
    assert location == DatastoreLocation("etcd3", endpoints=("10.0.0.1:2379",
                                                             "10.0.0.2:22379"))
    assert parse_datastore_url(str(location)) == location
    assert _location({"FELIX_ETCDADDR": "10.0.0.9:2379", "FELIX_ETCDENDPOINTS": ""}) == \
        DatastoreLocation("etcd3", endpoints=("10.0.0.9:2379",))
    # EtcdScheme https without a CA is refused, with one from either source accepted
    https = load_config(environ={"FELIX_ETCDSCHEME": "https", "FELIX_ETCDADDR": "e:2379"})
    with pytest.raises(DatastoreURLError, match="EtcdCaFile"):
        etcd_tls_environ(https)
    assert etcd_tls_environ(https, {"ETCD_CA_CERT_FILE": "/ca.pem"}) == {}


def test_kubernetes_and_typha() -> None:
    assert _location({"FELIX_DATASTORETYPE": "kubernetes"}) == DatastoreLocation("kubernetes")
    typha = _location({"FELIX_DATASTORETYPE": "kubernetes", "FELIX_TYPHAADDR": "10.0.0.5:5473"})
    assert typha == DatastoreLocation("typha", endpoints=("10.0.0.5:5473",))
    assert str(typha) == "typha://10.0.0.5:5473"
    discovered = _location({"FELIX_TYPHAK8SSERVICENAME": "calico-typha"})
    assert discovered == DatastoreLocation("typha")
    assert parse_datastore_url(str(discovered)) == discovered


def test_etcd_tls_files(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    config = load_config(environ={"FELIX_ETCDSCHEME": "https", "FELIX_ETCDCAFILE": str(ca)})
    assert etcd_tls_environ(config) == {"ETCD_CA_CERT_FILE": str(ca)}
    with pytest.raises(DatastoreURLError, match="EtcdCaFile"):
        etcd_tls_environ(load_config(environ={
            "FELIX_ETCDENDPOINTS": "https://10.0.0.1:2379"}))


def test_libcalico_environment_then_felix_overrides() -> None:
    """As Felix: DATASTORE_TYPE / ETCD_ENDPOINTS (or CALICO_...) first; a Felix setting that
    is set wins; EtcdEndpoints or EtcdAddr select etcdv3 even over DATASTORE_TYPE."""
    def where(env: dict[str, str]) -> DatastoreLocation:
        return felix_datastore_location(load_config(environ=env), env)

    assert where({"DATASTORE_TYPE": "kubernetes"}) == DatastoreLocation("kubernetes")
    assert where({"CALICO_ETCD_ENDPOINTS": "http://10.0.0.3:2379"}) == DatastoreLocation(
        "etcd3", endpoints=("10.0.0.3:2379",))
    assert where({"DATASTORE_TYPE": "kubernetes", "FELIX_DATASTORETYPE": "etcdv3",
                  "ETCD_ENDPOINTS": "http://10.0.0.4:2379"}) == DatastoreLocation(
        "etcd3", endpoints=("10.0.0.4:2379",))
    assert where({"DATASTORE_TYPE": "kubernetes", "FELIX_ETCDADDR": "10.0.0.5:2379"}) == \
        DatastoreLocation("etcd3", endpoints=("10.0.0.5:2379",))
    with pytest.raises(DatastoreURLError, match="DATASTORE_TYPE"):
        where({"DATASTORE_TYPE": "consul"})

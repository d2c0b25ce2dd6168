"""Unit tests for the etcd backend's pure parts: key layout, value decoding, configuration
(endpoints, TLS options), backoff and the reconnect catch-up bookkeeping. The protocol
itself is tested against a real etcd in tests/privileged/etcd/.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from pyfelix.agent.kinds import KIND_K8S_NETWORK_POLICY, KINDS
from pyfelix.agent.syncer.api import ResourceKey
from pyfelix.agent.syncer.backoff import Backoff
from pyfelix.agent.syncer.client import DatastoreURLError
from pyfelix.agent.syncer.etcd import _CatchUp
from pyfelix.agent.syncer.etcd_conn import EtcdConfig, prefix_end
from pyfelix.agent.syncer.etcd_keys import (
    ETCD_ROOT,
    EtcdKeyError,
    decode_value,
    encode_value,
    etcd_key,
    kind_prefix,
    parse_etcd_key,
)

GNP = {"apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
       "metadata": {"name": "deny"}, "spec": {"selector": "all()"}}


@pytest.mark.parametrize(("key", "path"), [
    (ResourceKey("GlobalNetworkPolicy", "", "deny"),
     "/calico/resources/v3/projectcalico.org/globalnetworkpolicies/deny"),
    (ResourceKey("NetworkPolicy", "shop", "allow-web"),
     "/calico/resources/v3/projectcalico.org/networkpolicies/shop/allow-web"),
    (ResourceKey("IPPool", "", "pool-1"), "/calico/resources/v3/projectcalico.org/ippools/pool-1"),
    (ResourceKey("BGPConfiguration", "", "default"),
     "/calico/resources/v3/projectcalico.org/bgpconfigurations/default"),
    (ResourceKey("Pod", "shop", "web-1"), "/calico/resources/v3/kubernetes/pods/shop/web-1"),
    (ResourceKey("Namespace", "", "shop"), "/calico/resources/v3/kubernetes/namespaces/shop"),
    (ResourceKey(KIND_K8S_NETWORK_POLICY, "shop", "web"),
     "/calico/resources/v3/kubernetes/kubernetesnetworkpolicies/shop/web"),
])
def test_layout_matches_calico_and_round_trips(key: ResourceKey, path: str) -> None:
    assert etcd_key(key) == path
    assert parse_etcd_key(path) == key


def test_every_client_kind_has_a_layout_that_round_trips() -> None:
    for info in KINDS:
        key = ResourceKey(info.kind, "ns" if info.namespaced else "", "name")
        assert parse_etcd_key(etcd_key(key)) == key
        assert etcd_key(key).startswith(kind_prefix(info.kind))


def test_keys_that_are_not_ours_are_skipped_and_malformed_ones_rejected() -> None:
    assert parse_etcd_key("/calico/ipam/v2/assignment/x") is None
    assert parse_etcd_key(ETCD_ROOT + "projectcalico.org/ipamconfigs/default") is None
    assert parse_etcd_key(ETCD_ROOT + "projectcalico.org") is None
    with pytest.raises(EtcdKeyError, match="<namespace>/<name>"):
        parse_etcd_key(ETCD_ROOT + "projectcalico.org/networkpolicies/just-a-name")
    with pytest.raises(EtcdKeyError, match="<name>"):
        parse_etcd_key(ETCD_ROOT + "projectcalico.org/globalnetworkpolicies/a/b")
    with pytest.raises(EtcdKeyError):
        parse_etcd_key(ETCD_ROOT + "projectcalico.org/globalnetworkpolicies/")


@pytest.mark.parametrize("name", ["a/b", "", ".", ".."])
def test_unusable_names_are_refused(name: str) -> None:
    with pytest.raises(EtcdKeyError, match=r"metadata\.name"):
        etcd_key(ResourceKey("GlobalNetworkPolicy", "", name))


def test_kind_prefix_narrows_to_a_namespace() -> None:
    assert kind_prefix("NetworkSet", "shop") == ETCD_ROOT + "projectcalico.org/networksets/shop/"
    assert kind_prefix("IPPool", "ignored") == ETCD_ROOT + "projectcalico.org/ippools/"
    with pytest.raises(EtcdKeyError, match="no etcd layout"):
        kind_prefix("Nonsense")


def test_values_decode_only_when_they_match_their_key() -> None:
    key = ResourceKey("GlobalNetworkPolicy", "", "deny")
    path = etcd_key(key)
    assert decode_value(path, key, encode_value(GNP)) == GNP
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        decode_value(path, key, b"\xff{")
    with pytest.raises(ValueError, match="JSON list, not an object"):
        decode_value(path, key, b"[]")
    with pytest.raises(ValueError, match="metadata"):
        decode_value(path, key, b'{"kind": "GlobalNetworkPolicy"}')
    other = ResourceKey("GlobalNetworkPolicy", "", "other")
    with pytest.raises(ValueError, match=r"names GlobalNetworkPolicy\(other\)"):
        decode_value(etcd_key(other), other, encode_value(GNP))


def test_prefix_end_is_the_first_key_after_the_prefix() -> None:
    assert prefix_end(b"/calico/") == b"/calico0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


def test_config_checks_endpoints_and_tls_options(tmp_path: Path) -> None:
    config = EtcdConfig.from_options(["127.0.0.1:2379", "h2:2380"], environ={})
    assert config.endpoints == ("127.0.0.1:2379", "h2:2380") and config.tls is None
    with pytest.raises(DatastoreURLError, match="not HOST:PORT"):
        EtcdConfig.from_options(["nohost"], environ={})
    with pytest.raises(DatastoreURLError, match="no endpoint"):
        EtcdConfig.from_options([], environ={})
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    with pytest.raises(DatastoreURLError, match="must be given together"):
        EtcdConfig.from_options(["h:1"], ca_cert=str(ca), cert_file=str(ca), environ={})
    with pytest.raises(DatastoreURLError, match=r"key_file '/missing' is not a readable"):
        EtcdConfig.from_options(["h:1"], ca_cert=str(ca), cert_file=str(ca),
                                key_file="/missing", environ={})
    with pytest.raises(DatastoreURLError, match="needs the CA"):
        EtcdConfig.from_options(["h:1"], cert_file=str(ca), key_file=str(ca), environ={})
    # Calico's environment variables fill in what the options leave out.
    from_env = EtcdConfig.from_options(["h:1"], environ={"ETCD_CA_CERT_FILE": str(ca)})
    assert from_env.tls is not None and from_env.tls.ca_cert == str(ca)
    assert from_env.description == "etcd3+tls://h:1"


def test_backoff_grows_with_jitter_caps_and_resets() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.2,
                      rng=random.Random(7))
    delays = [backoff.failed() for _ in range(8)]
    assert 0.08 <= delays[0] <= 0.12
    assert 0.16 <= delays[1] <= 0.24
    assert all(d <= 1.0 for d in delays) and delays[-1] >= 0.8
    assert backoff.failures == 8
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.failed() <= 0.12
    with pytest.raises(ValueError):
        Backoff(initial=0)


def test_catch_up_waits_for_every_changed_and_vanished_key() -> None:
    catch_up = _CatchUp({b"/a": 10, b"/b": 12}, {b"/gone"})
    assert not catch_up.done
    catch_up.observe(b"/a", 9)  # an older change of /a: not yet the one wanted
    assert not catch_up.done
    catch_up.observe(b"/a", 10)
    catch_up.observe(b"/gone", 11)  # its delete
    assert not catch_up.done
    catch_up.observe(b"/b", 12)
    assert catch_up.done
    assert _CatchUp({}, set()).done


def test_factories_build_from_url_parts_and_reject_bad_tls(tmp_path: Path) -> None:
    from pyfelix.agent.syncer.etcd import EtcdSyncer, make_etcd_syncer
    from pyfelix.agent.syncer.etcd_store import EtcdDatastore, open_etcd_datastore

    syncer = make_etcd_syncer(["127.0.0.1:2379", "127.0.0.1:22379"], page_size=10)
    assert isinstance(syncer, EtcdSyncer)
    assert syncer.config.endpoints == ("127.0.0.1:2379", "127.0.0.1:22379")
    store = open_etcd_datastore(["127.0.0.1:2379"])
    assert isinstance(store, EtcdDatastore)
    assert store.description == "etcd3 datastore etcd3://127.0.0.1:2379"
    with pytest.raises(DatastoreURLError, match="ca_cert '/nope'"):
        make_etcd_syncer(["h:1"], ca_cert="/nope")


def test_watch_streams_require_a_leader() -> None:
    """Every watch carries etcd's require-leader metadata, so a member cut off from its
    quorum ends the stream instead of holding it idle (the cluster test shows why)."""
    from pyfelix.agent.syncer.etcd_conn import WatchStream

    class FakeCall:
        def __iter__(self) -> Any:
            return iter(())

        def cancel(self) -> None:
            pass

    class FakeStub:
        metadata: Any = None

        def Watch(self, requests: Any, metadata: Any = None) -> FakeCall:
            FakeStub.metadata = metadata
            return FakeCall()

    stream = WatchStream(FakeStub(), "fake:1", b"/calico/", b"/calico0", 1)
    stream.close()
    assert ("hasleader", "true") in (FakeStub.metadata or ())

"""TLS between Typha and its clients: CA verification and CN / URI SAN checks both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from typha_certs import NODE_CN, NODE_URI, PKI, SERVER_CN, SERVER_URI, Pair, make_pki
from typha_testlib import FileStore, gnp

from pyfelix.agent.typha.tls import ClientTLS, ServerTLS, TLSConfigError, client_tls_from_env


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("typha-pki"))


def _server_tls(pki: PKI, **identity: str) -> ServerTLS:
    return ServerTLS(pki.ca, pki.server.cert, pki.server.key, **identity)


def _client_tls(pki: PKI, pair: Pair, ca: str | None = None, **identity: str) -> ClientTLS:
    identity = identity or {"server_cn": SERVER_CN}
    return ClientTLS(ca or pki.ca, pair.cert, pair.key, **identity)


def test_node_certificate_is_served(pki: PKI, store: FileStore, start_server,
                                    start_client) -> None:
    store.put(gnp("a"))
    server = start_server(tls=_server_tls(pki, client_cn=NODE_CN))
    _, rec = start_client(server.address, tls=_client_tls(pki, pki.node))
    rec.wait_converged(store.expected())


def test_uri_san_identities_both_ways(pki: PKI, store: FileStore, start_server,
                                      start_client) -> None:
    store.put(gnp("a"))
    server = start_server(tls=_server_tls(pki, client_uri_san=NODE_URI))
    _, rec = start_client(server.address,
                          tls=_client_tls(pki, pki.node, server_uri_san=SERVER_URI))
    rec.wait_converged(store.expected())


def test_wrong_client_identity_is_refused_with_a_reason(pki: PKI, store: FileStore,
                                                        start_server, start_client) -> None:
    server = start_server(tls=_server_tls(pki, client_cn=NODE_CN, client_uri_san=NODE_URI))
    client, rec = start_client(server.address, tls=_client_tls(pki, pki.intruder),
                               retry_initial=0.01)
    assert client.failed.wait(15)
    assert client.sessions == 0
    assert ("not-authorized: the client certificate (CN ['intruder'], URI SANs none) does "
            f"not carry CN '{NODE_CN}' or URI SAN '{NODE_URI}'") in rec.errors[0].message


def test_certificate_from_another_ca_fails_the_handshake(pki: PKI, store: FileStore,
                                                         start_server, start_client) -> None:
    server = start_server(tls=_server_tls(pki, client_cn=NODE_CN))
    client, rec = start_client(server.address, tls=_client_tls(pki, pki.impostor),
                               retry_initial=0.01)
    assert client.failed.wait(15)
    assert client.sessions == 0
    assert "after 6 attempts" in rec.errors[0].message


def test_client_refuses_a_server_without_the_expected_identity(pki: PKI, store: FileStore,
                                                               start_server,
                                                               start_client) -> None:
    server = start_server(tls=_server_tls(pki, client_cn=NODE_CN))
    client, rec = start_client(server.address,
                               tls=_client_tls(pki, pki.node, server_cn="someone-else"),
                               retry_initial=0.01)
    assert client.failed.wait(15)
    assert (f"the server certificate (CN ['{SERVER_CN}'], URI SANs ['{SERVER_URI}']) does not "
            "carry CN 'someone-else'") in rec.errors[0].message


def test_plain_client_cannot_talk_to_a_tls_server(pki: PKI, store: FileStore, start_server,
                                                  start_client) -> None:
    server = start_server(tls=_server_tls(pki, client_cn=NODE_CN))
    client, _ = start_client(server.address, retry_initial=0.01, connect_timeout=1.0)
    assert client.failed.wait(20)
    assert client.sessions == 0


def test_tls_settings_are_checked_with_clear_errors(pki: PKI, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match="needs --client-cn or --client-uri-san"):
        _server_tls(pki).validate()
    with pytest.raises(TLSConfigError, match=r"--cert-file: /nonexistent\.crt does not exist"):
        ServerTLS(pki.ca, "/nonexistent.crt", pki.server.key, client_cn="x").validate()
    with pytest.raises(TLSConfigError, match="given but --cert-file, --key-file missing"):
        ServerTLS(pki.ca, "", "", client_cn="x").validate()
    with pytest.raises(TLSConfigError, match="needs FELIX_TYPHACN or FELIX_TYPHAURISAN"):
        client_tls_from_env({"FELIX_TYPHACAFILE": pki.ca, "FELIX_TYPHACERTFILE": pki.node.cert,
                             "FELIX_TYPHAKEYFILE": pki.node.key})
    assert client_tls_from_env({}) is None
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TLSConfigError, match="cannot load CA certificates from"):
        ServerTLS(str(garbage), pki.server.cert, pki.server.key, client_cn="x").context()
    with pytest.raises(TLSConfigError, match="cannot load the certificate"):
        ServerTLS(pki.ca, pki.server.cert, pki.node.key, client_cn="x").context()

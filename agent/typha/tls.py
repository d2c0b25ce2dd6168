"""TLS for Typha connections: SSL contexts and the peer identity checks (CN / URI SAN).

Role: build the server's and the client's `ssl.SSLContext` from file paths, and decide
whether a verified peer certificate names the expected identity, as Calico does:

- server (`pyfelix typha --ca-file --cert-file --key-file --client-cn --client-uri-san`):
  clients must present a certificate signed by the CA, whose subject common name equals
  `client_cn` OR which carries the URI subject alternative name `client_uri_san`;
- client (`FELIX_TYPHACAFILE`, `FELIX_TYPHACERTFILE`, `FELIX_TYPHAKEYFILE`, `FELIX_TYPHACN`,
  `FELIX_TYPHAURISAN`): the server's certificate must be signed by the CA and match the
  expected CN or URI SAN. Host names are not checked (Typha is reached by pod IP).

Invariants: a TLS configuration needs all three files and at least one identity to check
(a CA that signs many certificates is not enough on its own); every problem raises
`TLSConfigError` naming the setting and the file.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any


class TLSConfigError(ValueError):
    """TLS settings that cannot work (missing file, no identity to check, unreadable key)."""


def _check_files(settings: dict[str, str | None]) -> None:
    missing = [name for name, path in settings.items() if not path]
    if missing and len(missing) < len(settings):
        given = [name for name in settings if name not in missing]
        raise TLSConfigError(f"TLS needs {', '.join(settings)} together: {', '.join(given)} "
                             f"given but {', '.join(missing)} missing")
    for name, path in settings.items():
        if path and not os.path.isfile(path):
            raise TLSConfigError(f"{name}: {path} does not exist or is not a file")


def _load(context: ssl.SSLContext, ca_file: str, cert_file: str, key_file: str,
          names: tuple[str, str, str]) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"{names[0]}: cannot load CA certificates from {ca_file}: "
                             f"{exc}") from exc
    try:
        context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"{names[1]}/{names[2]}: cannot load the certificate {cert_file} "
                             f"with key {key_file}: {exc}") from exc


@dataclass(frozen=True)
class ServerTLS:
    ca_file: str
    cert_file: str
    key_file: str
    client_cn: str | None = None
    client_uri_san: str | None = None

    FLAG_NAMES = ("--ca-file", "--cert-file", "--key-file")

    def validate(self) -> None:
        _check_files(dict(zip(self.FLAG_NAMES, (self.ca_file, self.cert_file, self.key_file),
                              strict=True)))
        if not self.client_cn and not self.client_uri_san:
            raise TLSConfigError("TLS needs --client-cn or --client-uri-san (or both): the "
                                 "identity a client certificate must carry")

    def context(self) -> ssl.SSLContext:
        self.validate()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        _load(context, self.ca_file, self.cert_file, self.key_file, self.FLAG_NAMES)
        return context

    def refusal(self, peer_cert: dict[str, Any] | None) -> str | None:
        """None if the client certificate is acceptable, else why not."""
        return identity_mismatch(peer_cert, self.client_cn, self.client_uri_san, "client")


@dataclass(frozen=True)
class ClientTLS:
    ca_file: str
    cert_file: str
    key_file: str
    server_cn: str | None = None
    server_uri_san: str | None = None

    SETTING_NAMES = ("FELIX_TYPHACAFILE", "FELIX_TYPHACERTFILE", "FELIX_TYPHAKEYFILE")

    def validate(self) -> None:
        _check_files(dict(zip(self.SETTING_NAMES, (self.ca_file, self.cert_file,
                                                   self.key_file), strict=True)))
        if not self.server_cn and not self.server_uri_san:
            raise TLSConfigError("Typha TLS needs FELIX_TYPHACN or FELIX_TYPHAURISAN (or "
                                 "both): the identity the server certificate must carry")

    def context(self) -> ssl.SSLContext:
        self.validate()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False  # identity is checked by CN / URI SAN instead
        context.verify_mode = ssl.CERT_REQUIRED
        _load(context, self.ca_file, self.cert_file, self.key_file, self.SETTING_NAMES)
        return context

    def refusal(self, peer_cert: dict[str, Any] | None) -> str | None:
        return identity_mismatch(peer_cert, self.server_cn, self.server_uri_san, "server")


def client_tls_from_env(env: dict[str, str] | os._Environ[str]) -> ClientTLS | None:
    """The client's TLS settings from FELIX_TYPHA* variables; None when none is set."""
    ca, cert, key = (env.get(name, "") for name in ClientTLS.SETTING_NAMES)
    cn = env.get("FELIX_TYPHACN") or None
    uri_san = env.get("FELIX_TYPHAURISAN") or None
    if not (ca or cert or key or cn or uri_san):
        return None
    tls = ClientTLS(ca, cert, key, cn, uri_san)
    tls.validate()
    return tls


def certificate_identity(peer_cert: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(common names, URI SANs) of a certificate as `SSLSocket.getpeercert()` returns it."""
    common_names = [value for rdn in peer_cert.get("subject", ()) for key, value in rdn
                    if key == "commonName"]
    uri_sans = [value for key, value in peer_cert.get("subjectAltName", ()) if key == "URI"]
    return common_names, uri_sans


def identity_mismatch(peer_cert: dict[str, Any] | None, expected_cn: str | None,
                      expected_uri_san: str | None, role: str) -> str | None:
    if not peer_cert:
        return f"the {role} presented no certificate"
    common_names, uri_sans = certificate_identity(peer_cert)
    if expected_cn and expected_cn in common_names:
        return None
    if expected_uri_san and expected_uri_san in uri_sans:
        return None
    wanted = " or ".join(part for part in (
        f"CN {expected_cn!r}" if expected_cn else "",
        f"URI SAN {expected_uri_san!r}" if expected_uri_san else "") if part)
    return (f"the {role} certificate (CN {common_names or 'none'}, URI SANs "
            f"{uri_sans or 'none'}) does not carry {wanted}")

"""Throwaway certificates for the Typha TLS tests, made with the `openssl` command.

One CA signs: the server (CN pyfelix-typha, URI SAN spiffe://test/typha), a node client
(CN pyfelix-node, URI SAN spiffe://test/node) and an intruder (CN intruder). A second CA
signs an impostor with the node's CN. EC P-256 keys: quick to make.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_CN = "pyfelix-typha"
SERVER_URI = "spiffe://test/typha"
NODE_CN = "pyfelix-node"
NODE_URI = "spiffe://test/node"


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclass(frozen=True)
class PKI:
    ca: str
    other_ca: str
    server: Pair
    node: Pair
    intruder: Pair
    impostor: Pair  # node's CN, signed by the other CA


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[str, str]:
    key, cert = str(directory / f"{name}.key"), str(directory / f"{name}.crt")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", key, "-out", cert)
    return cert, key


def _leaf(directory: Path, name: str, cn: str, ca: tuple[str, str], extensions: str) -> Pair:
    key, csr, cert = (str(directory / f"{name}.{ext}") for ext in ("key", "csr", "crt"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={cn}", "-keyout", key, "-out", csr)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-days", "1", "-extfile", str(ext_file), "-out", cert)
    return Pair(cert, key)


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "typha-ca")
    other = _ca(directory, "other-ca")
    client_usage = "extendedKeyUsage=clientAuth\n"
    return PKI(
        ca=ca[0], other_ca=other[0],
        server=_leaf(directory, "server", SERVER_CN, ca,
                     f"subjectAltName=URI:{SERVER_URI},IP:127.0.0.1\n"
                     "extendedKeyUsage=serverAuth\n"),
        node=_leaf(directory, "node", NODE_CN, ca,
                   f"subjectAltName=URI:{NODE_URI}\n{client_usage}"),
        intruder=_leaf(directory, "intruder", "intruder", ca, client_usage),
        impostor=_leaf(directory, "impostor", NODE_CN, other, client_usage),
    )

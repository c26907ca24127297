"""TLS of the dev cluster (`quorumlog dev up --tls`): the certificates under the dev
directory, the node flags that use them, and the exports that point the command at them.

Every process of the dev cluster shares one node certificate (it names 127.0.0.1 and
localhost, where they all listen) and requires a certificate of clients and peers alike,
as a production cluster would; the command gets the client certificate.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from quorumlog.tls.config import TLSConfig

TLS_DIRECTORY = "tls"
CLIENT_ENVIRONMENT = {
    "ca_file": "QUORUMLOG_CACERT",
    "cert_file": "QUORUMLOG_CERT",
    "key_file": "QUORUMLOG_KEY",
}


class DevTLS(msgspec.Struct, frozen=True):
    node_arguments: list[str]
    """The `quorumlog node` / `quorumlog bookie` flags."""
    client_files: dict[str, str]
    """ca_file, cert_file and key_file of the client certificate (kept in the dev state)."""


def dev_tls(base: Path) -> DevTLS:
    """A fresh CA and certificates in `base/tls` (each `dev up` makes new ones)."""
    from quorumlog.tls.certificates import make_dev_certificates

    made = make_dev_certificates(base / TLS_DIRECTORY)
    node = made.node
    arguments = [
        *("--cert-file", node.cert_file, "--key-file", node.key_file),
        *("--trusted-ca-file", made.ca_file, "--client-cert-auth"),
        *("--peer-cert-file", node.cert_file, "--peer-key-file", node.key_file),
        *("--peer-trusted-ca-file", made.ca_file, "--peer-client-cert-auth"),
    ]
    files = {
        "ca_file": made.ca_file,
        "cert_file": made.client.cert_file,
        "key_file": made.client.key_file,
    }
    return DevTLS(arguments, files)


def state_tls(state: dict[str, object]) -> TLSConfig | None:
    """The client TLS settings a dev state records (None: the cluster is plaintext)."""
    files = state.get("tls")
    if not isinstance(files, dict):
        return None
    return TLSConfig(
        ca_file=str(files["ca_file"]),
        cert_file=str(files["cert_file"]),
        key_file=str(files["key_file"]),
    )


def tls_exports(state: dict[str, object]) -> list[str]:
    """`export QUORUMLOG_CACERT=...` lines for a TLS dev cluster (none for plaintext)."""
    files = state.get("tls")
    if not isinstance(files, dict):
        return []
    return [f"export {CLIENT_ENVIRONMENT[name]}={files[name]}" for name in CLIENT_ENVIRONMENT]


__all__ = ["DevTLS", "dev_tls", "state_tls", "tls_exports"]

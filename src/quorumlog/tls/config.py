"""TLS settings: `TLSConfig` for clients, `NodeTLS` for a node, and their `ssl` contexts.

A node has one listener for peers and clients (runtime/transport.py), so it presents one
certificate to both: `--cert-file` (or `--peer-cert-file` when only that is given). It
trusts, for certificates presented to it, `--trusted-ca-file` and `--peer-trusted-ca-file`
together; whether a connection is a peer is known only from its first frame, so the rules
that hold for peers alone (`--peer-client-cert-auth`: the peer CA signed it,
`--peer-cert-allowed-cn`) are checked then (tls/handshake.py `check_peer_certificate`).
When a node dials — a peer link, or as a client of the cluster (bookie links, metadata
writes, shard pulls) — it presents `--peer-cert-file` (else `--cert-file`) and verifies
the other node against `--peer-trusted-ca-file` (else `--trusted-ca-file`), host name
included: certificates name the addresses their node is reached at.

Contexts are built once per settings value and cached: loading a CA and a key pair costs
milliseconds, and clients open connections often (each reconnect, each new client).
"""

from __future__ import annotations

import functools
import ssl

import msgspec

TLS_VERSION_MIN = ssl.TLSVersion.TLSv1_2


class TLSConfig(msgspec.Struct, frozen=True):
    """How a client talks TLS to the cluster.

    `ca_file`: PEM of the CA(s) that signed the nodes' certificates (None: the system's
    trusted CAs). `cert_file`, `key_file`: this client's certificate and key, for nodes
    that require one (`--client-cert-auth`). `server_hostname`: the name to check the
    node's certificate against (None: the host of the endpoint dialled). Host names are
    checked unless `check_hostname=False` is given (the chain is verified either way).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLSConfig: cert_file and key_file go together (give both or none)")


class NodeTLS(msgspec.Struct, frozen=True):
    """A node's TLS flags, with etcd's names (empty: not given). See the module docstring."""

    cert_file: str = ""
    key_file: str = ""
    trusted_ca_file: str = ""
    client_cert_auth: bool = False
    """Clients must present a certificate signed by a trusted CA."""
    peer_cert_file: str = ""
    peer_key_file: str = ""
    peer_trusted_ca_file: str = ""
    peer_client_cert_auth: bool = False
    """Peers must present a certificate signed by the peer CA."""
    peer_cert_allowed_cn: str = ""
    """With `peer_client_cert_auth`: a peer's certificate must carry this common name."""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.peer_cert_file)

    def validate(self) -> None:
        """ValueError naming the flags that do not fit together."""
        pairs = (
            ("--cert-file", self.cert_file, "--key-file", self.key_file),
            ("--peer-cert-file", self.peer_cert_file, "--peer-key-file", self.peer_key_file),
        )
        for cert_flag, cert, key_flag, key in pairs:
            if bool(cert) != bool(key):
                raise ValueError(f"{cert_flag} and {key_flag} go together")
        if self.client_cert_auth and not self.trusted_ca_file:
            raise ValueError("--client-cert-auth needs --trusted-ca-file")
        if self.peer_client_cert_auth and not self.peer_ca_file:
            raise ValueError("--peer-client-cert-auth needs --peer-trusted-ca-file")
        if self.peer_cert_allowed_cn and not self.peer_client_cert_auth:
            raise ValueError("--peer-cert-allowed-cn needs --peer-client-cert-auth")
        has_any = self.trusted_ca_file or self.peer_trusted_ca_file or self.client_cert_auth
        if has_any and not self.enabled:
            raise ValueError("TLS flags need a certificate: --cert-file or --peer-cert-file")
        if self.enabled and not self.peer_ca_file:
            # Nodes dial each other (and themselves, as clients): they must verify whom.
            raise ValueError(
                "with TLS on, nodes verify each other: give --peer-trusted-ca-file "
                "(or --trusted-ca-file)"
            )

    @property
    def peer_ca_file(self) -> str:
        return self.peer_trusted_ca_file or self.trusted_ca_file

    def server_certificate(self) -> tuple[str, str]:
        if self.cert_file:
            return self.cert_file, self.key_file
        return self.peer_cert_file, self.peer_key_file

    def dialing_tls(self) -> TLSConfig | None:
        """What this node uses when it dials another node (as a peer or as a client)."""
        if not self.enabled:
            return None
        cert_file, key_file = (
            (self.peer_cert_file, self.peer_key_file)
            if self.peer_cert_file
            else (self.cert_file, self.key_file)
        )
        return TLSConfig(ca_file=self.peer_ca_file, cert_file=cert_file, key_file=key_file)


@functools.lru_cache(maxsize=64)
def client_context(config: TLSConfig) -> ssl.SSLContext:
    """The context a client (or a dialling node) wraps its connections in."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_VERSION_MIN
    if config.ca_file is not None:
        context.load_verify_locations(cafile=config.ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if config.cert_file is not None and config.key_file is not None:
        context.load_cert_chain(config.cert_file, config.key_file)
    context.check_hostname = config.check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    return context


@functools.lru_cache(maxsize=8)
def server_context(node: NodeTLS) -> ssl.SSLContext:
    """The context of a node's listener (see the module docstring for what it trusts)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSION_MIN
    cert_file, key_file = node.server_certificate()
    context.load_cert_chain(cert_file, key_file)
    for ca_file in sorted({node.trusted_ca_file, node.peer_trusted_ca_file} - {""}):
        context.load_verify_locations(cafile=ca_file)
    if node.client_cert_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    elif node.peer_client_cert_auth:
        # Ask for a certificate and verify one that is given: peers are held to theirs
        # once they say they are peers (their first frame); clients may come without.
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def server_hostname_for(config: TLSConfig, host: str) -> str:
    return config.server_hostname or host


__all__ = [
    "TLS_VERSION_MIN",
    "NodeTLS",
    "TLSConfig",
    "client_context",
    "server_context",
    "server_hostname_for",
]

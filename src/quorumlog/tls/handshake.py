"""Opening TLS connections, handshake failures as `TLSHandshakeError`, and the checks a
node makes of a peer's certificate.

A client's handshake is not over when `do_handshake` returns: with TLS 1.3 the node checks
the client's certificate after the client has finished, and when it refuses it the
connection just closes (asyncio drops the alert). So a TLS client whose connection closes
before the node's `Welcome` raises `TLSHandshakeError` (`closed_after_handshake_error`).
A plaintext client of a TLS node gets a plaintext `Refused` with `TLS_REQUIRED_REASON`.

`cryptography` is imported only where a certificate is inspected (a node checking a
peer), so importing a client does not load it.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from quorumlog.errors import TLSHandshakeError
from quorumlog.tls.config import NodeTLS, TLSConfig, client_context, server_hostname_for

if TYPE_CHECKING:
    from cryptography import x509

ProtocolType = TypeVar("ProtocolType", bound=asyncio.BaseProtocol)

TLS_REQUIRED_REASON = "this node requires TLS"
"""The reason of the `Refused` frame a TLS node sends, in plaintext, to a plaintext client
(clients raise `TLSHandshakeError` for it)."""

TLS_RECORD_TYPES = frozenset({0x15, 0x16})
"""The first byte of a TLS record (handshake, alert): a TLS client's first byte. Our
frames start with a 4-byte big-endian length, which never starts that high."""

_REASONS = {
    "WRONG_VERSION_NUMBER": "the other side does not speak TLS (is it a plaintext node?)",
    "HTTP_REQUEST": "the other side does not speak TLS",
    "UNKNOWN_CA": "the node does not trust our certificate (signed by a CA it does not know)",
    "TLSV1_ALERT_UNKNOWN_CA": "the node does not trust our certificate (unknown CA)",
    "CERTIFICATE_REQUIRED": "the node requires a client certificate and we gave none",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the node requires a client certificate",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no certificate was presented",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the node refused our certificate",
}


def describe_handshake_error(error: BaseException) -> str:
    """What failed, in words a user can act on."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"the node's certificate is not trusted: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        reason = getattr(error, "reason", None)
        explained = _REASONS.get(str(reason)) if reason else None
        return f"{explained} ({reason})" if explained else f"TLS error: {error}"
    if isinstance(error, TimeoutError):
        return "the TLS handshake did not finish in time"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def handshake_error(endpoint: str, error: BaseException) -> TLSHandshakeError:
    return TLSHandshakeError(
        f"TLS handshake with {endpoint} failed: {describe_handshake_error(error)}"
    )


def plaintext_to_tls_error(endpoint: str) -> TLSHandshakeError:
    return TLSHandshakeError(
        f"{endpoint} speaks TLS and this client does not: give tls=TLSConfig(ca_file=...) "
        "(the command: --cacert or QUORUMLOG_CACERT)"
    )


def closed_after_handshake_error(endpoint: str) -> TLSHandshakeError:
    return TLSHandshakeError(
        f"{endpoint} closed the connection right after the TLS handshake: it did not "
        "accept this client's certificate (none given, or signed by a CA it does not trust)"
    )


# --- opening connections -----------------------------------------------------------------


def open_blocking(
    host: str, port: int, tls: TLSConfig | None, timeout_seconds: float, endpoint: str
) -> socket.socket:
    """A connected socket (wrapped in TLS after a finished handshake, with `tls`)."""
    sock = socket.create_connection((host, port), timeout=timeout_seconds)
    if tls is None:
        return sock
    try:
        return client_context(tls).wrap_socket(sock, server_hostname=server_hostname_for(tls, host))
    except ssl.SSLError as error:
        sock.close()
        raise handshake_error(endpoint, error) from error
    except ssl.CertificateError as error:  # pragma: no cover - an SSLError since 3.7
        sock.close()
        raise handshake_error(endpoint, error) from error


async def open_stream(
    host: str, port: int, tls: TLSConfig | None, endpoint: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio streams to `host:port`, over TLS with `tls`."""
    if tls is None:
        return await asyncio.open_connection(host, port)
    try:
        return await asyncio.open_connection(
            host, port, ssl=client_context(tls), server_hostname=server_hostname_for(tls, host)
        )
    except ssl.SSLError as error:
        raise handshake_error(endpoint, error) from error


async def create_connection(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], ProtocolType],
    host: str,
    port: int,
    tls: TLSConfig | None,
) -> tuple[asyncio.BaseTransport, ProtocolType]:
    """`loop.create_connection`, over TLS with `tls`; an `ssl.SSLError` (an OSError) is
    left to the caller, who retries or reports as its links do."""
    if tls is None:
        return await loop.create_connection(protocol_factory, host, port)
    return await loop.create_connection(
        protocol_factory,
        host,
        port,
        ssl=client_context(tls),
        server_hostname=server_hostname_for(tls, host),
    )


# --- what a node checks ------------------------------------------------------------------


def peer_certificate(transport: asyncio.BaseTransport) -> bytes | None:
    """The DER certificate the other end presented, if it is a TLS connection with one."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    certificate: bytes | None = ssl_object.getpeercert(binary_form=True)
    return certificate


def common_name(certificate_der: bytes) -> str | None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    certificate = x509.load_der_x509_certificate(certificate_der)
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        return None
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def peer_common_name(transport: asyncio.BaseTransport) -> str | None:
    """The common name of the certificate the other end presented (None: no TLS or no
    certificate). For authentication by certificate (`--client-cert-auth`)."""
    certificate = peer_certificate(transport)
    return common_name(certificate) if certificate is not None else None


def check_peer_certificate(transport: asyncio.BaseTransport, node: NodeTLS) -> str | None:
    """Why a connection that says it is a peer may not be one (None: it may). With
    `--peer-client-cert-auth` it must have presented a certificate (the handshake
    verified the chain) signed by the peer CA, with `--peer-cert-allowed-cn` as its CN."""
    if not node.peer_client_cert_auth:
        return None
    certificate = peer_certificate(transport)
    if certificate is None:
        return "a peer must present a certificate (--peer-client-cert-auth)"
    # The handshake trusted the client CA as well: make sure the peer CA signed it.
    other_ca = node.trusted_ca_file and node.trusted_ca_file != node.peer_ca_file
    if other_ca and not issued_by_any(certificate, node.peer_ca_file):
        return "the peer's certificate is not signed by the peer CA"
    if node.peer_cert_allowed_cn:
        name = common_name(certificate)
        if name != node.peer_cert_allowed_cn:
            return (
                f"the peer's certificate CN is {name!r}, not the allowed "
                f"{node.peer_cert_allowed_cn!r}"
            )
    return None


@functools.lru_cache(maxsize=8)
def load_certificates(path: str) -> tuple[x509.Certificate, ...]:
    from cryptography import x509

    with open(path, "rb") as file:
        return tuple(x509.load_pem_x509_certificates(file.read()))


def issued_by_any(certificate_der: bytes, ca_file: str) -> bool:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    certificate = x509.load_der_x509_certificate(certificate_der)
    for authority in load_certificates(ca_file):
        try:
            certificate.verify_directly_issued_by(authority)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


__all__ = [
    "check_peer_certificate",
    "closed_after_handshake_error",
    "create_connection",
    "describe_handshake_error",
    "handshake_error",
    "open_blocking",
    "open_stream",
    "peer_common_name",
    "plaintext_to_tls_error",
]

"""Throwaway certificates: a CA and certificates it signs, as PEM files.

For `quorumlog dev up --tls` and tests, not for production (keys are written unencrypted,
readable by the owner only). Keys are ECDSA P-256: quick to make and quick to handshake.
Node certificates serve both ends of a connection (server and client authentication),
as a node both listens and dials; they name the addresses the node is reached at
(subject alternative names), so clients can check host names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY_DAYS_DEFAULT = 30
LOCAL_HOSTS = ("127.0.0.1", "localhost")
CLOCK_SKEW_SECONDS = 300
"""Certificates start this long before now, so a peer whose clock is a little behind
accepts them."""


class KeyPair(msgspec.Struct, frozen=True):
    """Where a certificate and its private key were written."""

    cert_file: str
    key_file: str


class CertificateAuthority:
    """A CA whose key stays in memory to sign more certificates; its certificate is on disk."""

    def __init__(
        self, directory: Path, name: str, validity_days: int = VALIDITY_DAYS_DEFAULT
    ) -> None:
        self.directory = directory
        self.validity_days = validity_days
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = validity(x509.CertificateBuilder(), validity_days)
        self.certificate = (
            builder.subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_file = str(directory / f"{name}.pem")
        write_file(self.cert_file, self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, common_name: str, hosts: tuple[str, ...] = LOCAL_HOSTS) -> KeyPair:
        """A certificate for `common_name` naming `hosts` (IP addresses or DNS names),
        good for both server and client authentication; written as `name`.pem and
        `name`-key.pem next to the CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = validity(x509.CertificateBuilder(), self.validity_days)
        certificate = (
            builder.subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(alternative_names(hosts)), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        pair = KeyPair(
            cert_file=str(self.directory / f"{name}.pem"),
            key_file=str(self.directory / f"{name}-key.pem"),
        )
        write_file(pair.cert_file, certificate.public_bytes(serialization.Encoding.PEM))
        write_file(
            pair.key_file,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            private=True,
        )
        return pair


def validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(
        now - datetime.timedelta(seconds=CLOCK_SKEW_SECONDS)
    ).not_valid_after(now + datetime.timedelta(days=days))


def alternative_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def write_file(path: str, data: bytes, private: bool = False) -> None:
    mode = 0o600 if private else 0o644
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


class DevCertificates(msgspec.Struct, frozen=True):
    """What `dev up --tls` makes: one CA, a certificate the nodes share, one for clients."""

    ca_file: str
    node: KeyPair
    client: KeyPair


def make_dev_certificates(directory: Path, hosts: tuple[str, ...] = LOCAL_HOSTS) -> DevCertificates:
    """A fresh CA in `directory` and the node and client certificates it signs."""
    authority = CertificateAuthority(directory, "ca")
    return DevCertificates(
        ca_file=authority.cert_file,
        node=authority.issue("node", "quorumlog-node", hosts),
        client=authority.issue("client", "quorumlog-client", hosts),
    )


__all__ = [
    "CertificateAuthority",
    "DevCertificates",
    "KeyPair",
    "make_dev_certificates",
]

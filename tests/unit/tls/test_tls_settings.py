"""TLS settings, contexts and certificates without a network: what each flag combination
means, what the certificate maker writes, and how handshake failures are described."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from quorumlog.cli.tls_options import client_tls
from quorumlog.errors import TLSHandshakeError
from quorumlog.spark.errors import OptionError
from quorumlog.spark.options import SOURCE_OPTIONS, Options, parse_connection
from quorumlog.tls.certificates import CertificateAuthority, make_dev_certificates
from quorumlog.tls.config import NodeTLS, TLSConfig, client_context, server_context
from quorumlog.tls.handshake import describe_handshake_error, open_blocking


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("ca"), "ca")


def full_node(ca_file: str, cert_file: str, key_file: str) -> NodeTLS:
    return NodeTLS(
        cert_file=cert_file,
        key_file=key_file,
        trusted_ca_file=ca_file,
        client_cert_auth=True,
        peer_client_cert_auth=True,
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (NodeTLS(cert_file="c.pem"), "--cert-file and --key-file go together"),
        (NodeTLS(peer_key_file="k.pem"), "--peer-cert-file and --peer-key-file"),
        (
            NodeTLS(cert_file="c", key_file="k", peer_trusted_ca_file="ca", client_cert_auth=True),
            "--client-cert-auth needs --trusted-ca-file",
        ),
        (NodeTLS(cert_file="c", key_file="k"), "nodes verify each other"),
        (NodeTLS(trusted_ca_file="ca"), "need a certificate"),
        (
            NodeTLS(cert_file="c", key_file="k", trusted_ca_file="ca", peer_cert_allowed_cn="n"),
            "--peer-cert-allowed-cn needs --peer-client-cert-auth",
        ),
    ],
)
def test_node_flags_that_do_not_fit_together_are_named(settings: NodeTLS, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.validate()


def test_no_flags_mean_no_tls() -> None:
    NodeTLS().validate()
    assert not NodeTLS().enabled
    assert NodeTLS().dialing_tls() is None


def test_a_node_dials_with_its_peer_certificate_and_the_peer_ca() -> None:
    settings = NodeTLS(
        cert_file="client-side.pem",
        key_file="client-side-key.pem",
        trusted_ca_file="clients-ca.pem",
        peer_cert_file="peer.pem",
        peer_key_file="peer-key.pem",
        peer_trusted_ca_file="peers-ca.pem",
    )
    settings.validate()
    assert settings.dialing_tls() == TLSConfig(
        ca_file="peers-ca.pem", cert_file="peer.pem", key_file="peer-key.pem"
    )
    assert settings.server_certificate() == ("client-side.pem", "client-side-key.pem")


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        TLSConfig(ca_file="ca.pem", cert_file="me.pem")


def test_the_dev_certificates_name_the_local_addresses_and_serve_both_ends(
    tmp_path: Path,
) -> None:
    made = make_dev_certificates(tmp_path)
    node = x509.load_pem_x509_certificate(Path(made.node.cert_file).read_bytes())
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {usage._name for usage in usages} == {"serverAuth", "clientAuth"}
    assert node.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "quorumlog-node"
    ca = x509.load_pem_x509_certificate(Path(made.ca_file).read_bytes())
    node.verify_directly_issued_by(ca)
    assert Path(made.node.key_file).stat().st_mode & 0o077 == 0  # the key is private


def test_contexts_hold_tls_1_2_at_least_and_check_host_names(
    authority: CertificateAuthority,
) -> None:
    pair = authority.issue("server", "server")
    server = server_context(full_node(authority.cert_file, pair.cert_file, pair.key_file))
    client = client_context(TLSConfig(ca_file=authority.cert_file))
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname
    opted_out = client_context(TLSConfig(ca_file=authority.cert_file, check_hostname=False))
    assert not opted_out.check_hostname
    assert opted_out.verify_mode == ssl.CERT_REQUIRED  # the chain is verified regardless


def test_a_blocking_handshake_failure_is_a_typed_error_that_says_why(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    pair = authority.issue("server", "server")
    context = server_context(full_node(authority.cert_file, pair.cert_file, pair.key_file))
    stranger = CertificateAuthority(tmp_path / "stranger", "stranger")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve_one() -> None:
            accepted, _ = listener.accept()
            with accepted, pytest.raises(ssl.SSLError):
                context.wrap_socket(accepted, server_side=True)

        server = threading.Thread(target=serve_one)
        server.start()
        with pytest.raises(TLSHandshakeError, match="the node's certificate is not trusted"):
            open_blocking(
                "127.0.0.1", port, TLSConfig(ca_file=stranger.cert_file), 5.0, "the-endpoint"
            )
        server.join(timeout=10)


def test_handshake_errors_are_described_in_words() -> None:
    assert "did not finish in time" in describe_handshake_error(TimeoutError())
    plaintext = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    plaintext.reason = "WRONG_VERSION_NUMBER"  # type: ignore[misc]
    assert "does not speak TLS" in describe_handshake_error(plaintext)


def test_the_command_builds_tls_from_its_options() -> None:
    assert client_tls(None, None, None) is None
    assert client_tls("ca.pem", None, None) == TLSConfig(ca_file="ca.pem")
    assert client_tls("ca.pem", "me.pem", "me-key.pem", skip_hostname_check=True) == TLSConfig(
        ca_file="ca.pem", cert_file="me.pem", key_file="me-key.pem", check_hostname=False
    )


def test_spark_tls_options(tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("pem")
    given = {"endpoints": "127.0.0.1:2379", "tls.caFile": str(ca_file)}
    connection = parse_connection(Options(given, SOURCE_OPTIONS, "spark.read"))
    assert connection.tls == TLSConfig(ca_file=str(ca_file))
    half = {**given, "tls.certFile": str(ca_file)}
    with pytest.raises(OptionError, match=r"tls\.keyFile"):
        parse_connection(Options(half, SOURCE_OPTIONS, "spark.read"))
    missing = {"endpoints": "127.0.0.1:2379", "tls.caFile": str(tmp_path / "none.pem")}
    with pytest.raises(OptionError, match="no such file"):
        parse_connection(Options(missing, SOURCE_OPTIONS, "spark.read"))
    assert parse_connection(Options({"endpoints": "h:1"}, SOURCE_OPTIONS, "x")).tls is None

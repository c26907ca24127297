"""The TLS options of the `quorumlog` command: a node's (etcd's flag names) and a client's
(etcdctl's: `--cacert --cert --key`, or QUORUMLOG_CACERT, QUORUMLOG_CERT, QUORUMLOG_KEY)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from quorumlog.tls.config import NodeTLS, TLSConfig

Command = TypeVar("Command", bound=Callable[..., Any])

READABLE_FILE = click.Path(exists=True, dir_okay=False)

CLIENT_TLS_OPTIONS = (
    click.option(
        "--cacert",
        "tls_cacert",
        envvar="QUORUMLOG_CACERT",
        type=READABLE_FILE,
        default=None,
        help="Talk TLS; verify the nodes against this CA (PEM).  [env: QUORUMLOG_CACERT]",
    ),
    click.option(
        "--cert",
        "tls_cert",
        envvar="QUORUMLOG_CERT",
        type=READABLE_FILE,
        default=None,
        help="This client's certificate, for nodes that require one.  [env: QUORUMLOG_CERT]",
    ),
    click.option(
        "--key",
        "tls_key",
        envvar="QUORUMLOG_KEY",
        type=READABLE_FILE,
        default=None,
        help="The key of --cert.  [env: QUORUMLOG_KEY]",
    ),
    click.option(
        "--insecure-skip-hostname-check",
        "skip_hostname_check",
        is_flag=True,
        help="With TLS: do not check the node's host name against its certificate.",
    ),
)


def client_tls(
    cacert: str | None, cert: str | None, key: str | None, skip_hostname_check: bool = False
) -> TLSConfig | None:
    """The client's TLS settings from the options (None: plaintext)."""
    if cacert is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise click.UsageError("--cert and --key go together")
    return TLSConfig(
        ca_file=cacert, cert_file=cert, key_file=key, check_hostname=not skip_hostname_check
    )


def client_tls_options(command: Command) -> Command:
    """Add the client TLS options; the command receives `tls: TLSConfig | None`."""

    @functools.wraps(command)
    def build(
        tls_cacert: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        skip_hostname_check: bool,
        **arguments: Any,
    ) -> Any:
        tls = client_tls(tls_cacert, tls_cert, tls_key, skip_hostname_check)
        return command(tls=tls, **arguments)

    decorated: Any = build
    for option in reversed(CLIENT_TLS_OPTIONS):
        decorated = option(decorated)
    result: Command = decorated
    return result


NODE_TLS_OPTIONS = (
    click.option("--cert-file", default="", type=str, help="TLS: this node's certificate (PEM)."),
    click.option("--key-file", default="", type=str, help="TLS: the key of --cert-file."),
    click.option(
        "--trusted-ca-file",
        default="",
        type=str,
        help="TLS: the CA of client certificates.",
    ),
    click.option(
        "--client-cert-auth",
        is_flag=True,
        help="TLS: clients must present a certificate signed by --trusted-ca-file.",
    ),
    click.option("--peer-cert-file", default="", type=str, help="TLS: the certificate for peers."),
    click.option("--peer-key-file", default="", type=str, help="TLS: the key of --peer-cert-file."),
    click.option(
        "--peer-trusted-ca-file",
        default="",
        type=str,
        help="TLS: the CA that signs peer certificates (peers verify each other against it).",
    ),
    click.option(
        "--peer-client-cert-auth",
        is_flag=True,
        help="TLS: peers must present a certificate signed by --peer-trusted-ca-file.",
    ),
    click.option(
        "--peer-cert-allowed-cn",
        default="",
        type=str,
        help="TLS: a peer's certificate must carry this common name.",
    ),
)
NODE_TLS_NAMES = tuple(field for field in NodeTLS.__struct_fields__)


def node_tls_options(command: Command) -> Command:
    """Add a node's TLS flags; the command receives `node_tls: NodeTLS`, checked (a bad
    combination is a usage error naming the flags)."""

    @functools.wraps(command)
    def build(*positional: Any, **arguments: Any) -> Any:
        values = {name: arguments.pop(name) for name in NODE_TLS_NAMES}
        node_tls = NodeTLS(**values)
        try:
            node_tls.validate()
        except ValueError as error:
            raise click.UsageError(str(error)) from error
        return command(*positional, node_tls=node_tls, **arguments)

    decorated: Any = build
    for option in reversed(NODE_TLS_OPTIONS):
        decorated = option(decorated)
    result: Command = decorated
    return result


__all__ = ["client_tls", "client_tls_options", "node_tls_options"]

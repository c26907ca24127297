"""`--user NAME[:PASSWORD]` and `--password` on every command that talks to a cluster
(etcdctl's forms; else $QUORUMLOG_USER and $QUORUMLOG_PASSWORD)."""

from __future__ import annotations

import os
from typing import Any

import click

from quorumlog.auth.credentials import parse_user

PASSWORD_ENVIRONMENT_VARIABLE = "QUORUMLOG_PASSWORD"
USER_OPTIONS = [
    click.option(
        "--user",
        "user_text",
        envvar="QUORUMLOG_USER",
        default=None,
        help="With auth on: NAME or NAME:PASSWORD.  [env: QUORUMLOG_USER]",
    ),
    click.option(
        "--password",
        "password_text",
        envvar="QUORUMLOG_PASSWORD",
        default=None,
        help="The password of --user (else after its ':').  [env: QUORUMLOG_PASSWORD]",
    ),
]


def without_password_option(command: Any) -> Any:
    """Drop `--password` from a command that has its own (`ledger read --password` is the
    ledger's): there the user's password comes after `--user NAME:` or from
    $QUORUMLOG_PASSWORD. Apply it after `client_options` (above it)."""
    params = getattr(command, "__click_params__", [])
    command.__click_params__ = [param for param in params if "--password" not in param.opts]
    return command


def user_and_password(arguments: dict[str, Any]) -> tuple[str | None, str | None]:
    """Take the options' values out of a command's `arguments`: (user, password)."""
    user_text: str | None = arguments.pop("user_text", None)
    if "password_text" in arguments:
        password_text: str | None = arguments.pop("password_text")
    else:
        password_text = os.environ.get(PASSWORD_ENVIRONMENT_VARIABLE)
    if user_text is None:
        if password_text is not None:
            raise click.UsageError("--password needs --user")
        return None, None
    try:
        credentials = parse_user(user_text, password_text)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    return credentials.user, credentials.password


__all__ = ["USER_OPTIONS", "user_and_password", "without_password_option"]

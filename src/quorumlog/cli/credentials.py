"""`--user NAME[:PASSWORD]` and `--password` on every command that talks to a cluster
(etcdctl's forms; else $QUORUMLOG_USER and $QUORUMLOG_PASSWORD)."""

from __future__ import annotations

from typing import Any

import click

from quorumlog.auth.credentials import parse_user

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


def user_and_password(arguments: dict[str, Any]) -> tuple[str | None, str | None]:
    """Take the options' values out of a command's `arguments`: (user, password)."""
    user_text: str | None = arguments.pop("user_text", None)
    password_text: str | None = arguments.pop("password_text", None)
    if user_text is None:
        if password_text is not None:
            raise click.UsageError("--password needs --user")
        return None, None
    try:
        credentials = parse_user(user_text, password_text)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    return credentials.user, credentials.password


__all__ = ["USER_OPTIONS", "user_and_password"]

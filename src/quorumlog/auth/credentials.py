"""What a client presents: a user and password, sent once per connection.

Clients take `user=` and `password=`; inside, they hold a `CredentialsSource`, asked each
time a connection opens (a node's own clients use one that reads the node secret from
the replicated state, which appears only once `auth enable` is applied there).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.codec.wire import Authenticate, AuthenticateResult, ErrorCode, ErrorResponse, Frame
from quorumlog.errors import AuthenticationRequiredError, ClientError


class Credentials(msgspec.Struct, frozen=True):
    user: str
    password: str = msgspec.field(default="")

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=...)"  # never print a password


CredentialsSource = Callable[[], Credentials | None]


def credentials_source(
    user: str | None, password: str | None, source: CredentialsSource | None = None
) -> CredentialsSource | None:
    """A client's source from its `user=`/`password=` arguments (or a given source)."""
    if source is not None:
        if user is not None:
            raise ValueError("give user= or credentials=, not both")
        return source
    if user is None:
        if password is not None:
            raise ValueError("a password needs a user")
        return None
    fixed = Credentials(user=user, password=password or "")
    return lambda: fixed


def parse_user(text: str, password: str | None = None) -> Credentials:
    """etcdctl's --user form: "NAME[:PASSWORD]" (a separate password wins when given)."""
    name, _, inline = text.partition(":")
    if not name:
        raise ValueError("--user needs a name")
    return Credentials(user=name, password=password if password is not None else inline)


def authenticate_request(credentials: Credentials) -> Authenticate:
    """The first request on a connection of a client with credentials (its answer is the
    connection's only one before the requests, so its request id does not matter)."""
    return Authenticate(request_id=0, user=credentials.user, password=credentials.password)


def token_from(frame: Frame, endpoint: str) -> str:
    """The token of an Authenticate answer; raises if the node refused the credentials."""
    if isinstance(frame, AuthenticateResult):
        return frame.token
    if isinstance(frame, ErrorResponse):
        raise AuthenticationRequiredError(f"{endpoint}: {frame.message}", frame.code.value)
    raise ClientError(f"{endpoint} answered Authenticate with {type(frame).__name__}")


def is_invalid_token(frame: Frame) -> bool:
    return isinstance(frame, ErrorResponse) and frame.code is ErrorCode.AUTH_TOKEN_INVALID


__all__ = [
    "Credentials",
    "CredentialsSource",
    "authenticate_request",
    "credentials_source",
    "is_invalid_token",
    "parse_user",
    "token_from",
]

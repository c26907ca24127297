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


class AuthenticationBusyError(ConnectionError):
    """The node had too many password checks queued: the connection is given up like a
    failed dial (clients retry it, elsewhere or after a back-off)."""


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
        if frame.code is ErrorCode.PENDING_FULL:
            raise AuthenticationBusyError(f"{endpoint}: {frame.message}")
        raise AuthenticationRequiredError(f"{endpoint}: {frame.message}", frame.code.value)
    raise ClientError(f"{endpoint} answered Authenticate with {type(frame).__name__}")


def screen_answer(frame: Frame, authenticated: bool) -> tuple[Frame, bool]:
    """An answer as the request's attempt should see it, and whether the connection that
    carried it must be replaced (a new one asks the credentials again and authenticates).

    AUTH_TOKEN_INVALID: replace it. AUTHENTICATION_REQUIRED: replace it too (a node's own
    client may have had no credentials yet when it connected); and if this connection
    did authenticate (auth was off then, so it got no token), the answer becomes
    AUTH_TOKEN_INVALID, which the attempt retries on the new connection."""
    if not isinstance(frame, ErrorResponse):
        return frame, False
    if frame.code is ErrorCode.AUTH_TOKEN_INVALID:
        return frame, True
    if frame.code is ErrorCode.AUTHENTICATION_REQUIRED:
        if authenticated:
            retry = ErrorResponse(
                request_id=frame.request_id,
                code=ErrorCode.AUTH_TOKEN_INVALID,
                message="auth was turned on after this connection authenticated",
            )
            return retry, True
        return frame, True
    return frame, False


__all__ = [
    "AuthenticationBusyError",
    "Credentials",
    "CredentialsSource",
    "authenticate_request",
    "credentials_source",
    "parse_user",
    "screen_answer",
    "token_from",
]

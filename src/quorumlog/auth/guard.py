"""The node's auth checks: tokens, and the right every request needs.

A client with credentials sends `Authenticate` once per connection; the node checks the
password against its replica of the auth state and answers a token: random, kept in this
node's memory only (etcd's "simple" tokens) with a sliding TTL. The client wraps each
later request in `AuthenticatedRequest`; the node looks the token up, checks the user's
roles (`auth.rules`) and serves the inner request, or answers PERMISSION_DENIED. A token
this node does not know (another node issued it, this one restarted, it expired, or its
user was deleted or changed password since) gets AUTH_TOKEN_INVALID, on which the client
authenticates again and retries — so a leader change costs one re-authentication.

Nodes talk to each other as clients too (a ledger topic's owner writes ledger metadata,
a bookie heartbeats its registration, shard groups pull shards): they authenticate as
`NODE_USER` with the node secret that `auth enable` stored in the replicated state, and
get every right.

With auth off the dispatcher reads `active` (kept current by the KV machine's
`auth_changed` call) and looks the request's type up in `AUTH_FRAME_TYPES`, and calls
nothing here: the hot path pays next to nothing.
"""

from __future__ import annotations

import functools
import hmac
import secrets
from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.auth.matcher import ALL_RIGHTS, Rights
from quorumlog.auth.model import NODE_USER, verify_password
from quorumlog.auth.rules import UNCHECKED_REQUEST_TYPES, request_denial
from quorumlog.auth.state import AuthState, AuthStateView
from quorumlog.codec import wire
from quorumlog.runtime.transport import Replier

TOKEN_TTL_SECONDS_DEFAULT = 300.0
"""A token unused this long is forgotten (etcd's simple-token TTL); each use renews it."""
TOKENS_MAX_DEFAULT = 100_000
"""Past this many live tokens, the least recently issued is forgotten first."""

HASHES_PENDING_MAX_DEFAULT = 64
"""Password checks queued at once; past it, Authenticate is answered PENDING_FULL."""

Offload = Callable[[Callable[[], Any], Callable[[Any], None]], None]
"""`offload(work, done)`: run `work` somewhere, then `done(its result)` on the caller's
thread."""


def run_inline(work: Callable[[], Any], done: Callable[[Any], None]) -> None:
    done(work())


CallLater = Callable[[float, Callable[[], None]], Any]
RECHECK_SECONDS_DEFAULT = 0.5
"""How long a replica behind the metadata leader waits before checking a refused password
once more (a few heartbeats: time to apply a user added a moment ago)."""


def call_now(delay_seconds: float, callback: Callable[[], None]) -> None:
    callback()


AUTH_FRAME_TYPES: frozenset[type] = frozenset(
    {wire.Authenticate, wire.AuthenticatedRequest, wire.AuthAdmin, wire.AuthQuery}
)
"""Frames the guard answers or unwraps whether auth is on or off."""


class TokenEntry(msgspec.Struct):
    user: str
    proof: str
    """What the token was issued against: the user's password salt (a new password makes
    a new salt, and so ends the token), the node secret for `NODE_USER`, or "" when
    issued while auth was off without a check (not valid once auth is on)."""
    expires_at: float


class AuthService:
    """What answers auth commands and queries (`auth.service.AuthRequestService`)."""

    def admin(self, request: wire.AuthAdmin, rights: Rights, reply: Replier) -> None:
        raise NotImplementedError

    def query(
        self, request: wire.AuthQuery, rights: Rights, state: AuthState, reply: Replier
    ) -> None:
        raise NotImplementedError


class AuthGuard:
    """One node's tokens and checks (see the module docstring); sans-I/O: its clock, the
    thread that hashes and its timer are given to it."""

    def __init__(
        self,
        view: AuthStateView,
        clock: Callable[[], float],
        token_ttl_seconds: float = TOKEN_TTL_SECONDS_DEFAULT,
        tokens_max: int = TOKENS_MAX_DEFAULT,
        offload: Offload = run_inline,
        hashes_pending_max: int = HASHES_PENDING_MAX_DEFAULT,
        is_authority: Callable[[], bool] = lambda: True,
        call_later: CallLater = call_now,
    ) -> None:
        self.view = view
        self.is_authority = is_authority
        """Whether this node's auth state is the latest (it leads the metadata group)."""
        self.call_later = call_later
        self.recheck_seconds = RECHECK_SECONDS_DEFAULT
        self.offload = offload
        """Runs a password check (tens of milliseconds of hashing) away from the event
        loop, so heartbeats go on meanwhile; inline where there is no loop to spare."""
        self.hashes_pending_max = hashes_pending_max
        self.hashes_pending = 0
        self.clock = clock
        self.token_ttl_seconds = token_ttl_seconds
        self.tokens_max = tokens_max
        self.tokens: dict[str, TokenEntry] = {}
        self.service: AuthService | None = None
        self.denied_count = 0
        self.active = False
        """Whether auth is on, kept current by `refresh`: the dispatcher's one check."""
        self.refresh()

    def refresh(self) -> None:
        """The auth state changed (an auth command applied, a snapshot restored)."""
        self.active = self.view.enabled()

    def enabled(self) -> bool:
        return self.view.enabled()

    # --- the dispatcher's entry -------------------------------------------------------------

    def admit(
        self,
        request: wire.ClientRequest,
        reply: Replier,
        peer_common_name: str | None = None,
    ) -> wire.ClientRequest | None:
        """The request to serve (unwrapped), or None once this answered it.

        `peer_common_name`: the common name of the client's certificate, verified by the
        transport, when the node runs with client certificate authentication (etcd's
        --client-cert-auth). As etcd does, a request with no token is then served with the
        rights of the user that name names (if there is one), and an `Authenticate` of that
        user with an empty password is taken without a password check."""
        state = self.view.current()
        if isinstance(request, wire.Authenticate):
            if peer_common_name is not None and self.by_certificate(
                request, peer_common_name, state, reply
            ):
                return None
            self.authenticate(request, state, reply)
            return None
        if isinstance(request, wire.AuthenticatedRequest):
            inner = request.request
            if isinstance(inner, wire.AuthenticatedRequest | wire.Authenticate):
                reply(error(request_id_of(inner), wire.ErrorCode.BAD_REQUEST, "nested auth frame"))
                return None
            rights = self.rights_of_token(request.token, state) if state.enabled else ALL_RIGHTS
            if rights is None:
                reply(
                    error(
                        inner.request_id,
                        wire.ErrorCode.AUTH_TOKEN_INVALID,
                        "the token is unknown here or expired: authenticate again",
                    )
                )
                return None
            return self.authorize(inner, rights, state, reply)
        if not state.enabled:
            return self.authorize(request, ALL_RIGHTS, state, reply)
        if isinstance(request, UNCHECKED_REQUEST_TYPES):
            return request
        if peer_common_name is not None:
            certified = state.rights_of(peer_common_name)
            if certified is not None:
                return self.authorize(request, certified, state, reply)
        reply(
            error(
                request.request_id,
                wire.ErrorCode.AUTHENTICATION_REQUIRED,
                f"auth is enabled: {type(request).__name__} needs a user and password",
            )
        )
        return None

    def authorize(
        self, request: wire.ClientRequest, rights: Rights, state: AuthState, reply: Replier
    ) -> wire.ClientRequest | None:
        if isinstance(request, wire.AuthAdmin | wire.AuthQuery):
            self.serve_auth(request, rights, state, reply)
            return None
        if not state.enabled:
            return request
        denial = request_denial(rights, request)
        if denial is None:
            return request
        self.denied_count += 1
        reply(error(request.request_id, wire.ErrorCode.PERMISSION_DENIED, denial))
        return None

    def serve_auth(
        self,
        request: wire.AuthAdmin | wire.AuthQuery,
        rights: Rights,
        state: AuthState,
        reply: Replier,
    ) -> None:
        service = self.service
        if service is None:
            reply(error(request.request_id, wire.ErrorCode.UNKNOWN_GROUP, "no auth service here"))
        elif isinstance(request, wire.AuthAdmin):
            service.admin(request, rights, reply)
        else:
            service.query(request, rights, state, reply)

    # --- tokens ---------------------------------------------------------------------------

    def authenticate(
        self, request: wire.Authenticate, state: AuthState, reply: Replier, second: bool = False
    ) -> None:
        """Check the password off the loop (a slow hash), then answer with a token.

        A replica that is not the metadata leader may not have applied a user added or a
        password changed a moment ago: there a failed check is made once more after
        `recheck_seconds` (the replica catches up meanwhile) before it is refused."""
        if self.hashes_pending >= self.hashes_pending_max:
            reply(
                error(
                    request.request_id,
                    wire.ErrorCode.PENDING_FULL,
                    f"{self.hashes_pending} authentications in progress: try again shortly",
                )
            )
            return
        self.hashes_pending += 1

        def checked(proof: str | None) -> None:
            self.hashes_pending -= 1
            if proof is None and not second and not self.is_authority():
                self.call_later(
                    self.recheck_seconds,
                    lambda: self.authenticate(request, self.view.current(), reply, second=True),
                )
                return
            reply(self.issue(request, proof, self.view.current()))

        self.offload(
            functools.partial(self.check_credentials, request.user, request.password, state),
            checked,
        )

    def by_certificate(
        self, request: wire.Authenticate, common_name: str, state: AuthState, reply: Replier
    ) -> bool:
        """Answer an Authenticate that names the certificate's user; False if it does not."""
        if request.password or request.user != common_name:
            return False
        user = state.users.get(common_name)
        proof = None if user is None else user.password.salt_hex
        reply(self.issue(request, proof, state))
        return True

    def issue(self, request: wire.Authenticate, proof: str | None, state: AuthState) -> wire.Frame:
        if proof is None:
            return error(
                request.request_id,
                wire.ErrorCode.AUTHENTICATION_FAILED,
                "authentication failed: unknown user or wrong password",
            )
        if not state.enabled and not proof:
            # Nothing to check while auth is off: the client sends its requests unwrapped.
            return wire.AuthenticateResult(request_id=request.request_id, token="")
        token = secrets.token_hex(16)
        while len(self.tokens) >= self.tokens_max:
            del self.tokens[next(iter(self.tokens))]
        self.tokens[token] = TokenEntry(request.user, proof, self.clock() + self.token_ttl_seconds)
        return wire.AuthenticateResult(request_id=request.request_id, token=token)

    def check_credentials(self, user_name: str, password: str, state: AuthState) -> str | None:
        """The token's proof (see `TokenEntry.proof`) if the credentials hold; None if not.
        While auth is off, unknown users get "" instead of a refusal."""
        if user_name == NODE_USER:
            secret = state.switch.node_secret
            if secret and hmac.compare_digest(secret.encode(), password.encode()):
                return secret
            return "" if not state.enabled else None
        user = state.users.get(user_name)
        if user is None or not verify_password(password, user.password):
            return "" if not state.enabled else None
        return user.password.salt_hex

    def rights_of_token(self, token: str, state: AuthState) -> Rights | None:
        entry = self.tokens.get(token)
        if entry is None:
            return None
        now = self.clock()
        if entry.expires_at <= now:
            del self.tokens[token]
            return None
        if entry.user == NODE_USER:
            valid = bool(entry.proof) and entry.proof == state.switch.node_secret
            rights: Rights | None = ALL_RIGHTS if valid else None
        else:
            user = state.users.get(entry.user)
            valid = user is not None and bool(entry.proof)
            valid = valid and user is not None and user.password.salt_hex == entry.proof
            rights = state.rights_of(entry.user) if valid else None
        if rights is None:
            del self.tokens[token]
            return None
        entry.expires_at = now + self.token_ttl_seconds
        return rights


def error(request_id: int, code: wire.ErrorCode, message: str) -> wire.ErrorResponse:
    return wire.ErrorResponse(request_id=request_id, code=code, message=message)


def request_id_of(request: wire.ClientRequest) -> int:
    return getattr(request, "request_id", 0)


__all__ = [
    "AUTH_FRAME_TYPES",
    "TOKEN_TTL_SECONDS_DEFAULT",
    "UNCHECKED_REQUEST_TYPES",
    "AuthGuard",
    "AuthService",
    "Offload",
    "run_inline",
]

"""The node's answers to auth commands (`AuthAdmin`) and queries (`AuthQuery`).

An auth command is taken only by the "kv" group's leader. There, before anything is
proposed, a password is hashed (a fresh salt, PBKDF2) and `auth enable` gets a random node
secret: the log carries the results, so every replica applies the same bytes and none
hashes. The command then travels as one KV command of op `AUTH_OP` in the client's
session, so a retried command is applied at most once, and is answered with the KV's
KVWriteResult (see `auth.commands.apply_auth` for what its result says).

Queries are answered by the leader behind a read barrier, from the state applied then.
A user is shown with its roles, never its hash.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable

import msgspec

from quorumlog.auth.commands import (
    AuthCommand,
    AuthEnable,
    UserAdd,
    UserChangePassword,
    auth_command,
    decode_command,
)
from quorumlog.auth.guard import AuthService, Offload, run_inline
from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import PASSWORD_ITERATIONS_DEFAULT, AdminRight, Permission, hash_password
from quorumlog.auth.state import AuthState, AuthStateView
from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError
from quorumlog.node.errors_to_wire import after_read_barrier
from quorumlog.node.kv_service import KVService
from quorumlog.runtime.transport import Replier

QUERIES = frozenset({"status", "user_list", "user_get", "role_list", "role_get"})


class UserView(msgspec.Struct, frozen=True):
    name: str
    roles: list[str]


class RoleView(msgspec.Struct, frozen=True):
    name: str
    permissions: list[Permission]


class StatusView(msgspec.Struct, frozen=True):
    enabled: bool


_encoder = msgspec.json.Encoder()


class AuthRequestService(AuthService):
    def __init__(
        self,
        kv: KVService,
        view: AuthStateView,
        leader_address: Callable[[], str | None],
        password_iterations: int = PASSWORD_ITERATIONS_DEFAULT,
        offload: Offload = run_inline,
    ) -> None:
        self.kv = kv
        self.offload = offload
        """Where passwords are hashed (off the event loop on a node; see `AuthGuard`)."""
        self.view = view
        self.leader_address = leader_address
        self.password_iterations = password_iterations

    def admin(self, request: wire.AuthAdmin, rights: Rights, reply: Replier) -> None:
        if not rights.has_admin(AdminRight.AUTH):
            reply(refusal(request.request_id, wire.ErrorCode.PERMISSION_DENIED, "auth admin"))
            return
        try:
            command = decode_command(request.command)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            reply(refusal(request.request_id, wire.ErrorCode.BAD_REQUEST, str(error)))
            return
        if not self.at_leader(request, reply):
            return  # before hashing: only the leader's work counts

        def prepared_then(prepared: AuthCommand | str) -> None:
            if isinstance(prepared, str):
                reply(refusal(request.request_id, wire.ErrorCode.BAD_REQUEST, prepared))
            elif self.at_leader(request, reply):
                self.propose(request, prepared, reply)

        self.offload(functools.partial(self.prepare, command), prepared_then)

    def at_leader(self, request: wire.AuthAdmin, reply: Replier) -> bool:
        group = self.kv.group
        if group.is_leader:
            return True
        self.kv.reject(reply, request.request_id, NotLeaderError(group.node_id, group.leader_id))
        return False

    def propose(self, request: wire.AuthAdmin, prepared: AuthCommand, reply: Replier) -> None:
        write = wire.KVWrite(
            request_id=request.request_id,
            client_id=request.client_id,
            commands=[auth_command(prepared, request.sequence)],
            first_unacknowledged=request.first_unacknowledged,
        )
        self.kv.enqueue_write(write, reply)

    def prepare(self, command: AuthCommand) -> AuthCommand | str:
        """The command as the log carries it (hashed, with its secret); a str says why not."""
        if isinstance(command, UserAdd | UserChangePassword):
            if command.password_hash is not None:
                return "send the password; the cluster hashes it"
            if not command.password:
                return "a user needs a non-empty password"
            hashed = hash_password(command.password, self.password_iterations)
            return msgspec.structs.replace(command, password="", password_hash=hashed)
        if isinstance(command, AuthEnable):
            return AuthEnable(node_secret=secrets.token_hex(32))
        return command

    def query(
        self, request: wire.AuthQuery, rights: Rights, state: AuthState, reply: Replier
    ) -> None:
        if request.query not in QUERIES:
            reply(refusal(request.request_id, wire.ErrorCode.BAD_REQUEST, request.query))
            return
        if request.query != "status" and not rights.has_admin(AdminRight.AUTH):
            reply(refusal(request.request_id, wire.ErrorCode.PERMISSION_DENIED, "auth admin"))
            return
        after_read_barrier(
            self.kv.group.linearizable_read,
            request.request_id,
            reply,
            self.leader_address,
            lambda: reply(self.answer(request, self.view.current())),
        )

    def answer(self, request: wire.AuthQuery, state: AuthState) -> wire.Frame:
        answer: object
        if request.query == "status":
            answer = StatusView(enabled=state.enabled)
        elif request.query == "user_list":
            answer = sorted(state.users)
        elif request.query == "role_list":
            answer = sorted(state.roles)
        elif request.query == "user_get":
            user = state.users.get(request.name)
            if user is None:
                return refusal(
                    request.request_id, wire.ErrorCode.NOT_FOUND, f"user {request.name!r}"
                )
            answer = UserView(name=user.name, roles=list(user.roles))
        else:
            role = state.roles.get(request.name)
            if role is None:
                return refusal(
                    request.request_id, wire.ErrorCode.NOT_FOUND, f"role {request.name!r}"
                )
            answer = RoleView(name=role.name, permissions=list(role.permissions))
        return wire.AuthQueryResult(
            request_id=request.request_id, answer=_encoder.encode(answer).decode()
        )


def refusal(request_id: int, code: wire.ErrorCode, message: str) -> wire.ErrorResponse:
    if code is wire.ErrorCode.PERMISSION_DENIED:
        message = f"the {message!r} right is needed"
    elif code is wire.ErrorCode.NOT_FOUND:
        message = f"{message} does not exist"
    return wire.ErrorResponse(request_id=request_id, code=code, message=message)


__all__ = ["QUERIES", "AuthRequestService", "RoleView", "StatusView", "UserView"]

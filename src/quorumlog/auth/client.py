"""AuthClient: users, roles and the auth switch, as `quorumlog user|role|auth` use them.

    with AuthClient(["127.0.0.1:2379"], user="root", password="...") as auth:
        auth.role_add("app")
        auth.role_grant_permission("app", Permission(PermissionKind.KEY, Access.READWRITE,
                                                     "app/", prefix_range_end("app/")))

Commands are numbered in the client's session like KV writes (a retried command is
applied at most once); queries are answered by the metadata leader behind a read barrier.
A refusal raises `RequestRejectedError` with the cluster's code (`not_found`,
`already_exists`, `bad_request`), `PermissionDeniedError` without the "auth" admin right.
"""

from __future__ import annotations

import time

import msgspec

from quorumlog.auth.commands import (
    AUTH_OP,
    AUTH_PREFIX,
    AuthCommand,
    AuthDisable,
    AuthEnable,
    RoleAdd,
    RoleDelete,
    RoleGrantPermission,
    RoleRevokePermission,
    UserAdd,
    UserChangePassword,
    UserDelete,
    UserGrantRole,
    UserRevokeRole,
    encode_command,
)
from quorumlog.auth.model import Permission, PermissionKind
from quorumlog.auth.service import RoleView, StatusView, UserView
from quorumlog.codec.wire import AuthAdmin, AuthQuery, AuthQueryResult, KVWriteResult
from quorumlog.errors import RequestRejectedError, SessionExpiredError
from quorumlog.kv.client import KVClient
from quorumlog.kv.connection import write_results
from quorumlog.kv.requests import SessionCommand


class AuthClient(KVClient):
    """A KVClient that also sends auth commands and queries (see the module docstring)."""

    # --- users ----------------------------------------------------------------------------

    def user_add(self, name: str, password: str) -> None:
        self.run(UserAdd(name=name, password=password), f"user add {name}")

    def user_delete(self, name: str) -> None:
        self.run(UserDelete(name=name), f"user delete {name}")

    def user_change_password(self, name: str, password: str) -> None:
        self.run(UserChangePassword(name=name, password=password), f"user passwd {name}")

    def user_grant_role(self, name: str, role: str) -> None:
        self.run(UserGrantRole(name=name, role=role), f"user grant-role {name} {role}")

    def user_revoke_role(self, name: str, role: str) -> None:
        self.run(UserRevokeRole(name=name, role=role), f"user revoke-role {name} {role}")

    def user_list(self) -> list[str]:
        return msgspec.json.decode(self.query("user_list"), type=list[str])

    def user_get(self, name: str) -> UserView:
        return msgspec.json.decode(self.query("user_get", name), type=UserView)

    # --- roles ----------------------------------------------------------------------------

    def role_add(self, name: str) -> None:
        self.run(RoleAdd(name=name), f"role add {name}")

    def role_delete(self, name: str) -> None:
        self.run(RoleDelete(name=name), f"role delete {name}")

    def role_grant_permission(self, name: str, permission: Permission) -> None:
        self.run(RoleGrantPermission(name=name, permission=permission), f"grant to {name}")

    def role_revoke_permission(
        self, name: str, kind: PermissionKind, key: str, range_end: str = ""
    ) -> None:
        command = RoleRevokePermission(name=name, kind=kind, key=key, range_end=range_end)
        self.run(command, f"revoke from {name}")

    def role_list(self) -> list[str]:
        return msgspec.json.decode(self.query("role_list"), type=list[str])

    def role_get(self, name: str) -> RoleView:
        return msgspec.json.decode(self.query("role_get", name), type=RoleView)

    # --- the switch -----------------------------------------------------------------------

    def auth_enable(self) -> None:
        self.run(AuthEnable(), "auth enable")

    def auth_disable(self) -> None:
        self.run(AuthDisable(), "auth disable")

    def auth_status(self) -> bool:
        """Whether auth is enabled (any authenticated user may ask)."""
        return msgspec.json.decode(self.query("status"), type=StatusView).enabled

    # --- the requests ---------------------------------------------------------------------

    def run(self, command: AuthCommand, what: str) -> None:
        text = encode_command(command)
        with self.lock:
            session = self.session
            # The identity holds the command's text: a repeated call reuses the sequence
            # of one that ended in an unknown outcome, as KV writes do.
            pending = SessionCommand(session, (AUTH_OP, AUTH_PREFIX, text, None), time.monotonic())
            sequence = pending.command.sequence
            try:
                response = self.call(
                    what,
                    lambda request_id: AuthAdmin(
                        request_id=request_id,
                        client_id=session.client_id,
                        sequence=sequence,
                        command=text,
                        first_unacknowledged=session.first_unacknowledged(),
                    ),
                    KVWriteResult,
                    side_effects=True,
                )
            except BaseException as error:
                pending.failed(error, time.monotonic())
                if isinstance(error, SessionExpiredError):
                    self.renew_session(session)
                raise
            session.sequences.acknowledge(sequence)
            try:
                [result] = write_results(response, 1, what)
            except SessionExpiredError:
                self.renew_session(session)
                raise
            session.answered = True
        if not result.ok:
            code, _, message = (result.value or "bad_request: refused").partition(": ")
            raise RequestRejectedError(code, f"{what}: {message}")

    def query(self, query: str, name: str = "") -> str:
        response = self.call(
            f"auth {query} {name}".strip(),
            lambda request_id: AuthQuery(request_id=request_id, query=query, name=name),
            AuthQueryResult,
            side_effects=False,
        )
        return response.answer


__all__ = ["AuthClient"]

"""Auth commands and their deterministic apply on the metadata group's KV state.

The auth state lives in the "kv" group's data under `AUTH_PREFIX`, one key per collection
(users, roles, the switch), as JSON; it is small, and one key per collection keeps
reading it a few lookups (no scan of the user data). It is written only by commands
carried as a KV command with op `AUTH_OP` (the node builds those; a client's KVWrite may
not use the op), so snapshots, sessions and deduplication are the KV's own.

Apply is total and deterministic: it reads only the state and the command, never a clock
or a random source. Everything random (salts, the node secret) and slow (the password
hash) is decided by the node that takes the request, BEFORE it proposes: the log holds
the hash and the salt, never a password, and replicas never hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from quorumlog.auth.model import (
    FROM_KEY,
    ROOT_ROLE,
    ROOT_USER,
    AdminRight,
    AuthSwitch,
    PasswordHash,
    Permission,
    PermissionKind,
    Role,
    User,
    check_name,
)
from quorumlog.codec.wire import KVCommand, KVCommandResult

AUTH_OP = "auth"
AUTH_PREFIX = "__auth/"
USERS_KEY = "__auth/users"
ROLES_KEY = "__auth/roles"
SWITCH_KEY = "__auth/switch"
AUTH_KEYS = (USERS_KEY, ROLES_KEY, SWITCH_KEY)
"""Every key the auth state is kept in (apply reads and writes only these)."""


class UserAdd(msgspec.Struct, frozen=True, tag=True):
    name: str
    password: str = ""
    """In the client's request only; the node replaces it with `password_hash`."""
    password_hash: PasswordHash | None = None


class UserDelete(msgspec.Struct, frozen=True, tag=True):
    name: str


class UserChangePassword(msgspec.Struct, frozen=True, tag=True):
    name: str
    password: str = ""
    password_hash: PasswordHash | None = None


class UserGrantRole(msgspec.Struct, frozen=True, tag=True):
    name: str
    role: str


class UserRevokeRole(msgspec.Struct, frozen=True, tag=True):
    name: str
    role: str


class RoleAdd(msgspec.Struct, frozen=True, tag=True):
    name: str


class RoleDelete(msgspec.Struct, frozen=True, tag=True):
    name: str


class RoleGrantPermission(msgspec.Struct, frozen=True, tag=True):
    name: str
    permission: Permission


class RoleRevokePermission(msgspec.Struct, frozen=True, tag=True):
    name: str
    kind: PermissionKind
    key: str
    range_end: str = ""


class AuthEnable(msgspec.Struct, frozen=True, tag=True):
    node_secret: str = ""
    """Chosen by the node that takes the request (see `AuthSwitch`)."""


class AuthDisable(msgspec.Struct, frozen=True, tag=True):
    pass


AuthCommand = (
    UserAdd
    | UserDelete
    | UserChangePassword
    | UserGrantRole
    | UserRevokeRole
    | RoleAdd
    | RoleDelete
    | RoleGrantPermission
    | RoleRevokePermission
    | AuthEnable
    | AuthDisable
)

_command_decoder = msgspec.json.Decoder(AuthCommand)
_users_decoder = msgspec.json.Decoder(dict[str, User])
_roles_decoder = msgspec.json.Decoder(dict[str, Role])
_switch_decoder = msgspec.json.Decoder(AuthSwitch)
_encoder = msgspec.json.Encoder()


def encode_command(command: AuthCommand) -> str:
    return _encoder.encode(command).decode()


def decode_command(text: str) -> AuthCommand:
    """Raises msgspec.DecodeError / ValidationError on bad input."""
    command: AuthCommand = _command_decoder.decode(text)
    return command


def auth_command(command: AuthCommand, sequence: int) -> KVCommand:
    """The KV command that carries an auth command into the log."""
    return KVCommand(sequence=sequence, op=AUTH_OP, key=AUTH_PREFIX, value=encode_command(command))


# --- the state as stored --------------------------------------------------------------------


def read_users(data: Mapping[str, str]) -> dict[str, User]:
    text = data.get(USERS_KEY)
    return {} if text is None else _users_decoder.decode(text)


def read_roles(data: Mapping[str, str]) -> dict[str, Role]:
    text = data.get(ROLES_KEY)
    return {} if text is None else _roles_decoder.decode(text)


def read_switch(data: Mapping[str, str]) -> AuthSwitch:
    text = data.get(SWITCH_KEY)
    return AuthSwitch(enabled=False) if text is None else _switch_decoder.decode(text)


def write_sorted(data: dict[str, str], key: str, items: dict[str, User] | dict[str, Role]) -> None:
    """Sorted by name, so every replica stores the same bytes."""
    data[key] = _encoder.encode(dict(sorted(items.items()))).decode()


# --- apply --------------------------------------------------------------------------------


class Refusal(Exception):
    """A command that cannot be carried out (nothing changes); its code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def apply_auth(data: dict[str, str], command: KVCommand) -> KVCommandResult:
    """Carry out one auth command on `data`. The result's `value` is None when done, else
    "<code>: <message>" (the code an ErrorCode value), with `ok` False and nothing changed."""
    try:
        decoded = decode_command(command.value or "")
        apply_decoded(data, decoded)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        return KVCommandResult(ok=False, value=f"bad_request: auth command: {error}")
    except Refusal as refusal:
        return KVCommandResult(ok=False, value=f"{refusal.code}: {refusal}")
    return KVCommandResult(ok=True, value=None)


def apply_decoded(data: dict[str, str], command: AuthCommand) -> None:
    if isinstance(command, UserAdd | UserDelete | UserChangePassword):
        apply_user_command(data, command)
    elif isinstance(command, UserGrantRole | UserRevokeRole):
        apply_user_role(data, command)
    elif isinstance(command, RoleAdd | RoleDelete):
        apply_role_command(data, command)
    elif isinstance(command, RoleGrantPermission | RoleRevokePermission):
        apply_permission(data, command)
    else:
        apply_switch(data, command)


def user_of(users: dict[str, User], name: str) -> User:
    user = users.get(name)
    if user is None:
        raise Refusal("not_found", f"user {name!r} does not exist")
    return user


def stored_hash(command: UserAdd | UserChangePassword) -> PasswordHash:
    if command.password or command.password_hash is None:
        # The node hashes before proposing; a clear password must never reach the log.
        raise Refusal("bad_request", "an auth command in the log must carry a hash only")
    return command.password_hash


def apply_user_command(
    data: dict[str, str], command: UserAdd | UserDelete | UserChangePassword
) -> None:
    users = read_users(data)
    if isinstance(command, UserAdd):
        problem = check_name("user", command.name)
        if problem is not None:
            raise Refusal("bad_request", problem)
        if command.name in users:
            raise Refusal("already_exists", f"user {command.name!r} already exists")
        users[command.name] = User(name=command.name, password=stored_hash(command))
    elif isinstance(command, UserDelete):
        user_of(users, command.name)
        if command.name == ROOT_USER and read_switch(data).enabled:
            raise Refusal("bad_request", "user root cannot be deleted while auth is enabled")
        del users[command.name]
    else:
        user = user_of(users, command.name)
        users[command.name] = msgspec.structs.replace(user, password=stored_hash(command))
    write_sorted(data, USERS_KEY, users)


def apply_user_role(data: dict[str, str], command: UserGrantRole | UserRevokeRole) -> None:
    users = read_users(data)
    user = user_of(users, command.name)
    if isinstance(command, UserGrantRole):
        if command.role != ROOT_ROLE and command.role not in read_roles(data):
            raise Refusal("not_found", f"role {command.role!r} does not exist")
        roles = sorted({*user.roles, command.role})
    else:
        if command.role not in user.roles:
            raise Refusal("not_found", f"user {command.name!r} does not have role {command.role!r}")
        if (command.name, command.role) == (ROOT_USER, ROOT_ROLE) and read_switch(data).enabled:
            raise Refusal("bad_request", "root keeps the root role while auth is enabled")
        roles = [role for role in user.roles if role != command.role]
    users[command.name] = msgspec.structs.replace(user, roles=roles)
    write_sorted(data, USERS_KEY, users)


def apply_role_command(data: dict[str, str], command: RoleAdd | RoleDelete) -> None:
    roles = read_roles(data)
    if isinstance(command, RoleAdd):
        problem = check_name("role", command.name)
        if problem is not None:
            raise Refusal("bad_request", problem)
        if command.name in roles or command.name == ROOT_ROLE:
            raise Refusal("already_exists", f"role {command.name!r} already exists")
        roles[command.name] = Role(name=command.name)
        write_sorted(data, ROLES_KEY, roles)
        return
    if command.name not in roles:
        raise Refusal("not_found", f"role {command.name!r} does not exist")
    del roles[command.name]
    write_sorted(data, ROLES_KEY, roles)
    # Like etcd: users lose a deleted role (a role added later under the name is new).
    users = read_users(data)
    changed = {
        name: msgspec.structs.replace(user, roles=[r for r in user.roles if r != command.name])
        for name, user in users.items()
        if command.name in user.roles
    }
    if changed:
        users.update(changed)
        write_sorted(data, USERS_KEY, users)


def check_permission(permission: Permission) -> None:
    if permission.kind is PermissionKind.ADMIN:
        if permission.key not in {right.value for right in AdminRight}:
            rights = ", ".join(right.value for right in AdminRight)
            raise Refusal("bad_request", f"admin right {permission.key!r} is not one of {rights}")
        return
    end = permission.range_end
    if end not in ("", FROM_KEY) and end <= permission.key:
        raise Refusal("bad_request", f"range end {end!r} is not after the key {permission.key!r}")


def apply_permission(
    data: dict[str, str], command: RoleGrantPermission | RoleRevokePermission
) -> None:
    roles = read_roles(data)
    if command.name == ROOT_ROLE:
        raise Refusal("bad_request", "the root role grants everything already")
    role = roles.get(command.name)
    if role is None:
        raise Refusal("not_found", f"role {command.name!r} does not exist")
    if isinstance(command, RoleGrantPermission):
        check_permission(command.permission)
        granted = command.permission
        where = (granted.kind, granted.key, granted.range_end)
        kept = [p for p in role.permissions if (p.kind, p.key, p.range_end) != where]
        permissions = [*kept, granted]
    else:
        where = (command.kind, command.key, command.range_end)
        permissions = [p for p in role.permissions if (p.kind, p.key, p.range_end) != where]
        if len(permissions) == len(role.permissions):
            raise Refusal("not_found", f"role {command.name!r} has no such permission")
    permissions.sort(key=lambda p: (p.kind.value, p.key, p.range_end))
    roles[command.name] = Role(name=role.name, permissions=permissions)
    write_sorted(data, ROLES_KEY, roles)


def apply_switch(data: dict[str, str], command: AuthEnable | AuthDisable) -> None:
    current = read_switch(data)
    if isinstance(command, AuthDisable):
        switch = AuthSwitch(enabled=False, node_secret=current.node_secret)
    else:
        root = read_users(data).get(ROOT_USER)
        if root is None or ROOT_ROLE not in root.roles:
            raise Refusal(
                "bad_request", "auth enable needs a user 'root' with the role 'root' first"
            )
        if not command.node_secret:
            raise Refusal("bad_request", "auth enable must carry the node secret")
        if current.enabled:
            return  # already on: the secret the nodes use stays
        switch = AuthSwitch(enabled=True, node_secret=command.node_secret)
    data[SWITCH_KEY] = _encoder.encode(switch).decode()


__all__ = [
    "AUTH_OP",
    "AUTH_PREFIX",
    "ROLES_KEY",
    "SWITCH_KEY",
    "USERS_KEY",
    "AuthCommand",
    "AuthDisable",
    "AuthEnable",
    "RoleAdd",
    "RoleDelete",
    "RoleGrantPermission",
    "RoleRevokePermission",
    "UserAdd",
    "UserChangePassword",
    "UserDelete",
    "UserGrantRole",
    "UserRevokeRole",
    "apply_auth",
    "auth_command",
    "decode_command",
    "encode_command",
    "read_roles",
    "read_switch",
    "read_users",
]

"""`quorumlog user|role|auth`: users, roles, permissions and the auth switch (etcdctl's forms).

    quorumlog user add root:secret && quorumlog user grant-role root root
    quorumlog auth enable --user root:secret
    quorumlog role add app --user root:secret
    quorumlog role grant-permission app readwrite app/ --prefix --user root:secret
    quorumlog role grant-permission app read orders --topic --user root:secret
    quorumlog role grant-permission ops admin membership --user root:secret
    quorumlog user add alice --new-user-password pw --user root:secret
    quorumlog user grant-role alice app --user root:secret

A permission is on one KEY, on the range [KEY, RANGE_END), on every key starting with KEY
(`--prefix`) or from KEY on (`--from-key`); `--topic` makes it one on topic names. The
type `admin` grants a right instead: membership, topics or auth.
"""

from __future__ import annotations

import json

import click
import msgspec

from quorumlog.auth.client import AuthClient
from quorumlog.auth.model import (
    FROM_KEY,
    Access,
    AdminRight,
    Permission,
    PermissionKind,
    prefix_range_end,
)
from quorumlog.cli.kv_commands import ClientSettings, client_options, output_option, print_table

PERMISSION_TYPES = ["read", "write", "readwrite", "admin"]


def auth_client(settings: ClientSettings) -> AuthClient:
    return AuthClient(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
    )


def new_password(given: str | None, name: str) -> str:
    if given:
        return given
    return str(click.prompt(f"Password of {name}", hide_input=True, confirmation_prompt=True))


# --- user ----------------------------------------------------------------------------------


@click.group("user")
def user_group() -> None:
    """Add, delete and list users; grant and revoke their roles."""


@user_group.command("add")
@click.argument("name_and_password", metavar="NAME[:PASSWORD]")
@click.option("--new-user-password", default=None, help="The new user's password.")
@client_options
def user_add(
    settings: ClientSettings, name_and_password: str, new_user_password: str | None
) -> None:
    """Add a user (asks for the password unless given)."""
    name, _, inline = name_and_password.partition(":")
    password = new_password(new_user_password or inline, name)
    with auth_client(settings) as client:
        client.user_add(name, password)
    click.echo(f"User {name} created")


@user_group.command("delete")
@click.argument("name")
@client_options
def user_delete(settings: ClientSettings, name: str) -> None:
    """Delete a user."""
    with auth_client(settings) as client:
        client.user_delete(name)
    click.echo(f"User {name} deleted")


@user_group.command("passwd")
@click.argument("name")
@click.option("--new-user-password", default=None, help="The new password.")
@client_options
def user_passwd(settings: ClientSettings, name: str, new_user_password: str | None) -> None:
    """Change a user's password (its tokens end: its clients authenticate again)."""
    password = new_password(new_user_password, name)
    with auth_client(settings) as client:
        client.user_change_password(name, password)
    click.echo("Password updated")


@user_group.command("grant-role")
@click.argument("name")
@click.argument("role")
@client_options
def user_grant_role(settings: ClientSettings, name: str, role: str) -> None:
    """Grant ROLE to user NAME."""
    with auth_client(settings) as client:
        client.user_grant_role(name, role)
    click.echo(f"Role {role} is granted to user {name}")


@user_group.command("revoke-role")
@click.argument("name")
@click.argument("role")
@client_options
def user_revoke_role(settings: ClientSettings, name: str, role: str) -> None:
    """Revoke ROLE from user NAME."""
    with auth_client(settings) as client:
        client.user_revoke_role(name, role)
    click.echo(f"Role {role} is revoked from user {name}")


@user_group.command("list")
@client_options
def user_list(settings: ClientSettings) -> None:
    """List the users."""
    with auth_client(settings) as client:
        names = client.user_list()
    for name in names:
        click.echo(name)


@user_group.command("get")
@click.argument("name")
@output_option
@client_options
def user_get(settings: ClientSettings, name: str, write_out: str) -> None:
    """Show a user's roles."""
    with auth_client(settings) as client:
        user = client.user_get(name)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(user)))
        return
    click.echo(f"User: {user.name}")
    click.echo(f"Roles: {' '.join(user.roles)}")


# --- role ----------------------------------------------------------------------------------


@click.group("role")
def role_group() -> None:
    """Add, delete and list roles; grant and revoke their permissions."""


@role_group.command("add")
@click.argument("name")
@client_options
def role_add(settings: ClientSettings, name: str) -> None:
    """Add a role."""
    with auth_client(settings) as client:
        client.role_add(name)
    click.echo(f"Role {name} created")


@role_group.command("delete")
@click.argument("name")
@client_options
def role_delete(settings: ClientSettings, name: str) -> None:
    """Delete a role (users holding it lose it)."""
    with auth_client(settings) as client:
        client.role_delete(name)
    click.echo(f"Role {name} deleted")


def permission_place(
    key: str, range_end: str | None, prefix: bool, from_key: bool
) -> tuple[str, str]:
    """(key, range_end) of etcd's forms; UsageError for a mix of them."""
    if sum([range_end is not None, prefix, from_key]) > 1:
        raise click.UsageError("give at most one of RANGE_END, --prefix and --from-key")
    if prefix:
        return key, prefix_range_end(key)
    if from_key:
        return key, FROM_KEY
    return key, range_end or ""


def permission_kind(topic: bool, admin: bool) -> PermissionKind:
    if admin:
        return PermissionKind.ADMIN
    return PermissionKind.TOPIC if topic else PermissionKind.KEY


@role_group.command("grant-permission")
@click.argument("name")
@click.argument("permission_type", type=click.Choice(PERMISSION_TYPES))
@click.argument("key")
@click.argument("range_end", required=False)
@click.option("--prefix", is_flag=True, help="Every key (or topic) starting with KEY.")
@click.option("--from-key", is_flag=True, help="Every key (or topic) from KEY on.")
@click.option("--topic", is_flag=True, help="On topic names, not keys.")
@client_options
def role_grant_permission(
    settings: ClientSettings,
    name: str,
    permission_type: str,
    key: str,
    range_end: str | None,
    prefix: bool,
    from_key: bool,
    topic: bool,
) -> None:
    """Grant read, write or readwrite on KEY [RANGE_END] (or an admin right) to role NAME."""
    admin = permission_type == "admin"
    if admin:
        rights = [right.value for right in AdminRight]
        if key not in rights or range_end or prefix or from_key or topic:
            raise click.UsageError(f"admin takes one right: {', '.join(rights)}")
        access, start, end = Access.READWRITE, key, ""
    else:
        access = Access(permission_type)
        start, end = permission_place(key, range_end, prefix, from_key)
    permission = Permission(permission_kind(topic, admin), access, start, end)
    with auth_client(settings) as client:
        client.role_grant_permission(name, permission)
    click.echo(f"Role {name} updated")


@role_group.command("revoke-permission")
@click.argument("name")
@click.argument("key")
@click.argument("range_end", required=False)
@click.option("--prefix", is_flag=True)
@click.option("--from-key", is_flag=True)
@click.option("--topic", is_flag=True, help="A permission on topic names.")
@click.option("--admin", is_flag=True, help="An admin right (KEY names it).")
@client_options
def role_revoke_permission(
    settings: ClientSettings,
    name: str,
    key: str,
    range_end: str | None,
    prefix: bool,
    from_key: bool,
    topic: bool,
    admin: bool,
) -> None:
    """Revoke the permission on KEY [RANGE_END] from role NAME."""
    start, end = permission_place(key, range_end, prefix, from_key)
    with auth_client(settings) as client:
        client.role_revoke_permission(name, permission_kind(topic, admin), start, end)
    click.echo(f"Permission of key {key} is revoked from role {name}")


@role_group.command("list")
@client_options
def role_list(settings: ClientSettings) -> None:
    """List the roles."""
    with auth_client(settings) as client:
        names = client.role_list()
    for name in names:
        click.echo(name)


@role_group.command("get")
@click.argument("name")
@output_option
@client_options
def role_get(settings: ClientSettings, name: str, write_out: str) -> None:
    """Show a role's permissions."""
    with auth_client(settings) as client:
        role = client.role_get(name)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(role)))
        return
    click.echo(f"Role {role.name}")
    rows = [
        [
            permission.kind.value,
            permission.access.value,
            permission.key,
            shown_end(permission.range_end),
        ]
        for permission in role.permissions
    ]
    print_table(["kind", "type", "key", "range end"], rows)


def shown_end(range_end: str) -> str:
    if range_end == FROM_KEY:
        return "(to the end)"
    return range_end


# --- auth ----------------------------------------------------------------------------------


@click.group("auth")
def auth_group() -> None:
    """Turn authentication on or off, or show whether it is on."""


@auth_group.command("enable")
@client_options
def auth_enable(settings: ClientSettings) -> None:
    """Enable auth (a user root with the role root must exist)."""
    with auth_client(settings) as client:
        client.auth_enable()
    click.echo("Authentication Enabled")


@auth_group.command("disable")
@client_options
def auth_disable(settings: ClientSettings) -> None:
    """Disable auth (needs root's credentials while it is on)."""
    with auth_client(settings) as client:
        client.auth_disable()
    click.echo("Authentication Disabled")


@auth_group.command("status")
@client_options
def auth_status(settings: ClientSettings) -> None:
    """Print whether auth is enabled."""
    with auth_client(settings) as client:
        enabled = client.auth_status()
    click.echo(f"Authentication Status: {'true' if enabled else 'false'}")


COMMANDS = [user_group, role_group, auth_group]

__all__ = ["COMMANDS"]

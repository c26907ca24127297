"""Auth commands applied on the KV machine: the rules, and determinism across replicas."""

from __future__ import annotations

import random

from quorumlog.auth.commands import (
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
    auth_command,
    read_switch,
    read_users,
)
from quorumlog.auth.model import Access, Permission, PermissionKind, hash_password, verify_password
from quorumlog.auth.state import AuthState
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine

HASH = hash_password("secret", iterations=10, salt=b"0" * 16)


class Replica:
    def __init__(self) -> None:
        self.machine = KVStateMachine()
        self.index = 0
        self.sequence = 0

    def run(self, command: AuthCommand) -> tuple[bool, str | None]:
        self.index += 1
        self.sequence += 1
        entry = KVEntry(
            timestamp_ms=1_000 * self.index,
            batches=[
                ClientBatch(
                    client_id="admin",
                    first_unacknowledged=self.sequence,
                    commands=[auth_command(command, self.sequence)],
                )
            ],
        )
        [[result]] = self.machine.apply(self.index, encode_entry(entry))
        return result.ok, result.value


def test_auth_enable_needs_root_with_the_root_role() -> None:
    replica = Replica()
    ok, message = replica.run(AuthEnable(node_secret="s"))
    assert not ok and message is not None and "root" in message
    assert replica.run(UserAdd(name="root", password_hash=HASH)) == (True, None)
    assert not replica.run(AuthEnable(node_secret="s"))[0]
    assert replica.run(UserGrantRole(name="root", role="root")) == (True, None)
    assert replica.run(AuthEnable(node_secret="s")) == (True, None)
    assert read_switch(replica.machine.data).enabled
    # While enabled, root and its role stay.
    assert not replica.run(UserDelete(name="root"))[0]
    assert not replica.run(UserRevokeRole(name="root", role="root"))[0]
    assert replica.run(AuthDisable()) == (True, None)
    assert not read_switch(replica.machine.data).enabled
    assert replica.run(UserDelete(name="root")) == (True, None)


def test_the_log_never_carries_a_password() -> None:
    replica = Replica()
    ok, message = replica.run(UserAdd(name="alice", password="clear", password_hash=HASH))
    assert not ok and message is not None and message.startswith("bad_request")
    assert "clear" not in str(replica.machine.data)
    assert replica.run(UserAdd(name="alice", password_hash=HASH))[0]
    stored = read_users(replica.machine.data)["alice"].password
    assert verify_password("secret", stored) and not verify_password("Secret", stored)


def test_roles_permissions_and_deletion() -> None:
    replica = Replica()
    permission = Permission(PermissionKind.KEY, Access.READWRITE, "app/", "app0")
    assert replica.run(UserAdd(name="alice", password_hash=HASH))[0]
    assert not replica.run(UserGrantRole(name="alice", role="app"))[0]  # no such role
    assert replica.run(RoleAdd(name="app"))[0]
    assert not replica.run(RoleAdd(name="app"))[0]
    assert not replica.run(RoleAdd(name="__internal"))[0]
    assert replica.run(RoleGrantPermission(name="app", permission=permission))[0]
    assert replica.run(UserGrantRole(name="alice", role="app"))[0]
    state = AuthState.from_data(replica.machine.data)
    rights = state.rights_of("alice")
    assert rights is not None and rights.permits(PermissionKind.KEY, "app/x", Access.WRITE)
    assert replica.run(
        RoleRevokePermission(name="app", kind=PermissionKind.KEY, key="app/", range_end="app0")
    )[0]
    assert replica.run(RoleDelete(name="app"))[0]
    assert read_users(replica.machine.data)["alice"].roles == []


def random_command(rng: random.Random) -> AuthCommand:
    user = rng.choice(["root", "alice", "bob"])
    role = rng.choice(["root", "app", "ops"])
    permission = Permission(
        rng.choice([PermissionKind.KEY, PermissionKind.TOPIC]),
        rng.choice(list(Access)),
        rng.choice(["a", "b/", "c"]),
        rng.choice(["", "\0", "d"]),
    )
    choices: list[AuthCommand] = [
        UserAdd(name=user, password_hash=HASH),
        UserDelete(name=user),
        UserChangePassword(
            name=user, password_hash=hash_password("x", 10, bytes([rng.randrange(256)]) * 16)
        ),
        UserGrantRole(name=user, role=role),
        UserRevokeRole(name=user, role=role),
        RoleAdd(name=role),
        RoleDelete(name=role),
        RoleGrantPermission(name=role, permission=permission),
        RoleRevokePermission(
            name=role, kind=permission.kind, key=permission.key, range_end=permission.range_end
        ),
        AuthEnable(node_secret="secret"),
        AuthDisable(),
    ]
    return rng.choice(choices)


def test_replicas_applying_the_same_commands_end_in_the_same_bytes() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        commands = [random_command(rng) for _ in range(60)]
        first, second = Replica(), Replica()
        results = [first.run(command) for command in commands]
        assert [second.run(command) for command in commands] == results, seed
        assert first.machine.snapshot() == second.machine.snapshot(), seed
        restored = KVStateMachine()
        restored.restore(first.machine.snapshot())
        assert (
            AuthState.from_data(restored.data).users
            == AuthState.from_data(first.machine.data).users
        )
        assert restored.auth_generation > 0


def test_garbage_under_the_auth_prefix_stops_nothing() -> None:
    """Written as a plain key while auth was off (before "__" keys were refused)."""
    replica = Replica()
    replica.machine.store.put("__auth/switch", b"not json")
    replica.machine.store.put("__auth/users", b"[1]")
    replica.machine.store.finish()
    ok, message = replica.run(AuthEnable(node_secret="s"))
    assert not ok and message is not None and message.startswith("bad_request")
    assert not AuthState.from_data(replica.machine.data).enabled

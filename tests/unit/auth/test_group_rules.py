"""Consumer-group requests against a user's rights: join, commit and reset need read on
each topic named; delete needs the "topics" admin right; the coordinator's own commands
are root's."""

from __future__ import annotations

from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import Access, Permission, PermissionKind, Role
from quorumlog.auth.rules import request_denial
from quorumlog.codec import wire
from quorumlog.stream import group_model


def request(*commands: group_model.GroupCommand) -> wire.GroupCoordinatorRequest:
    return wire.GroupCoordinatorRequest(
        request_id=1, commands=group_model.encode_commands(list(commands))
    )


def rights(*permissions: Permission) -> Rights:
    return Rights([Role(name="r", permissions=list(permissions))], ["r"])


READER = rights(Permission(PermissionKind.TOPIC, Access.READ, "orders"))


def test_joining_and_committing_need_read_on_every_topic_named() -> None:
    join = group_model.JoinGroup("g", "m1", "c1", ["orders"])
    assert request_denial(READER, request(join)) is None
    other = group_model.JoinGroup("g", "m1", "c1", ["orders", "payments"])
    assert "payments" in str(request_denial(READER, request(other)))
    commit = group_model.CommitOffsets(
        "g", "m1", 1, [group_model.PartitionOffset("payments", 0, 5)]
    )
    assert "payments" in str(request_denial(READER, request(commit)))
    assert request_denial(rights(), request(join)) is not None


def test_deleting_a_group_needs_the_topics_right_and_expiry_is_roots() -> None:
    delete = group_model.DeleteGroup("g")
    assert "topics" in str(request_denial(READER, request(delete)))
    admin = rights(Permission(PermissionKind.ADMIN, Access.READWRITE, "topics"))
    assert request_denial(admin, request(delete)) is None
    expire = group_model.ExpireMembers("g", ["m1"])
    assert request_denial(READER, request(expire)) is not None
    assert request_denial(Rights([], ["root"]), request(expire)) is None
    # Importing the previous release's offsets would let a user set any group's offsets.
    imported = group_model.ImportOffsets("g", [group_model.PartitionOffset("orders", 0, 7)])
    admin_reader = rights(
        Permission(PermissionKind.TOPIC, Access.READ, "orders"),
        Permission(PermissionKind.ADMIN, Access.READWRITE, "topics"),
    )
    assert "only root" in str(request_denial(admin_reader, request(imported)))
    assert request_denial(Rights([], ["root"]), request(imported)) is None
    describe = group_model.DescribeGroup("g")
    assert request_denial(rights(), request(describe, group_model.ListGroups())) is None

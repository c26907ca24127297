"""The permission matcher: etcd's key, range, prefix and from-key rules."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.auth.matcher import Rights, merge_intervals
from quorumlog.auth.model import (
    FROM_KEY,
    Access,
    AdminRight,
    Permission,
    PermissionKind,
    Role,
    prefix_range_end,
)

KEY = PermissionKind.KEY
TOPIC = PermissionKind.TOPIC
keys = st.text(alphabet="ab\0z", max_size=4)


def rights_of(*permissions: Permission) -> Rights:
    return Rights([Role(name="r", permissions=list(permissions))], ["r"])


def grant(key: str, range_end: str = "", access: Access = Access.READWRITE) -> Permission:
    return Permission(kind=KEY, access=access, key=key, range_end=range_end)


def in_permission(permission: Permission, key: str) -> bool:
    """etcd's rule, written out plainly."""
    if permission.range_end == "":
        return key == permission.key
    if permission.range_end == FROM_KEY:
        return key >= permission.key
    return permission.key <= key < permission.range_end


def test_one_key_grants_that_key_only() -> None:
    rights = rights_of(grant("app/x"))
    assert rights.permits(KEY, "app/x", Access.READ)
    assert not rights.permits(KEY, "app/x2", Access.READ)
    assert not rights.permits(KEY, "app/", Access.READ)


def test_prefix_grants_keys_starting_with_it() -> None:
    rights = rights_of(grant("app/", prefix_range_end("app/")))
    assert rights.permits(KEY, "app/x", Access.WRITE)
    assert rights.permits(KEY, "app/", Access.WRITE)
    assert not rights.permits(KEY, "other/x", Access.WRITE)
    assert not rights.permits(KEY, "app", Access.WRITE)
    assert not rights.permits(TOPIC, "app/x", Access.WRITE)


def test_access_kinds() -> None:
    rights = rights_of(grant("k", access=Access.READ))
    assert rights.permits(KEY, "k", Access.READ)
    assert not rights.permits(KEY, "k", Access.WRITE)


def test_admin_rights_and_root() -> None:
    rights = rights_of(Permission(kind=PermissionKind.ADMIN, access=Access.READWRITE, key="topics"))
    assert rights.has_admin(AdminRight.TOPICS)
    assert not rights.has_admin(AdminRight.MEMBERSHIP)
    root = Rights([], ["root"])
    assert root.has_admin(AdminRight.AUTH) and root.permits(KEY, "anything", Access.WRITE)


def test_adjacent_grants_cover_a_range_together() -> None:
    rights = rights_of(grant("a", "c"), grant("c", "e"))
    assert rights.permits_range(KEY, "b", "d", Access.READ)
    assert not rights.permits_range(KEY, "b", "f", Access.READ)
    assert not rights.permits_range(KEY, "b", None, Access.READ)
    assert rights_of(grant("a", FROM_KEY)).permits_range(KEY, "b", None, Access.READ)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(keys, st.sampled_from(["", FROM_KEY, "prefix", "range"]), keys), max_size=4),
    keys,
)
def test_single_key_matches_etcds_rule(grants: list[tuple[str, str, str]], key: str) -> None:
    permissions = []
    for start, form, other in grants:
        if form == "prefix":
            end = prefix_range_end(start)
        elif form == "range":
            end = other if other > start else start + "z"
        else:
            end = form
        permissions.append(grant(start, end))
    expected = any(in_permission(permission, key) for permission in permissions)
    assert rights_of(*permissions).permits(KEY, key, Access.READ) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(keys, keys), max_size=4),
    keys,
    st.one_of(st.none(), keys),
    st.lists(keys, max_size=8),
)
def test_a_granted_range_grants_every_key_in_it(
    grants: list[tuple[str, str]], start: str, end: str | None, probes: list[str]
) -> None:
    permissions = [grant(a, b) for a, b in grants if b > a]
    rights = rights_of(*permissions)
    if rights.permits_range(KEY, start, end, Access.READ):
        for key in [start, *probes]:
            if key >= start and (end is None or key < end):
                assert rights.permits(KEY, key, Access.READ)


@given(st.lists(st.tuples(keys, st.one_of(st.none(), keys)), max_size=6))
def test_merged_intervals_are_sorted_and_disjoint(intervals: list[tuple[str, str | None]]) -> None:
    merged = merge_intervals([(a, b) for a, b in intervals if b is None or b > a])
    for (_, first_end), (second_start, _) in itertools.pairwise(merged):
        assert first_end is not None and first_end < second_start


def test_prefix_of_everything_is_from_key() -> None:
    assert prefix_range_end("") == FROM_KEY
    assert prefix_range_end("ab") == "ac"

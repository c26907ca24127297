"""Whether a user's roles grant an access: the permission matcher.

Each permission is a half-open interval of keys (or topic names): [key, key + "\\0") for
one key, [key, range_end) for a range, [key, ∞) for FROM_KEY. `Rights` gathers a user's
intervals per (kind, access) once, merged and sorted, so a check is a bisection. A range
request (a scan) is granted when one merged interval covers all of it, as etcd's
`isRangeOpPermitted` decides (two adjacent grants together cover the range between them).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Iterable

from quorumlog.auth.model import (
    FROM_KEY,
    ROOT_ROLE,
    Access,
    AdminRight,
    Permission,
    PermissionKind,
    Role,
)

Interval = tuple[str, str | None]
"""[start, end); end None: unbounded."""


def permission_interval(permission: Permission) -> Interval | None:
    """The keys a permission covers; None if it covers none (an empty or inverted range)."""
    if permission.range_end == "":
        return permission.key, permission.key + "\0"
    if permission.range_end == FROM_KEY:
        return permission.key, None
    if permission.range_end <= permission.key:
        return None
    return permission.key, permission.range_end


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, with overlapping and touching intervals joined."""
    merged: list[Interval] = []
    for start, end in sorted(intervals, key=lambda interval: interval[0]):
        if merged:
            last_start, last_end = merged[-1]
            if last_end is None:
                continue  # the last one already runs to the end
            if start <= last_end:
                new_end = None if end is None else max(end, last_end)
                merged[-1] = (last_start, new_end)
                continue
        merged.append((start, end))
    return merged


class IntervalSet:
    def __init__(self, intervals: Iterable[Interval]) -> None:
        self.intervals = merge_intervals(intervals)
        self.starts = [start for start, _ in self.intervals]

    def covering(self, key: str) -> Interval | None:
        position = bisect.bisect_right(self.starts, key) - 1
        if position < 0:
            return None
        interval = self.intervals[position]
        end = interval[1]
        return interval if end is None or key < end else None

    def contains(self, key: str) -> bool:
        return self.covering(key) is not None

    def contains_range(self, start: str, end: str | None) -> bool:
        """Every key in [start, end) (end None: unbounded); an empty range always is."""
        if end is not None and end <= start:
            return True
        interval = self.covering(start)
        if interval is None:
            return False
        interval_end = interval[1]
        if interval_end is None:
            return True
        return end is not None and end <= interval_end


class Rights:
    """What one user may do, from its roles (compiled once per change of the auth state)."""

    def __init__(self, roles: Iterable[Role], role_names: Iterable[str]) -> None:
        names = set(role_names)
        self.is_root = ROOT_ROLE in names
        granted = [role for role in roles if role.name in names]
        self.admin: set[AdminRight] = set()
        collected: dict[tuple[PermissionKind, Access], list[Interval]] = {}
        for role in granted:
            for permission in role.permissions:
                if permission.kind is PermissionKind.ADMIN:
                    # An unknown right's name grants nothing.
                    with contextlib.suppress(ValueError):
                        self.admin.add(AdminRight(permission.key))
                    continue
                interval = permission_interval(permission)
                if interval is None:
                    continue
                for access in (Access.READ, Access.WRITE):
                    if permission.access.covers(access):
                        collected.setdefault((permission.kind, access), []).append(interval)
        self.sets = {key: IntervalSet(intervals) for key, intervals in collected.items()}

    def permits(self, kind: PermissionKind, name: str, access: Access) -> bool:
        if self.is_root:
            return True
        found = self.sets.get((kind, access))
        return found is not None and found.contains(name)

    def permits_range(
        self, kind: PermissionKind, start: str, end: str | None, access: Access
    ) -> bool:
        if self.is_root:
            return True
        found = self.sets.get((kind, access))
        if found is None:
            return end is not None and end <= start
        return found.contains_range(start, end)

    def has_admin(self, right: AdminRight) -> bool:
        return self.is_root or right in self.admin


ALL_RIGHTS = Rights([], [ROOT_ROLE])
"""What a node's own identity (and everyone, when auth is off) may do."""

__all__ = ["ALL_RIGHTS", "IntervalSet", "Rights", "merge_intervals", "permission_interval"]

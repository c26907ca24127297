"""Where shards go when groups join or leave: even counts, fewest moves, same on every replica.

Every controller replica runs `rebalance` on the same input and must get the same answer,
so nothing here depends on the iteration order of a dict or set: groups are visited in gid
order and shards in shard order.

With S shards and G groups every group ends with S // G or S // G + 1 shards. A shard
stays where it is whenever it can; the only shards that move are

* shards with no live owner (unassigned, or owned by a group that left), and
* a group's shards beyond its target count (its highest-numbered ones).

Which groups get the S % G targets of one extra shard is what makes the moves fewest: they
go to the groups holding the most shards now (ties: lower gid), because only a group that
already holds more than S // G can keep a shard thanks to a higher target. The number of
moved shards then equals `moves_lower_bound`, and no assignment with even counts moves fewer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quorumlog.raft.invariants import require
from quorumlog.shard.config import UNASSIGNED_GID


def rebalance(shards: Sequence[int], groups: Iterable[int]) -> list[int]:
    """The new owner of every shard, given current owners and the gids that exist now.

    `groups` is any collection of gids (a `ShardConfiguration.groups` dict works); owners
    not in it count as gone. With no group, every shard becomes `UNASSIGNED_GID`.
    """
    gids = sorted(set(groups))
    require(UNASSIGNED_GID not in gids, f"gid {UNASSIGNED_GID} cannot be a group")
    if not gids:
        return [UNASSIGNED_GID] * len(shards)
    owned = _owned_shards(shards, gids)
    targets = _target_counts(owned, len(shards))
    pool: list[int] = [shard for shard, owner in enumerate(shards) if owner not in owned]
    for gid in gids:
        excess = len(owned[gid]) - targets[gid]
        if excess > 0:
            # Keep the lowest-numbered shards and release the rest: any fixed rule works,
            # it only has to be the same on every replica.
            pool.extend(owned[gid][-excess:])
            del owned[gid][-excess:]
    pool.sort()
    result = list(shards)
    for shard in pool:
        receiver = _least_loaded_below_target(owned, targets, gids)
        owned[receiver].append(shard)
        result[shard] = receiver
    for gid in gids:
        require(
            len(owned[gid]) == targets[gid],
            f"rebalance left gid {gid} with {len(owned[gid])} shards, target {targets[gid]}",
        )
    return result


def moves_lower_bound(shards: Sequence[int], groups: Iterable[int]) -> int:
    """The fewest shards any balanced assignment must move from `shards` (for tests, metrics).

    Each live group can keep up to S // G of its shards, and S % G of them one more — but
    only groups holding more than S // G gain by that.
    """
    gids = set(groups) - {UNASSIGNED_GID}
    if not gids:
        return sum(1 for owner in shards if owner != UNASSIGNED_GID)
    base, extra = divmod(len(shards), len(gids))
    counts = dict.fromkeys(gids, 0)
    for owner in shards:
        if owner in counts:
            counts[owner] += 1
    kept = sum(min(count, base) for count in counts.values())
    kept += min(extra, sum(1 for count in counts.values() if count > base))
    return len(shards) - kept


def _owned_shards(shards: Sequence[int], gids: list[int]) -> dict[int, list[int]]:
    """gid → its shards ascending, for live gids only (insertion in gid order)."""
    owned: dict[int, list[int]] = {gid: [] for gid in gids}
    for shard, owner in enumerate(shards):
        shard_list = owned.get(owner)
        if shard_list is not None:
            shard_list.append(shard)
    return owned


def _target_counts(owned: dict[int, list[int]], shard_count: int) -> dict[int, int]:
    base, extra = divmod(shard_count, len(owned))
    targets = dict.fromkeys(owned, base)
    by_load = sorted(owned, key=lambda gid: (-len(owned[gid]), gid))
    for gid in by_load[:extra]:
        targets[gid] = base + 1
    return targets


def _least_loaded_below_target(
    owned: dict[int, list[int]], targets: dict[int, int], gids: list[int]
) -> int:
    """The group still short of its target holding the fewest shards (ties: lower gid)."""
    best_gid = UNASSIGNED_GID
    best_count = -1
    for gid in gids:
        count = len(owned[gid])
        if count < targets[gid] and (best_count < 0 or count < best_count):
            best_gid, best_count = gid, count
    require(best_gid != UNASSIGNED_GID, "rebalance has a shard to place but no group short")
    return best_gid


__all__ = ["moves_lower_bound", "rebalance"]

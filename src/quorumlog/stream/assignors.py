"""Partition assignors of consumer groups: who of a group's members reads which partition.

Both are pure functions of their inputs (members sorted by id, partitions sorted), so every
replica of the group coordinator that applies the same rebalance computes the same
assignment. Every partition of a subscribed topic goes to exactly one member subscribed to
its topic; a topic nobody subscribes to is not assigned.

- "range" (Kafka's RangeAssignor): per topic, the members subscribed to it in id order
  each take a contiguous range; the first `partitions % members` take one more.
- "cooperative-sticky" (Kafka's CooperativeStickyAssignor, the default): each member keeps
  what it owned as far as balance allows; partitions without an owner go to the least
  loaded eligible member; then single partitions move from the most to the least loaded
  member until no member has two more than another that could take one of its partitions.
  A member joining takes partitions only from others' surplus, a member leaving gives its
  partitions away and nothing else moves: the moves are as few as balance needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TopicPartition = tuple[str, int]

RANGE = "range"
COOPERATIVE_STICKY = "cooperative-sticky"
ASSIGNORS = (RANGE, COOPERATIVE_STICKY)
ASSIGNOR_DEFAULT = COOPERATIVE_STICKY
MOVES_MAX_FACTOR = 4
"""The balancing loop of the sticky assignor moves at most this many times the partition
count (each move lowers the imbalance, so far fewer are ever needed): a bound, not a limit
that is reached."""


def all_partitions(
    subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int]
) -> list[TopicPartition]:
    """Every partition of a topic some member subscribes to, sorted."""
    topics = sorted({topic for topics in subscriptions.values() for topic in topics})
    return [
        (topic, partition)
        for topic in topics
        for partition in range(max(partition_counts.get(topic, 0), 0))
    ]


def assign_range(
    subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """Kafka's range assignment (module docstring)."""
    assignment: dict[str, list[TopicPartition]] = {member: [] for member in sorted(subscriptions)}
    topics = sorted({topic for topics in subscriptions.values() for topic in topics})
    for topic in topics:
        members = [member for member in sorted(subscriptions) if topic in subscriptions[member]]
        count = max(partition_counts.get(topic, 0), 0)
        share, extra = divmod(count, len(members))
        start = 0
        for position, member in enumerate(members):
            size = share + (1 if position < extra else 0)
            assignment[member].extend(
                (topic, partition) for partition in range(start, start + size)
            )
            start += size
    return assignment


def assign_sticky(
    subscriptions: Mapping[str, Sequence[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> dict[str, list[TopicPartition]]:
    """The cooperative-sticky assignment (module docstring); `previous` is what each member
    owned before (members gone and partitions gone are ignored)."""
    members = sorted(subscriptions)
    subscribed = {member: set(subscriptions[member]) for member in members}
    partitions = all_partitions(subscriptions, partition_counts)
    existing = set(partitions)
    owned: dict[str, set[TopicPartition]] = {member: set() for member in members}
    owner: dict[TopicPartition, str] = {}
    for member in members:
        for partition in sorted(previous.get(member, ())):
            if (
                partition in existing
                and partition not in owner
                and partition[0] in subscribed[member]
            ):
                owner[partition] = member
                owned[member].add(partition)
    for partition in partitions:
        if partition not in owner:
            eligible = [member for member in members if partition[0] in subscribed[member]]
            taker = min(eligible, key=lambda member: (len(owned[member]), member))
            owner[partition] = taker
            owned[taker].add(partition)
    balance(members, subscribed, owned, len(partitions) * MOVES_MAX_FACTOR)
    return {member: sorted(owned[member]) for member in members}


def balance(
    members: list[str],
    subscribed: dict[str, set[str]],
    owned: dict[str, set[TopicPartition]],
    moves_max: int,
) -> None:
    """Move single partitions from the most loaded member to a member with at least two
    fewer that may take it, until none can move (or `moves_max`, never reached)."""
    for _ in range(moves_max):
        move = next_move(members, subscribed, owned)
        if move is None:
            return
        giver, taker, partition = move
        owned[giver].discard(partition)
        owned[taker].add(partition)


def next_move(
    members: list[str], subscribed: dict[str, set[str]], owned: dict[str, set[TopicPartition]]
) -> tuple[str, str, TopicPartition] | None:
    by_load_descending = sorted(members, key=lambda member: (-len(owned[member]), member))
    by_load_ascending = sorted(members, key=lambda member: (len(owned[member]), member))
    for giver in by_load_descending:
        for taker in by_load_ascending:
            if len(owned[taker]) + 1 >= len(owned[giver]):
                break
            for partition in sorted(owned[giver]):
                if partition[0] in subscribed[taker]:
                    return giver, taker, partition
    return None


def assign(
    assignor: str,
    subscriptions: Mapping[str, Sequence[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> dict[str, list[TopicPartition]]:
    """The assignment `assignor` makes; ValueError for an unknown assignor."""
    if not subscriptions:
        return {}
    if assignor == RANGE:
        return assign_range(subscriptions, partition_counts)
    if assignor == COOPERATIVE_STICKY:
        return assign_sticky(subscriptions, partition_counts, previous)
    raise ValueError(f"the assignor is one of {', '.join(ASSIGNORS)}, not {assignor!r}")


__all__ = [
    "ASSIGNORS",
    "ASSIGNOR_DEFAULT",
    "COOPERATIVE_STICKY",
    "RANGE",
    "TopicPartition",
    "all_partitions",
    "assign",
    "assign_range",
    "assign_sticky",
]

"""A commit that arrives after a later commit of the same member changes nothing.

Found by the consumer-group simulator (`quorumlog sim groups`): a member's commit was
duplicated on the network; the copy was applied after the member's next commit had been
acknowledged, and took the offset back (an acknowledged commit lost; the partition read
again from the older position). A retried attempt that was only delayed does the same.
Commits now carry the member's count of them (`CommitOffsets.sequence`)."""

from __future__ import annotations

import asyncio
from typing import cast

from quorumlog.codec.feature_levels import GROUP_FENCING_LEVEL
from quorumlog.stream.client_common import StreamTransport
from quorumlog.stream.group_client import CoordinatorLink
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    CommitOffsets,
    GroupCommand,
    GroupResult,
    JoinGroup,
    PartitionOffset,
)
from quorumlog.testing.sim.groups.runner import run_seed


def member_of_one_partition() -> tuple[GroupCoordinatorMachine, int]:
    machine = fenced_machine()
    joined = machine.execute(JoinGroup("g", "m", "m", ["t"], partition_counts={"t": 1}))
    assert joined.assignment == [("t", 0)]
    return machine, joined.generation


def commit(generation: int, offset: int, sequence: int) -> CommitOffsets:
    return CommitOffsets("g", "m", generation, [PartitionOffset("t", 0, offset)], sequence)


def test_a_commit_older_than_the_members_last_changes_nothing() -> None:
    machine, generation = member_of_one_partition()
    older = commit(generation, 55, 1)
    assert machine.execute(older).ok
    assert machine.execute(commit(generation, 64, 2)).ok

    late_copy = machine.execute(older)

    assert late_copy.ok  # superseded, not refused: the member moved on
    assert machine.groups["g"].offsets == {"t": {0: 64}}


def test_unnumbered_commits_are_stored_as_before() -> None:
    machine, generation = member_of_one_partition()
    assert machine.execute(commit(generation, 64, 0)).ok
    assert machine.execute(commit(generation, 55, 0)).ok
    assert machine.groups["g"].offsets == {"t": {0: 55}}


def test_the_link_numbers_each_members_commits() -> None:
    link = CoordinatorLink(cast(StreamTransport, None), ["n1:2379"])
    sent: list[GroupCommand] = []

    async def checked(what: str, command: GroupCommand, group: str | None) -> GroupResult:
        sent.append(command)
        return GroupResult(ok=True)

    link.checked = checked  # type: ignore[method-assign]

    async def commits() -> None:
        await link.commit("g", {("t", 0): 5}, "m", 1)
        await link.commit("g", {("t", 0): 9}, "m", 1)
        await link.commit("g", {("t", 0): 9}, "other", 1)
        await link.commit("g", {("t", 0): 9})  # from outside the group: unnumbered

    asyncio.run(commits())
    assert [cast(CommitOffsets, command).sequence for command in sent] == [1, 2, 1, 0]


def test_the_seed_that_found_it_keeps_every_invariant() -> None:
    result = run_seed(793, capture_trace=False)
    assert result.ok, f"{result.replay_command}\n{result.failure}"


def fenced_machine() -> GroupCoordinatorMachine:
    """A machine whose log has committed the feature level of the fencing (as a cluster
    whose every node runs this release does: codec/feature_levels.py)."""
    machine = GroupCoordinatorMachine()
    machine.raise_level(GROUP_FENCING_LEVEL)
    return machine

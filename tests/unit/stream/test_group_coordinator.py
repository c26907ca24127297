"""The consumer-group coordinator machine: deterministic apply, generations, fencing of
commits, and the operator's refusals while a group has live members."""

from __future__ import annotations

import random

from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    NO_GENERATION,
    CommitOffsets,
    DeleteGroup,
    DescribeGroup,
    ExpireMembers,
    GroupCommand,
    GroupEntry,
    GroupResult,
    ImportOffsets,
    JoinGroup,
    LeaveGroup,
    PartitionOffset,
    Refusal,
    ResetOffsets,
    UpdatePartitions,
    encode_entry,
)


class Log:
    """A machine fed one command per entry, as the coordinator's log would."""

    def __init__(self) -> None:
        self.machine = GroupCoordinatorMachine()
        self.index = 0

    def run(self, command: GroupCommand) -> GroupResult:
        self.index += 1
        entry = encode_entry(GroupEntry(timestamp_ms=self.index, batches=[[command]]))
        [[result]] = self.machine.apply(self.index, entry)
        return result


ALL = [("t", 0), ("t", 1), ("t", 2)]


def join(
    member: str,
    topics: list[str] | None = None,
    partitions: int = 3,
    owned: list[tuple[str, int]] | None = None,
) -> JoinGroup:
    return JoinGroup(
        "g",
        member,
        f"client-{member}",
        topics or ["t"],
        10_000,
        partition_counts={"t": partitions},
        owned=owned,
    )


def test_two_members_split_three_partitions_and_the_survivor_takes_all() -> None:
    log = Log()
    first = log.run(join("a"))
    assert first.ok and first.generation == 1
    assert first.assignment == ALL
    second = log.run(join("b", owned=[]))
    assert (second.generation, second.assignment, second.rebalancing) == (2, [], True)
    heartbeat = log.run(join("a", owned=ALL))  # still reads all three: changes nothing
    assert heartbeat.generation == 2 and len(heartbeat.assignment) == 2  # sticky: keeps two
    released = log.run(join("a", owned=heartbeat.assignment))  # revoked the third
    assert (released.generation, released.rebalancing) == (3, False)
    taken = log.run(join("b", owned=[]))
    assert sorted(released.assignment + taken.assignment) == ALL
    assert log.run(ExpireMembers("g", ["b"])).generation == 4
    assert log.run(join("a", owned=released.assignment)).assignment == ALL


def test_a_moved_partition_waits_for_its_owner_to_let_go_and_may_be_committed_meanwhile() -> None:
    log = Log()
    log.run(join("a", owned=[]))
    withheld = log.run(join("b", owned=[]))
    state = log.machine.groups["g"]
    [moving] = state.members["a"].revoking
    assert withheld.assignment == [] and moving not in state.members["a"].assignment
    # The owner's last commit of the partition it is giving up is taken, in the new
    # generation; the member it goes to may not commit it yet.
    last = log.run(CommitOffsets("g", "a", withheld.generation, [PartitionOffset(*moving, 7)]))
    assert last.ok
    early = log.run(CommitOffsets("g", "b", withheld.generation, [PartitionOffset(*moving, 1)]))
    assert early.refusal is Refusal.NOT_ASSIGNED
    log.run(join("a", owned=state.members["a"].assignment))
    after = log.run(CommitOffsets("g", "a", withheld.generation, [PartitionOffset(*moving, 9)]))
    assert after.refusal is Refusal.ILLEGAL_GENERATION
    assert moving in log.run(join("b", owned=[])).assignment
    # An owner that leaves instead frees what it was giving up at once.
    log.run(join("c", owned=[]))
    [giving] = [m for m in state.members.values() if m.revoking]
    log.run(LeaveGroup("g", giving.member_id))
    assert all(not member.revoking for member in state.members.values())
    held = [p for member in state.members.values() for p in member.assignment]
    assert sorted(held) == ALL


def test_a_hand_over_completes_when_either_side_expires_or_leaves() -> None:
    """A partition withheld from its new owner until the old one lets go: if the old owner
    expires or leaves (a consumer past its max_poll_interval_ms leaves), the new owner gets
    it in the next generation; if the new owner goes, the old one keeps it."""
    for removal in ("expire", "leave"):
        log = Log()
        log.run(join("a", owned=[]))
        assert log.run(join("b", owned=[])).assignment == []
        state = log.machine.groups["g"]
        assert state.members["a"].revoking
        if removal == "expire":
            log.run(ExpireMembers("g", ["a"]))
        else:
            log.run(LeaveGroup("g", "a"))
        taken = log.run(join("b", owned=[]))
        assert (taken.assignment, taken.rebalancing) == (ALL, False), removal
        assert not state.members["b"].revoking
    log = Log()
    log.run(join("a", owned=[]))
    log.run(join("b", owned=[]))
    log.run(ExpireMembers("g", ["b"]))
    kept = log.run(join("a", owned=ALL))
    assert (kept.assignment, kept.rebalancing) == (ALL, False)
    assert not log.machine.groups["g"].members["a"].revoking


def test_commits_are_fenced_by_member_generation_and_assignment() -> None:
    log = Log()
    log.run(join("a"))
    log.run(join("b"))
    log.run(join("a"))  # an older client: lets go of what it lost at its next join
    old = log.run(join("b"))
    mine = old.assignment[0]
    ok = log.run(CommitOffsets("g", "b", old.generation, [PartitionOffset(*mine, 10)]))
    assert ok.ok
    stale = log.run(CommitOffsets("g", "b", old.generation - 1, [PartitionOffset(*mine, 5)]))
    assert stale.refusal is Refusal.ILLEGAL_GENERATION
    theirs = log.run(join("a")).assignment[0]
    foreign = log.run(CommitOffsets("g", "b", old.generation, [PartitionOffset(*theirs, 1)]))
    assert foreign.refusal is Refusal.NOT_ASSIGNED
    log.run(LeaveGroup("g", "b"))
    removed = log.run(CommitOffsets("g", "b", old.generation, [PartitionOffset(*mine, 3)]))
    assert removed.refusal is Refusal.UNKNOWN_MEMBER
    outside = log.run(CommitOffsets("g", "", NO_GENERATION, [PartitionOffset(*mine, 3)]))
    assert outside.refusal is Refusal.GROUP_NOT_EMPTY
    info = log.run(DescribeGroup("g")).group
    assert info is not None
    assert [(o.topic, o.partition, o.offset) for o in info.offsets] == [(*mine, 10)]


def test_reset_and_delete_are_refused_while_members_live() -> None:
    log = Log()
    log.run(join("a"))
    assert log.run(ResetOffsets("g", [PartitionOffset("t", 0, 0)])).refusal is (
        Refusal.GROUP_NOT_EMPTY
    )
    assert log.run(DeleteGroup("g")).refusal is Refusal.GROUP_NOT_EMPTY
    log.run(LeaveGroup("g", "a"))
    assert log.run(ResetOffsets("g", [PartitionOffset("t", 0, 4)])).ok
    assert log.run(CommitOffsets("g", "", NO_GENERATION, [PartitionOffset("t", 1, 2)])).ok
    assert log.run(DeleteGroup("g")).ok
    assert log.run(DescribeGroup("g")).refusal is Refusal.UNKNOWN_GROUP


def test_new_partitions_start_a_generation() -> None:
    log = Log()
    log.run(join("a", partitions=1))
    assert log.run(UpdatePartitions("g", {"t": 1})).generation == 1
    assert log.run(UpdatePartitions("g", {"t": 2})).generation == 2
    assert log.run(join("a", partitions=2)).assignment == [("t", 0), ("t", 1)]


def offsets_of(log: Log, group: str) -> list[tuple[str, int, int]]:
    info = log.run(DescribeGroup(group)).group
    assert info is not None
    return [(o.topic, o.partition, o.offset) for o in info.offsets]


def test_an_import_sets_only_missing_offsets_and_a_second_changes_nothing() -> None:
    log = Log()
    imported = ImportOffsets("g", [PartitionOffset("t", 0, 7), PartitionOffset("t", 1, 3)])
    assert log.run(imported).ok  # no such group yet: the import makes it
    assert offsets_of(log, "g") == [("t", 0, 7), ("t", 1, 3)]
    before = log.machine.list_groups()
    assert log.run(imported).ok
    assert log.machine.list_groups() == before  # applied twice (a crash before the delete)
    # A commit made since the upgrade wins over an import applied after it.
    log.run(join("a", partitions=2))
    generation = log.run(join("a", partitions=2)).generation
    assert log.run(CommitOffsets("g", "a", generation, [PartitionOffset("t", 1, 40)])).ok
    later = ImportOffsets("g", [PartitionOffset("t", 1, 3), PartitionOffset("u", 0, 9)])
    assert log.run(later).ok
    assert offsets_of(log, "g") == [("t", 0, 7), ("t", 1, 40), ("u", 0, 9)]
    # Members and generation are the group's own: an import leaves them be.
    info = log.run(DescribeGroup("g")).group
    assert info is not None and info.generation == generation
    assert [m.member_id for m in info.members] == ["a"]
    negative = ImportOffsets("g", [PartitionOffset("t", 2, -1)])
    assert log.run(negative).refusal is Refusal.BAD_REQUEST
    restored = GroupCoordinatorMachine()
    restored.restore(log.machine.snapshot())
    assert restored.group_info("g") == log.machine.group_info("g")
    assert restored.snapshot() == log.machine.snapshot()


def random_command(rng: random.Random) -> GroupCommand:
    member = rng.choice("abcd")
    group = rng.choice(["g", "h"])
    kind = rng.randrange(7)
    if kind == 0:
        topics = rng.sample(["t", "u"], rng.randint(1, 2))
        counts = {"t": rng.randint(0, 4), "u": rng.randint(0, 4)}
        assignor = rng.choice(["range", "cooperative-sticky"])
        return JoinGroup(group, member, "c", topics, 10_000, assignor, counts)
    if kind == 1:
        return LeaveGroup(group, member)
    if kind == 2:
        return ExpireMembers(group, [member, rng.choice("abcd")])
    if kind == 3:
        return UpdatePartitions(group, {"t": rng.randint(0, 4)})
    offsets = [PartitionOffset("t", rng.randint(0, 3), rng.randint(0, 100))]
    if kind == 4:
        return CommitOffsets(group, member, rng.randint(-1, 6), offsets)
    if kind == 5:
        return ResetOffsets(group, offsets)
    return ImportOffsets(group, offsets)


def test_apply_is_deterministic_and_snapshots_round_trip() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        commands = [random_command(rng) for _ in range(60)]
        one, two = Log(), Log()
        for command in commands:
            assert one.run(command) == two.run(command), f"seed {seed}"
        assert one.machine.snapshot() == two.machine.snapshot()
        restored = GroupCoordinatorMachine()
        restored.restore(one.machine.snapshot())
        assert restored.snapshot() == one.machine.snapshot()
        assert restored.list_groups() == one.machine.list_groups()
        for state in one.machine.groups.values():
            owned = [p for m in state.members.values() for p in m.assignment]
            assert len(owned) == len(set(owned)), f"seed {seed}"


def test_an_entry_already_in_the_state_is_skipped() -> None:
    log = Log()
    log.run(join("a"))
    entry = encode_entry(GroupEntry(timestamp_ms=0, batches=[[join("b")]]))
    assert log.machine.apply(1, entry) == []
    info = log.machine.group_info("g")
    assert info is not None and [m.member_id for m in info.members] == ["a"]

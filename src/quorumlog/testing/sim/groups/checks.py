"""The group world's invariants, checked as events happen (and once more at the end):

1. committed offsets per (group, topic, partition) are a linearizable register: commits
   (ok, unknown, refused) and the consumers' reads of them (DescribeGroup, behind a
   ReadIndex round) make a history that `testing.linearizability` checks at the end;
2. within one generation the group's members hold disjoint partitions (assigned or being
   given up) that cover every partition of the topics they subscribe, each only of a topic
   its holder subscribes, and every node computes the same assignment for a generation;
3. cooperative hand-over: among members never removed (expired or left), no partition is
   held by two consumers at once in virtual time. A consumer holds a partition from the
   answer that assigns it until it sends a join whose `owned` lacks it while its newest
   answer does not assign it, or leaves;
4. a consumer never sees its group's generation go back while it stays the same member
   (the workload never deletes a group), and a commit from a fenced member (not in the
   group, of another generation, or naming a partition it neither is assigned nor gives
   up) changes no offset.

Checks 2 and 4 (commits) watch every command every node's machine executes; 3 and 4
(generations) watch what the consumers receive and send.
"""

from __future__ import annotations

from quorumlog.stream.group_coordinator import ConsumerGroupState, GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    CommitOffsets,
    ExpireMembers,
    GroupCommand,
    GroupResult,
    LeaveGroup,
)
from quorumlog.testing.sim.checks import InvariantViolation

Partition = tuple[str, str, int]
"""(group, topic, partition)."""
Holding = tuple[str, str]
"""(consumer name, member id)."""


class GroupChecker:
    def __init__(self) -> None:
        self.checks = 0
        self.removed: set[tuple[str, str]] = set()
        """(group, member id) of every member an applied leave or expiry removed."""
        self.assignments: dict[tuple[str, int], dict[str, tuple[tuple[str, int], ...]]] = {}
        """(group, generation) → member → its partitions (assigned, then revoking)."""
        self.holders: dict[Partition, dict[Holding, int]] = {}
        """Who holds each partition now (a consumer's view), since when (virtual ms)."""
        self.generations: dict[Holding, int] = {}
        """The newest generation each member's consumer took."""
        self.fenced_commits = 0
        self.takeovers_from_removed = 0
        """Partitions taken while a removed (expired or left) member still held them."""

    def check(self, condition: bool, message: str) -> None:
        self.checks += 1
        if not condition:
            raise InvariantViolation(message)

    # --- what the machines execute (2, 4) ----------------------------------------------

    def executed(
        self,
        machine: GroupCoordinatorMachine,
        command: GroupCommand,
        before: ConsumerGroupState | None,
        result: GroupResult,
    ) -> None:
        if isinstance(command, CommitOffsets):
            self.commit_executed(machine, command, before, result)
            return
        if isinstance(command, LeaveGroup | ExpireMembers) and result.ok and before is not None:
            ids = [command.member_id] if isinstance(command, LeaveGroup) else command.member_ids
            self.removed.update((command.group, m) for m in ids if m in before.members)
        state = machine.groups.get(getattr(command, "group", ""))
        if state is not None:
            self.check_assignment(state)

    def commit_executed(
        self,
        machine: GroupCoordinatorMachine,
        command: CommitOffsets,
        before: ConsumerGroupState | None,
        result: GroupResult,
    ) -> None:
        member = None if before is None else before.members.get(command.member_id)
        held = set() if member is None else {*member.assignment, *member.revoking}
        fenced = (
            before is None
            or member is None
            or command.generation != before.generation
            or any((item.topic, item.partition) not in held for item in command.offsets)
        )
        if not fenced:
            return
        self.fenced_commits += 1
        self.check(not result.ok, f"a fenced commit was accepted: {command!r}")
        after = machine.groups.get(command.group)
        old = {} if before is None else before.offsets
        new = {} if after is None else after.offsets
        self.check(
            old == new,
            f"a fenced commit {command!r} changed offsets of group {command.group!r}: "
            f"{old} -> {new}",
        )

    def check_assignment(self, state: ConsumerGroupState) -> None:
        owners: dict[tuple[str, int], str] = {}
        shares: dict[str, tuple[tuple[str, int], ...]] = {}
        for member_id, member in sorted(state.members.items()):
            held = (*member.assignment, *member.revoking)
            shares[member_id] = held
            for topic, partition in held:
                other = owners.setdefault((topic, partition), member_id)
                self.check(
                    other == member_id,
                    f"group {state.group!r} generation {state.generation}: {topic}/{partition} "
                    f"held by {other} and {member_id}",
                )
                self.check(
                    topic in member.topics,
                    f"group {state.group!r}: {member_id} holds {topic}/{partition} but does "
                    f"not subscribe {topic}",
                )
        subscribed = {topic for member in state.members.values() for topic in member.topics}
        wanted = {
            (topic, partition)
            for topic in subscribed
            for partition in range(state.partition_counts.get(topic, 0))
        }
        self.check(
            set(owners) == wanted,
            f"group {state.group!r} generation {state.generation}: members hold "
            f"{sorted(owners)}, the subscribed partitions are {sorted(wanted)}",
        )
        seen = self.assignments.setdefault((state.group, state.generation), shares)
        self.check(
            seen == shares,
            f"group {state.group!r} generation {state.generation} assigned two ways: "
            f"{seen} and {shares}",
        )

    # --- what the consumers see and say (3, 4) -------------------------------------------

    def answer_taken(
        self,
        consumer: str,
        member_id: str,
        group: str,
        generation: int,
        assignment: frozenset[tuple[str, int]],
        now_ms: int,
    ) -> None:
        # Holds first: a partition read twice at once is the worse news of a stale answer.
        for topic, partition in sorted(assignment):
            self.hold(consumer, member_id, (group, topic, partition), now_ms)
        key = (consumer, member_id)
        last = self.generations.get(key)
        self.check(
            last is None or generation >= last,
            f"{consumer} (member {member_id} of {group!r}) took generation {generation} "
            f"after {last}",
        )
        self.generations[key] = generation

    def hold(self, consumer: str, member_id: str, partition: Partition, now_ms: int) -> None:
        holders = self.holders.setdefault(partition, {})
        if (consumer, member_id) in holders:
            return
        group = partition[0]
        if (group, member_id) not in self.removed:
            for (other, other_member), since_ms in sorted(holders.items()):
                self.check(
                    (group, other_member) in self.removed,
                    f"{consumer} (member {member_id}) takes {partition} at {now_ms} ms while "
                    f"{other} (member {other_member}) holds it since {since_ms} ms",
                )
        if holders:
            self.takeovers_from_removed += 1
        holders[(consumer, member_id)] = now_ms

    def join_sent(
        self, consumer: str, member_id: str, group: str, kept: set[tuple[str, int]]
    ) -> None:
        for partition, holders in self.holders.items():
            if partition[0] == group and (partition[1], partition[2]) not in kept:
                holders.pop((consumer, member_id), None)

    def left(self, consumer: str, member_id: str, group: str) -> None:
        self.join_sent(consumer, member_id, group, set())

"""Each check of the consumer-group simulator catches a deliberately broken rule of the
shipped coordinator (and the old heartbeat path, answered from the leader's memory)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quorumlog.node import group_coordinator_service
from quorumlog.runtime.completion import Completion
from quorumlog.stream import group_coordinator
from quorumlog.stream.assignors import TopicPartition
from quorumlog.stream.group_coordinator import ConsumerGroupState, MemberState
from quorumlog.stream.group_model import CommitOffsets, GroupResult, JoinGroup, PartitionOffset
from quorumlog.testing.sim.groups.runner import run_seed

SEED = 1


def failure_of(*seeds: int) -> str:
    """The failure of the first of `seeds` that notices the broken rule."""
    for seed in seeds:
        result = run_seed(seed, capture_trace=False)
        if not result.ok:
            return str(result.failure)
    raise AssertionError(f"the broken rule went unnoticed in seeds {seeds}")


def test_heartbeats_answered_from_memory_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator before the fix: heartbeats answered without a read barrier. A seed
    that elects a new leader which has not yet applied its predecessor's last commit (a
    new generation) makes it tell a member of that generation the one before. Rare: of
    seeds 0..299 the broken rule was caught on 2 before the Raft heartbeat fast path (78,
    206), 4 after it (4, 174, 206, 228), and 4 with it and the feature-level entry each
    coordinator log now starts with (87, 174, 234, 299), and with a busy group's tick
    heartbeats thinned further (raft/leader.py `broadcast_heartbeat`, session 10) 1 of
    0..299 (214) and 1 of 300..699 (454), and with a follower that lags the commit index
    answering only when asked (raft/follower.py `answer_wanted`) 1 of 0..699 (571); a
    timing change moves them, so several are tried (the first caught ends the scan)."""
    real_barrier = group_coordinator_service.after_read_barrier

    def heartbeats_without_barrier(
        read_barrier: Callable[[], Completion[int]],
        request_id: int,
        reply: Callable[..., None],
        leader_address: Callable[[], str | None],
        answer: Callable[[], None],
    ) -> None:
        if answer.__name__ == "answer_heartbeats":
            answer()
            return
        real_barrier(read_barrier, request_id, reply, leader_address, answer)

    monkeypatch.setattr(group_coordinator_service, "after_read_barrier", heartbeats_without_barrier)
    failure = failure_of(571, 214, 454, 174, 87, 234, 299)
    assert " took generation " in failure and " after " in failure


def test_a_commit_accepted_from_a_fenced_member_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def accept_every_commit(
        state: ConsumerGroupState | None, command: CommitOffsets
    ) -> GroupResult | None:
        return None

    monkeypatch.setattr(group_coordinator, "commit_refusal", accept_every_commit)
    assert "a fenced commit was accepted" in failure_of(SEED)


def test_a_partition_given_before_its_owner_let_go_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forget_revoking(member: MemberState, command: JoinGroup) -> list[TopicPartition]:
        return []

    monkeypatch.setattr(group_coordinator, "still_revoking", forget_revoking)
    # Caught when a member heartbeats in the middle of its revoke: on 12 of seeds 0..39 of
    # this tree (a timing change moves them; 0, 1 and 7 before the session-8 merges).
    failure = failure_of(6, 9, 10)
    assert " takes " in failure and "holds it since" in failure


def test_an_assignment_that_leaves_a_partition_out_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_assign = group_coordinator.assign

    def assign_all_but_one(
        assignor: str,
        subscriptions: dict[str, list[str]],
        partition_counts: dict[str, int],
        previous: dict[str, list[TopicPartition]],
    ) -> dict[str, list[TopicPartition]]:
        assignment = real_assign(assignor, subscriptions, partition_counts, previous)
        for member_id in sorted(assignment):
            if assignment[member_id]:
                assignment[member_id] = sorted(assignment[member_id])[1:]
                break
        return assignment

    monkeypatch.setattr(group_coordinator, "assign", assign_all_but_one)
    assert "the subscribed partitions are" in failure_of(SEED)


def test_an_offset_stored_wrong_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def store_one_short(state: ConsumerGroupState, offsets: list[PartitionOffset]) -> None:
        for item in offsets:
            state.offsets.setdefault(item.topic, {})[item.partition] = max(item.offset - 1, 0)

    monkeypatch.setattr(group_coordinator, "store_offsets", store_one_short)
    assert "committed offsets are not linearizable" in failure_of(SEED)

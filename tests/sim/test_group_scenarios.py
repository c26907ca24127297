"""A scripted consumer-group scenario: a coordinator leader paused (SIGSTOP) while the
group moves on elsewhere, then resumed cut off from the other nodes, with a member that
can reach only it. Before heartbeats waited for a ReadIndex round, it answered that member
from its memory with the generation before the hand-over, and the member took back
partitions another member was reading."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quorumlog.node import group_coordinator_service
from quorumlog.runtime.completion import Completion
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.groups.world import GroupWorld, GroupWorldOptions

SEED = 2
TICKS_MAX = 400


def resumed_stale_leader(seed: int) -> GroupWorld:
    """Run the scenario to its end; the world's checks raise on the first violation."""
    world = GroupWorld(seed, GroupWorldOptions(groups={"billing": [["orders"], ["orders"]]}))
    cluster = world.cluster
    first, second = world.consumers["billing-c1"], world.consumers["billing-c2"]
    first.join()
    assert cluster.run_until(lambda: len(first.positions) == 4, TICKS_MAX)
    leader = cluster.leader()
    assert leader is not None
    others = [node_id for node_id in sorted(cluster.nodes) if node_id != leader]
    cluster.pause(leader)
    cluster.partition([[leader], others])
    second.join()
    # The hand-over: the first member gives two partitions up, the second takes them.
    assert cluster.run_until(
        lambda: len(second.applied.assignment) == 2 and len(first.applied.assignment) == 2,
        TICKS_MAX,
    )
    for node_id in others:
        world.cluster.network.blocked.update({(first.name, node_id), (node_id, first.name)})
    paused = cluster.node(leader)
    assert cluster.run_until(
        lambda: any(link == f"rpc:{first.name}" for link, _, _ in paused.process.inbox),
        TICKS_MAX,
    ), "the first member's heartbeat should wait at the paused leader"
    cluster.resume(leader)
    cluster.run(ticks=40)
    return world


def test_a_resumed_deposed_leader_tells_no_member_an_older_generation() -> None:
    world = resumed_stale_leader(SEED)
    first = world.consumers["billing-c1"]
    # It reaches only the deposed leader, which can confirm nothing: no answer at all (its
    # session runs out, and the other member is given its partitions: that is allowed).
    assert first.current.generation == 3
    assert first.current.assignment == {("orders", 2), ("orders", 3)}


def test_heartbeats_answered_from_memory_hand_a_partition_to_two_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old answer path (no read barrier for heartbeats), to show the scenario bites."""
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
    with pytest.raises(InvariantViolation, match=r"takes .* while billing-c2 .* holds it"):
        resumed_stale_leader(SEED)

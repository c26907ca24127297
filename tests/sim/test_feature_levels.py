"""A rolling upgrade of the consumer-group coordinator in the simulator: two nodes of this
release and one of the release before the fencing fields (it says feature level 1 and
drops the fields it does not know as msgspec would, testing/sim/groups/coordinator.py).

While the old node is a member, the new leader proposes no fencing fields and every replica
applies a stale commit alike (the old rule: it takes the offset back). Once the old node is
upgraded and says level 2, the leader commits level 2 in the group's own log, and the
fencing turns on at that entry on every replica: a later stale commit changes nothing.
Without the gate the new replicas fence a commit the old one applies: the states diverge.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import BASELINE_FEATURE_LEVEL, GROUP_FENCING_LEVEL
from quorumlog.storage.entry import EntryType
from quorumlog.stream.group_model import (
    CommitOffsets,
    GroupCommand,
    GroupEntry,
    GroupResult,
    JoinGroup,
    PartitionOffset,
    decode_entry,
    decode_results,
    encode_commands,
)
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.groups.coordinator import ObservedGroupMachine, coordinator_application
from quorumlog.testing.sim.groups.runner import GroupSeed, plan_seed

SEED = 5
TICKS_MAX = 400
TOPICS = {"t": 1}


class MixedCluster:
    """Three coordinator nodes; n3 runs the release before the fencing until upgraded."""

    def __init__(self) -> None:
        self.levels = {"n1": GROUP_FENCING_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": 1}
        application = coordinator_application(TOPICS, lambda *_: None, self.levels)
        self.cluster = SimCluster(SEED, SimOptions(node_count=3), None, application)
        self.request_id = 0

    def machine(self, node_id: str) -> ObservedGroupMachine:
        machine = self.cluster.node(node_id).machine
        assert isinstance(machine, ObservedGroupMachine)
        return machine

    def run(self, command: GroupCommand) -> GroupResult:
        """`command` through the leader's shipped service, once every node applied it."""
        leader = self.cluster.wait_for_leader()
        node = self.cluster.node(leader)
        self.request_id += 1
        request = wire.GroupCoordinatorRequest(self.request_id, encode_commands([command]))
        answers: list[Any] = []
        node.process.enter("test", lambda _: node.on_request(request, answers.append))
        assert self.cluster.run_until(lambda: bool(answers), TICKS_MAX), "no answer"
        assert isinstance(answers[0], wire.GroupCoordinatorResponse), answers[0]
        self.settle()
        return decode_results(answers[0].results)[0]

    def settle(self) -> None:
        """Run until every node applied what the leader committed."""
        leader = self.cluster.node(self.cluster.wait_for_leader())
        assert self.cluster.run_until(
            lambda: all(
                self.machine(n).applied_index >= leader.host.core.commit_index
                for n in self.cluster.nodes
            ),
            TICKS_MAX,
        )

    def views(self) -> dict[str, object]:
        """Per node, what the oldest release's state holds (fields it knows only)."""
        return {node_id: release_view(self.machine(node_id)) for node_id in self.cluster.nodes}

    def raise_index(self, node_id: str) -> int | None:
        """The index of the entry that raised the level in `node_id`'s log, if it holds it."""
        log = self.cluster.node(node_id).host.core.log
        for entry in log.entries(log.first_index, log.last_index + 1):
            is_data = entry.type is EntryType.DATA and bool(entry.data)
            if is_data and decode_entry(entry.data).cluster_level:
                return entry.index
        return None


def release_view(machine: ObservedGroupMachine) -> object:
    return {
        name: (
            state.generation,
            {m.member_id: (m.assignment, m.revoking) for m in state.members.values()},
            state.offsets,
        )
        for name, state in sorted(machine.groups.items())
    }


def commit(sequence: int, offset: int, generation: int) -> CommitOffsets:
    return CommitOffsets("g", "m", generation, [PartitionOffset("t", 0, offset)], sequence)


def stale_commit_pair(mixed: MixedCluster, generation: int, low: int, high: int) -> None:
    """The member's commit `high` (its second) lands before a late copy of `low` (its
    first): the shape of sim groups seed 793."""
    assert mixed.run(commit(2 * high, high, generation)).ok
    assert mixed.run(commit(2 * high - 1, low, generation)).ok


def test_old_and_new_replicas_apply_alike_until_the_level_rises_then_fence_together() -> None:
    mixed = MixedCluster()
    joined = mixed.run(JoinGroup("g", "m", "m", ["t"], owned=[], owned_generation=0))
    assert joined.assignment == [("t", 0)]
    stale_commit_pair(mixed, joined.generation, low=55, high=64)
    views = mixed.views()
    assert views["n1"] == views["n2"] == views["n3"], views
    assert mixed.machine("n1").groups["g"].offsets == {"t": {0: 55}}  # the old rule
    assert {mixed.machine(n).cluster_level for n in mixed.cluster.nodes} == {BASELINE_FEATURE_LEVEL}

    mixed.levels["n3"] = GROUP_FENCING_LEVEL  # n3 restarts on the new release
    mixed.cluster.crash("n3")
    mixed.cluster.restart("n3")
    assert mixed.cluster.run_until(
        lambda: all(mixed.machine(n).cluster_level == GROUP_FENCING_LEVEL for n in mixed.levels),
        TICKS_MAX,
    ), "the leader should commit level 2 once every member says it"
    mixed.settle()
    raised_at = {mixed.raise_index(node_id) for node_id in mixed.cluster.nodes}
    assert len(raised_at) == 1 and None not in raised_at, raised_at

    stale_commit_pair(mixed, joined.generation, low=90, high=100)
    views = mixed.views()
    assert views["n1"] == views["n2"] == views["n3"], views
    assert mixed.machine("n3").groups["g"].offsets == {"t": {0: 100}}  # fenced everywhere


def test_without_the_gate_the_old_replica_diverges(monkeypatch: Any) -> None:
    """The coordinator before the gate: the leader proposes the fields, the new replicas
    apply them. The old replica, which drops them, keeps the stale offset."""
    from quorumlog.node import group_coordinator_service
    from quorumlog.stream import group_coordinator

    def ungated(command: Any, level: int) -> Any:
        return command

    monkeypatch.setattr(group_coordinator, "at_level", ungated)
    monkeypatch.setattr(group_coordinator_service, "at_level", ungated)
    monkeypatch.setattr(ObservedGroupMachine, "fencing", property(lambda self: True))
    mixed = MixedCluster()
    joined = mixed.run(JoinGroup("g", "m", "m", ["t"], owned=[], owned_generation=0))
    stale_commit_pair(mixed, joined.generation, low=55, high=64)
    assert mixed.machine("n1").groups["g"].offsets == {"t": {0: 64}}
    assert mixed.machine("n3").groups["g"].offsets == {"t": {0: 55}}  # diverged


def test_an_entry_raising_the_level_decodes_on_the_release_before_it() -> None:
    """An older release reads the raise entry as an empty one (the trailing field dropped)."""
    from quorumlog.stream.group_model import encode_entry
    from quorumlog.testing.sim.groups.coordinator import as_release_decodes

    raise_entry = encode_entry(GroupEntry(7, [], cluster_level=GROUP_FENCING_LEVEL))
    assert decode_entry(as_release_decodes(raise_entry, BASELINE_FEATURE_LEVEL)) == GroupEntry(
        7, []
    )


@pytest.mark.parametrize("seed", [0, 3])
def test_a_half_upgraded_cluster_keeps_every_check_under_the_nemesis(seed: int) -> None:
    """The consumer-group world (crashes, partitions, pauses, lossy frames) with n3 on the
    release before the fencing: every replica holds the same state at the same index
    (`check_converged`, snapshot digests), and the consumers' checks hold. Without the gate
    every one of seeds 0-7 fails there ("n3 and n1 applied through 58 but hold different
    states")."""
    plan = plan_seed(seed, seconds=6.0)
    world = msgspec.structs.replace(
        plan.world, feature_levels={"n1": GROUP_FENCING_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": 1}
    )
    GroupSeed(seed, msgspec.structs.replace(plan, world=world), None).run()

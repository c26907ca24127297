"""A rolling upgrade of the consumer-group coordinator in the simulator: two nodes of this
release and one of the release before the fencing fields (it says feature level 1 and
drops the fields it does not know as msgspec would, testing/sim/groups/coordinator.py).

While the old node is a member, the new leader proposes no fencing fields and every replica
applies a stale commit alike (the old rule: it takes the offset back). Once the old node is
upgraded and says level 2, the leader commits level 2 in the group's own log, and the
fencing turns on at that entry on every replica: a later stale commit changes nothing.
Without the gate the new replicas fence a commit the old one applies: the states diverge.

The release users run before this one is session 7's, which applies the fencing fields
ungated and says no level: a session-7 leader puts the fields in the log below level 2,
and the replicas of this release at level 1 apply them exactly as session-7 replicas do.
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
TOPICS = {"t": 1, "u": 2}
HALF_UPGRADED = {"n1": GROUP_FENCING_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": 1}


class MixedCluster:
    """Three coordinator nodes; by default n3 runs the session-6 release (before the
    fencing) until upgraded."""

    def __init__(
        self, levels: dict[str, int] | None = None, session_7_nodes: frozenset[str] = frozenset()
    ) -> None:
        self.levels = dict(HALF_UPGRADED if levels is None else levels)
        application = coordinator_application(TOPICS, lambda *_: None, self.levels, session_7_nodes)
        self.cluster = SimCluster(SEED, SimOptions(node_count=3), None, application)
        self.request_id = 0

    def lead_from(self, node_id: str) -> None:
        """Move the coordinator's leadership to `node_id`."""
        self.cluster.wait_for_leader()
        if self.cluster.leader() != node_id:
            assert self.cluster.transfer_leadership(node_id)
        assert self.cluster.run_until(lambda: self.cluster.leader() == node_id, TICKS_MAX)

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


def full_states(mixed: MixedCluster) -> dict[str, object]:
    """Per node, every field of every group (the fencing ones too) and the applied index."""
    return {
        node_id: (mixed.machine(node_id).applied_index, msgspec.to_builtins(machine_groups))
        for node_id in mixed.cluster.nodes
        for machine_groups in [mixed.machine(node_id).groups]
    }


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
    """The leader before the gate: it proposes the fields below level 2, the new replicas
    apply them. The session-6 replica, which drops them, keeps the stale offset."""
    from quorumlog.node import group_coordinator_service

    def ungated(command: Any, level: int) -> Any:
        return command

    monkeypatch.setattr(group_coordinator_service, "at_level", ungated)
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
    (the leader proposing the fields below level 2) every one of seeds 0-7 fails there
    ("n3 and n1 applied through 58 but hold different states")."""
    plan = plan_seed(seed, seconds=6.0)
    world = msgspec.structs.replace(
        plan.world, feature_levels={"n1": GROUP_FENCING_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": 1}
    )
    GroupSeed(seed, msgspec.structs.replace(plan, world=world), None).run()


def test_a_session_7_leaders_fields_are_applied_alike_by_session_7_and_new_replicas() -> None:
    """n1 runs session 7 (fields applied ungated, no level said) and leads; n2 and n3 run
    this release at level 1. The log holds the fields: a revocation noted, a stale join
    that must not release it, a stale commit that must not take the offset back. Every
    replica holds the same state, fields and all (before the fix, level-1 replicas ignored
    the fields and did not note revocations: they released and took the offset back)."""
    levels = {"n1": BASELINE_FEATURE_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": GROUP_FENCING_LEVEL}
    mixed = MixedCluster(levels, session_7_nodes=frozenset({"n1"}))
    mixed.lead_from("n1")
    first = mixed.run(JoinGroup("g", "m", "m", ["u"], owned=[], owned_generation=0))
    assert first.assignment == [("u", 0), ("u", 1)]
    second = mixed.run(JoinGroup("g", "m2", "m2", ["u"], owned=[], owned_generation=0))
    assert second.assignment == []  # withheld until m gives its partition up
    revoking = mixed.machine("n1").groups["g"].members["m"].revoking
    assert len(revoking) == 1
    # m's join made before it learned of the revocation (a changed timeout: through the log).
    stale = JoinGroup("g", "m", "m", ["u"], 30_000, owned=[], owned_generation=first.generation)
    assert mixed.run(stale).ok
    kept = mixed.machine("n1").groups["g"].members["m"]
    generation = mixed.machine("n1").groups["g"].generation
    partition = revoking[0]
    sequence_commits = [(2, 64), (1, 55)]  # the second (a late copy of the first) is stale
    for sequence, offset in sequence_commits:
        item = PartitionOffset(partition[0], partition[1], offset)
        assert mixed.run(CommitOffsets("g", "m", generation, [item], sequence)).ok
    assert mixed.cluster.leader() == "n1", "the log should come from the session-7 leader"
    states = full_states(mixed)
    assert states["n1"] == states["n2"] == states["n3"], states
    for node_id in mixed.cluster.nodes:
        machine = mixed.machine(node_id)
        member = machine.groups["g"].members["m"]
        assert member.revoking == revoking and member.revoking_since == kept.revoking_since > 0
        assert machine.groups["g"].offsets["u"][partition[1]] == 64, node_id
        assert machine.cluster_level == (GROUP_FENCING_LEVEL if node_id == "n1" else 1)


@pytest.mark.parametrize("seed", [0, 3])
def test_a_cluster_with_a_session_7_node_keeps_every_check_under_the_nemesis(seed: int) -> None:
    """The consumer-group world with n3 on session 7 (it proposes the fields when it leads)
    and n1, n2 on this release at level 1: every replica holds the same state at the same
    index, and the consumers' checks hold. Before apply followed the session-7 rules at
    level 1, both seeds failed ("... snapshot at 64 differs from another node's")."""
    plan = plan_seed(seed, seconds=6.0)
    world = msgspec.structs.replace(
        plan.world,
        feature_levels={"n1": GROUP_FENCING_LEVEL, "n2": GROUP_FENCING_LEVEL, "n3": 1},
        session_7_nodes=frozenset({"n3"}),
    )
    GroupSeed(seed, msgspec.structs.replace(plan, world=world), None).run()

"""Scripted scenarios on a simulated cluster: each drives one fault by hand and checks
the cluster's answer. Invariants are checked after every event as always."""

from __future__ import annotations

import pytest

from quorumlog.errors import NotLeaderError
from quorumlog.kv.machine import KVStateMachine
from quorumlog.raft.configuration import ChangeKind, MembershipChange
from quorumlog.raft.core import Role
from quorumlog.testing.history import OperationStatus
from quorumlog.testing.sim.cluster import (
    SCRIPT_CLIENT,
    OperationTimeoutError,
    SimCluster,
    SimOptions,
)
from quorumlog.testing.sim.node import NodeOptions


def cluster_of(node_count: int, seed: int = 1, **node_options: int) -> SimCluster:
    options = SimOptions(node_count=node_count, node=NodeOptions(**node_options))
    return SimCluster(seed=seed, options=options)


@pytest.mark.parametrize("node_count", [1, 3, 5])
def test_a_leader_is_elected_and_serves_writes_and_reads(node_count: int) -> None:
    cluster = cluster_of(node_count)
    leader = cluster.wait_for_leader()
    cluster.put("k", "v1")
    cluster.append("k", "+")
    assert cluster.get("k") == "v1+"
    assert cluster.get("missing") is None
    assert cluster.leader() == leader
    assert cluster.check_linearizable().ok is True


def test_an_isolated_leader_is_replaced_and_rejoins_as_follower() -> None:
    cluster = cluster_of(3)
    old_leader = cluster.wait_for_leader()
    cluster.put("k", "before")
    cluster.isolate(old_leader)
    assert cluster.run_until(lambda: cluster.leader() not in (None, old_leader), ticks_max=100), (
        cluster.describe()
    )
    cluster.put("k", "during")
    # check-quorum: the cut-off leader steps down by itself.
    assert cluster.run_until(
        lambda: cluster.node(old_leader).core.role is not Role.LEADER, ticks_max=40
    )
    cluster.heal()
    cluster.run(ticks=20)
    assert cluster.get("k") == "during"
    assert cluster.node(old_leader).core.role is Role.FOLLOWER
    assert cluster.check_linearizable().ok is True


def test_a_minority_partition_cannot_commit_and_catches_up_after_heal() -> None:
    cluster = cluster_of(5)
    leader = cluster.wait_for_leader()
    others = sorted(node for node in cluster.nodes if node != leader)
    cluster.partition([[leader, others[0]], others[1:]])
    index, _ = cluster.propose(node_id=leader)
    cluster.run(ticks=5)
    assert cluster.node(leader).core.commit_index < index
    assert cluster.run_until(lambda: cluster.leader() in others[1:], ticks_max=100), (
        cluster.describe()
    )
    cluster.put("k", "majority")
    cluster.heal()
    assert cluster.get("k") == "majority"
    new_leader = cluster.leader()
    assert new_leader is not None
    commit = cluster.node(new_leader).core.commit_index
    assert cluster.run_until(
        lambda: all(node.applied_index >= commit for node in cluster.nodes.values()),
        ticks_max=100,
    )
    cluster.check_converged()


def test_a_crashed_follower_catches_up_by_snapshot() -> None:
    cluster = cluster_of(3, snapshot_interval_entries=5, snapshot_trailing_entries=0)
    leader = cluster.wait_for_leader()
    follower = sorted(node for node in cluster.nodes if node != leader)[0]
    cluster.crash(follower)
    for number in range(30):
        cluster.put(f"k{number % 3}", str(number))
    leader_log_first = cluster.node(leader).core.log.first_index
    assert leader_log_first > 1
    cluster.restart(follower)
    commit = cluster.node(leader).core.commit_index
    assert cluster.run_until(
        lambda: cluster.node(follower).applied_index >= commit, ticks_max=100
    ), cluster.describe()
    assert cluster.node(follower).disk.snapshot is not None
    cluster.check_converged()
    assert cluster.check_linearizable().ok is True


def test_a_crash_of_every_node_loses_nothing_acknowledged() -> None:
    cluster = cluster_of(3, fsync_ms_max=5)
    cluster.wait_for_leader()
    for number in range(10):
        cluster.append("log", f"{number};")
    for node_id in sorted(cluster.nodes):
        cluster.crash(node_id)
    cluster.run(ticks=10)
    for node_id in sorted(cluster.nodes):
        cluster.restart(node_id)
    cluster.wait_for_leader()
    assert cluster.get("log") == "".join(f"{number};" for number in range(10))


def test_a_majority_down_stops_commits_until_it_returns() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    down = sorted(node for node in cluster.nodes if node != leader)
    for node_id in down:
        cluster.crash(node_id)
    index, _ = cluster.propose(node_id=leader)
    cluster.run(ticks=60)
    assert cluster.node(leader).core.commit_index < index
    for node_id in down:
        cluster.restart(node_id)
    cluster.put("k", "after")
    assert cluster.get("k") == "after"


def test_a_paused_leader_loses_leadership_and_follows_on_resume() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    cluster.pause(leader)
    assert cluster.run_until(lambda: cluster.leader() not in (None, leader), ticks_max=100)
    cluster.put("k", "v")
    cluster.resume(leader)
    cluster.run(ticks=20)
    assert cluster.node(leader).core.role is Role.FOLLOWER
    assert cluster.node(leader).core.term == cluster.node(str(cluster.leader())).core.term


def test_a_one_way_cut_from_the_leader_triggers_an_election_elsewhere() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    for node_id in sorted(cluster.nodes):
        if node_id != leader:
            cluster.cut(leader, node_id)
    assert cluster.run_until(lambda: cluster.leader() not in (None, leader), ticks_max=100)
    cluster.put("k", "v")
    cluster.heal()
    assert cluster.get("k") == "v"


def test_leadership_transfer_moves_the_leader() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    cluster.put("k", "v")
    target = sorted(node for node in cluster.nodes if node != leader)[0]
    assert cluster.transfer_leadership(target)
    assert cluster.run_until(lambda: cluster.leader() == target, ticks_max=40)
    assert cluster.get("k") == "v"


def test_a_removed_node_comes_back_as_learner_then_voter() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    cluster.put("k", "before")  # a leader changes membership only once its term committed
    target = sorted(node for node in cluster.nodes if node != leader)[0]

    def change(kind: ChangeKind) -> None:
        assert cluster.change_membership(MembershipChange(kind, target)) is not None
        assert cluster.run_until(
            lambda: (
                cluster.node(str(cluster.leader())).core.commit_index
                >= cluster.node(str(cluster.leader())).core.log.last_index
            ),
            ticks_max=40,
        )

    change(ChangeKind.REMOVE)
    assert target not in cluster.node(leader).core.configuration.members()
    cluster.put("k", "without")
    change(ChangeKind.ADD_LEARNER)
    assert target in cluster.node(leader).core.configuration.learners
    change(ChangeKind.PROMOTE_LEARNER)
    assert target in cluster.node(leader).core.configuration.voters
    cluster.put("k", "with")
    commit = cluster.node(leader).core.commit_index
    assert cluster.run_until(lambda: cluster.node(target).applied_index >= commit, ticks_max=60)
    assert cluster.node(target).machine.get("k") == "with"


def test_proposals_on_a_follower_are_redirected_to_the_leader() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    cluster.run(ticks=2)
    follower = sorted(node for node in cluster.nodes if node != leader)[0]
    with pytest.raises(NotLeaderError) as refused:
        cluster.propose(node_id=follower)
    assert refused.value.leader_hint == leader


def test_a_failure_inside_the_simulation_names_its_seed() -> None:
    cluster = cluster_of(3, seed=42)
    cluster.wait_for_leader()

    def explode(_: object) -> None:
        raise RuntimeError("planted")

    cluster.events.schedule(1, explode)
    with pytest.raises(RuntimeError) as raised:
        cluster.run(ticks=1)
    assert "seed 42, 3 nodes" in "\n".join(raised.value.__notes__)


def test_a_scripted_request_that_times_out_is_recorded_unknown() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    for node_id in sorted(cluster.nodes):
        if node_id != leader:
            cluster.crash(node_id)
    with pytest.raises(OperationTimeoutError):
        cluster.put("k", "never acknowledged", ticks_max=20)
    for node_id in sorted(cluster.nodes):
        cluster.restart(node_id)
    cluster.put("k", "after")
    statuses = [operation.status.value for operation in cluster.history.operations()]
    assert statuses == ["unknown", "ok"]
    assert cluster.check_linearizable().ok is True


def test_a_write_whose_answers_are_lost_is_applied_once_however_often_it_is_sent() -> None:
    cluster = cluster_of(3)
    leader = cluster.wait_for_leader()
    cluster.append("k", "a;")
    cluster.cut(leader, SCRIPT_CLIENT)  # the leader's answers to the client are lost
    with pytest.raises(OperationTimeoutError, match="ended unknown"):
        cluster.append("k", "b;")
    machine = cluster.node(leader).machine
    assert isinstance(machine, KVStateMachine)
    assert machine.duplicate_count > 0  # the retries reached the leader, under one sequence
    cluster.heal()
    assert cluster.get("k") == "a;b;"
    assert cluster.check_linearizable().ok is True


def test_clients_reach_the_shipped_service_as_wire_frames() -> None:
    cluster = cluster_of(3)
    cluster.wait_for_leader()
    cluster.put("k", "v")
    assert cluster.frames.stats.delivered >= 2  # the request and its answer, at least
    for node in cluster.nodes.values():
        assert isinstance(node.machine, KVStateMachine)
    assert cluster.script_client.session.answered


def test_writes_of_unknown_outcome_that_no_machine_was_given_resolve_as_failed() -> None:
    """The simulator sees what no client can: a write whose command no state machine was
    ever given did not happen, so the history check need not consider it; one that some
    machine was given stays unknown (it may have taken effect)."""
    cluster = SimCluster(seed=11)
    cluster.wait_for_leader()
    cluster.put("k", "v")  # its (client id, sequence) reached every machine
    history = cluster.history
    applied_id = history.invoke("c9", "append", "k", "a;", cluster.now_ms)
    history.unknown(applied_id)
    lost_id = history.invoke("c9", "append", "k", "b;", cluster.now_ms)
    history.unknown(lost_id)
    identities = cluster.workload.stats.write_identities
    identities[applied_id] = next(iter(sorted(cluster.applied_commands)))
    identities[lost_id] = ("never-sent", 1)
    resolved = {op.operation_id: op.status for op in cluster.resolved_operations()}
    assert resolved[applied_id] is OperationStatus.UNKNOWN
    assert resolved[lost_id] is OperationStatus.FAILED
    assert cluster.applied_commands  # the put was recorded from the applied entries

"""Heartbeats without a Ready, in the simulator (raft/core.py `step_heartbeat`,
`step_heartbeat_answer`; runtime/host.py `step`, `tick`): the shipped host sends a tick's
heartbeats at once and takes plain heartbeats and their answers by the core's fast path.
Awake groups (no quiescing) under the faults that matter to heartbeats: a leader lost, a
partition between two nodes, restarted nodes. Invariants are checked after every event as
in every simulation; the seed sweep of the nemesis (tests/sim/test_seeds.py) runs the same
paths."""

from __future__ import annotations

import pytest

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.ready import Ready
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.runner import format_failure, run_seed

AWAKE_RAFT = RaftConfig(node_id="template")


def awake_cluster(seed: int, node_count: int = 3) -> SimCluster:
    return SimCluster(seed, SimOptions(node_count=node_count, raft=AWAKE_RAFT))


def test_an_idle_awake_group_heartbeats_without_a_ready_pass() -> None:
    cluster = awake_cluster(seed=11)
    leader = cluster.wait_for_leader()
    cluster.put("k", "v", ticks_max=60)
    cluster.run(ticks=5)  # the last commit index reaches the followers
    readies = {node_id: 0 for node_id in cluster.nodes}
    for node_id, node in cluster.nodes.items():
        original = node.host.hooks.on_ready

        def counting(ready: Ready, node_id: str = node_id, original=original) -> None:  # type: ignore[no-untyped-def]
            readies[node_id] += 1
            original(ready)

        node.host.hooks.on_ready = counting  # type: ignore[method-assign]
    sent_before = {node_id: node.host.sent_at_once for node_id, node in cluster.nodes.items()}
    taken_before = cluster.nodes[leader].host.answers_taken_at_once

    cluster.run(ticks=100)

    assert cluster.leader() == leader
    # A keepalive every other tick to each of two followers (election_ticks 10), all at
    # once; the leader wants an answer about once per check-quorum window (10 ticks) from
    # each, and takes those at once.
    heartbeats = cluster.nodes[leader].host.sent_at_once - sent_before[leader]
    assert 90 <= heartbeats <= 130, heartbeats
    taken = cluster.nodes[leader].host.answers_taken_at_once - taken_before
    assert 2 * 9 <= taken <= 2 * 20, taken
    for node_id in cluster.nodes:
        if node_id != leader:
            answers = cluster.nodes[node_id].host.sent_at_once - sent_before[node_id]
            assert 9 <= answers <= 20, answers
    assert readies == {node_id: 0 for node_id in cluster.nodes}, readies


@pytest.mark.parametrize("seed", [12, 13, 14])
def test_a_crashed_leader_of_an_awake_group_is_replaced_and_comes_back(seed: int) -> None:
    cluster = awake_cluster(seed)
    old = cluster.wait_for_leader()
    cluster.put("before", "crash", ticks_max=60)
    old_term = cluster.nodes[old].core.term
    cluster.crash(old)
    assert cluster.run_until(lambda: cluster.leader() not in (None, old), ticks_max=80), (
        cluster.describe()
    )
    new = cluster.leader()
    assert new is not None and cluster.nodes[new].core.term > old_term
    cluster.put("after", "crash", ticks_max=60)
    cluster.restart(old)
    # The restarted node answers heartbeats with what is durable; it follows and catches up.
    assert cluster.run_until(
        lambda: (
            cluster.nodes[old].core.leader_id == new
            and cluster.nodes[old].core.commit_index == cluster.nodes[new].core.commit_index
        ),
        ticks_max=120,
    ), cluster.describe()
    assert cluster.get("after", ticks_max=60) == "crash"


@pytest.mark.parametrize("seed", [15, 16])
def test_a_partition_between_the_leader_and_one_follower(seed: int) -> None:
    cluster = awake_cluster(seed)
    leader = cluster.wait_for_leader()
    cut_off = sorted(node for node in cluster.nodes if node != leader)[0]
    cluster.partition([[leader], [cut_off]])  # the third node still reaches both
    cluster.put("during", "partition", ticks_max=120)
    cluster.run(ticks=60)
    assert cluster.leader() is not None
    cluster.heal()
    cluster.put("after", "heal", ticks_max=120)
    final = cluster.leader()
    assert final is not None
    assert cluster.run_until(
        lambda: all(
            node.core.commit_index == cluster.nodes[final].core.commit_index
            for node in cluster.nodes.values()
        ),
        ticks_max=120,
    ), cluster.describe()
    assert cluster.get("during", ticks_max=60) == "partition"


def test_awake_seed_sweep_with_crashes_partitions_and_restarts() -> None:
    """Seeds of the nemesis without quiet groups: every heartbeat takes the fast path
    unless it moves state; every invariant and linearizability hold. (20 simulated
    seconds: at 8, seed 86 misses the liveness window after the last heal on the old code
    too, with pre-vote off and a disruptive node.)"""
    results = [run_seed(seed, 3 if seed % 2 else 5, 20.0, quiet=False) for seed in range(1, 11)]
    failed = [result for result in results if not result.ok]
    assert not failed, "\n\n".join(format_failure(result) for result in failed[:3])

"""A watch of one key on the simulated sharded KV (the shipped nodes, services and client
rules on virtual time, with each seed's network faults and apply lag): while the key is
appended to, the leader of its group crashes, and its shard moves between groups, the
watch sees every write once, in revision order, with no gap. The run then ends as every
shardkv scenario does (linearizability, replicas agree, storage bounded)."""

from __future__ import annotations

import pytest

from quorumlog.shard.config import shard_for_key
from quorumlog.testing.sim.checks import check_invariant
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.shardkv.cluster import ShardCluster
from quorumlog.testing.sim.shardkv.runner import plan_options
from quorumlog.testing.sim.shardkv.scenarios import ScenarioRun, finish
from quorumlog.testing.sim.shardkv.watcher import SimShardWatcher

SEEDS = [1, 2, 3, 4]
ROUNDS = 12
CATCH_UP_MS_MAX = 20_000


def watch_through_crashes_and_moves(run: ScenarioRun) -> SimShardWatcher:
    cluster = run.cluster
    cluster.join(100, 101)
    key = run.keys_of_group(100)[0]
    shard = shard_for_key(key, cluster.options.shard_count)
    watcher = SimShardWatcher(cluster.new_client("watcher"), key, start_revision=1)
    watcher.start()
    values: list[str] = []

    def caught_up() -> bool:
        return len(watcher.events) >= len(values) or watcher.error is not None

    for round_number in range(ROUNDS):
        run.append(key)
        values.append(run.expected[key])
        owner = cluster.owner_of_key(key)
        if round_number % 3 == 1:
            leader = cluster.leader_of(owner)
            if leader is not None:
                leader.crash()
                cluster.run(run.rng.randint(100, 800))
                leader.restart()
        if round_number % 4 == 3:
            # A watch that has seen everything before a move misses nothing after it.
            check_invariant(cluster.run_until(caught_up, CATCH_UP_MS_MAX), "the watch fell behind")
            cluster.move(shard, 101 if owner == 100 else 100)
    check_invariant(cluster.run_until(caught_up, CATCH_UP_MS_MAX), "the watch fell behind")
    watcher.stop()
    check_invariant(watcher.error is None, f"the watch ended: {watcher.error!r}")
    seen = [(event.type, event.kv.value.decode()) for event in watcher.events]
    check_invariant(seen == [("PUT", value) for value in values], f"watched {seen}, wrote {values}")
    revisions = [event.kv.mod_revision for event in watcher.events]
    check_invariant(revisions == sorted(set(revisions)), f"revisions out of order: {revisions}")
    return watcher


@pytest.mark.parametrize("seed", SEEDS)
def test_a_watch_sees_every_write_across_crashes_and_moves(seed: int) -> None:
    cluster = ShardCluster(seed, plan_options(seed))
    run = ScenarioRun(cluster, derive_random(seed, "scenario:watch"))
    watcher = watch_through_crashes_and_moves(run)
    finish(run)
    assert run.linearizable is not False
    assert watcher.polls >= 4  # it long-polled throughout, not once at the end
    assert cluster.latest_configuration().number >= 4  # the shard moved three times

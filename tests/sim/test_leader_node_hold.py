"""Elections held while the leader's node is live (`RaftConfig.leader_node_hold_ticks`) and
commit-only heartbeats spaced (`RaftConfig.commit_heartbeat_ticks`), as the node sets them,
in the simulator: the shipped host, `GroupTicker` and `PeerLiveness` (testing/sim/node.py),
every invariant checked after every event.

A hold is liveness only, so what is checked is that it never stalls the cluster: a leader
whose node crashed, was cut off, or restarted is still replaced, and a leader whose node
pings but whose group says nothing is replaced once the bound runs out. The seed sweeps
run the quiet-group nemesis (idle spells, crashes, isolations, pauses, drops) with both
on, and the general nemesis (no liveness there, so no hold) with the spacing on.
"""

from __future__ import annotations

import os

import msgspec
import pytest

from quorumlog.raft.config import RaftConfig
from quorumlog.testing.sim import runner
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.runner import SeedPlan, format_failure, run_seed

ELECTION_TICKS = 10
HOLD_TICKS = ELECTION_TICKS
"""As the node sets it: one more election timeout."""
HOLD_RAFT = RaftConfig(
    node_id="template",
    election_ticks=ELECTION_TICKS,
    quiesce_idle_ticks=2,
    leader_node_hold_ticks=HOLD_TICKS,
)
HOLD_SEEDS = range(1, 1 + int(os.environ.get("QUORUMLOG_SIM_HOLD_SEEDS", "60")))
HOLD_SIMULATED_SECONDS = float(os.environ.get("QUORUMLOG_SIM_HOLD_SECONDS", "12"))
SPACING_SEEDS = range(1, 1 + int(os.environ.get("QUORUMLOG_SIM_SPACING_SEEDS", "12")))
COMMIT_HEARTBEAT_TICKS = 2
"""As the node sets it: election_ticks // 5."""


def hold_cluster(seed: int) -> SimCluster:
    return SimCluster(seed, SimOptions(node_count=3, raft=HOLD_RAFT))


def awake_leader(cluster: SimCluster) -> str:
    """A leader whose group is awake now (a write just went through it)."""
    leader = cluster.wait_for_leader()
    cluster.put("k", "v", ticks_max=60)
    return leader


def elections_held(cluster: SimCluster) -> int:
    return sum(node.core.elections_held for node in cluster.nodes.values() if node.up)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_crashed_leaders_node_is_replaced_within_the_usual_time(seed: int) -> None:
    cluster = hold_cluster(seed)
    old = awake_leader(cluster)
    cluster.crash(old)
    # Its node falls silent for the liveness window (10 ticks): no follower holds after.
    assert cluster.run_until(lambda: cluster.leader() not in (None, old), ticks_max=60), (
        cluster.describe()
    )
    cluster.put("after", "crash", ticks_max=60)


def test_an_isolated_leader_is_replaced_and_rejoins() -> None:
    cluster = hold_cluster(seed=14)
    old = awake_leader(cluster)
    cluster.isolate(old)
    assert cluster.run_until(
        lambda: cluster.leader() not in (None, old) and not cluster.nodes[old].is_leader,
        ticks_max=80,
    ), cluster.describe()
    cluster.heal()
    cluster.put("k", "healed", ticks_max=60)
    assert cluster.get("k", ticks_max=60) == "healed"


def test_restarted_nodes_elect_and_serve() -> None:
    cluster = hold_cluster(seed=15)
    awake_leader(cluster)
    for node_id in sorted(cluster.nodes):
        cluster.crash(node_id)
        cluster.run(ticks=5)
        cluster.restart(node_id)
        cluster.put(f"after-{node_id}", node_id, ticks_max=120)
    assert cluster.get("after-n3", ticks_max=60) == "n3"


def silence_group_at(cluster: SimCluster, node_id: str) -> None:
    """`node_id`'s group sends nothing more while its node's liveness pings still go out:
    its node is live, its group says nothing (as if it had stopped there)."""
    cluster.nodes[node_id].host.send_message = lambda message: None


def test_a_leader_whose_node_pings_but_whose_group_is_silent_is_replaced_after_the_bound() -> None:
    # A group that stays awake (a quiet one sends nothing anyway); liveness still runs.
    raft = msgspec.structs.replace(HOLD_RAFT, quiesce_idle_ticks=10**6)
    cluster = SimCluster(16, SimOptions(node_count=3, raft=raft))
    old = awake_leader(cluster)
    silence_group_at(cluster, old)
    # Without the hold an election timeout (10-20 ticks) and a round; with it, the bound
    # (10 ticks) on top.
    assert not cluster.run_until(lambda: cluster.leader() not in (None, old), ticks_max=15)
    assert elections_held(cluster) > 0
    assert cluster.run_until(lambda: cluster.leader() not in (None, old), ticks_max=30), (
        cluster.describe()
    )


def test_a_hold_that_ignored_the_leaders_silent_node_would_never_replace_it() -> None:
    """The simulator notices a hold that trusts a dead node: asked a liveness that always
    says "live", with no bound, the followers of a crashed leader wait for ever."""
    raft = msgspec.structs.replace(
        HOLD_RAFT, quiesce_idle_ticks=10**6, leader_node_hold_ticks=10**9
    )
    cluster = SimCluster(17, SimOptions(node_count=3, raft=raft))
    old = awake_leader(cluster)
    for node in cluster.nodes.values():
        node.host.use_node_liveness(lambda peer: True)
        assert node.liveness is not None
        node.liveness.unreachable = lambda peer: None  # nor told of the silence
    cluster.crash(old)
    assert not cluster.run_until(lambda: cluster.leader() not in (None, old), ticks_max=200)


def plan_as_the_node(seed: int, node_count: int, quiet: bool | None = None) -> SeedPlan:
    """The seed's plan with the node's hold and commit spacing."""
    plan = PLAN_SEED(seed, node_count) if quiet is None else PLAN_SEED(seed, node_count, quiet)
    raft = msgspec.structs.replace(
        plan.options.raft,
        leader_node_hold_ticks=HOLD_TICKS,
        commit_heartbeat_ticks=COMMIT_HEARTBEAT_TICKS,
    )
    options = msgspec.structs.replace(plan.options, raft=raft)
    return msgspec.structs.replace(plan, options=options)


PLAN_SEED = runner.plan_seed


def test_hold_seed_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds of quiet groups under the nemesis with the hold on: every invariant,
    linearizability, and liveness (the run's clients must finish)."""
    monkeypatch.setattr(runner, "plan_seed", plan_as_the_node)
    results = [
        run_seed(seed, 3 if seed % 2 else 5, HOLD_SIMULATED_SECONDS, quiet=True)
        for seed in HOLD_SEEDS
    ]
    failed = [result for result in results if not result.ok]
    assert not failed, "\n\n".join(format_failure(result) for result in failed[:3])


def test_commit_spacing_seed_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeds of the general nemesis (crashes, partitions, pauses, membership, slow disks)
    with commit-only heartbeats spaced: every invariant, linearizability, liveness."""
    monkeypatch.setattr(runner, "plan_seed", plan_as_the_node)
    results = [run_seed(seed, 3 if seed % 2 else 5) for seed in SPACING_SEEDS]
    failed = [result for result in results if not result.ok]
    assert not failed, "\n\n".join(format_failure(result) for result in failed[:3])

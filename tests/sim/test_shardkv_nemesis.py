"""The shard deployment's nemesis: paused members, seeded partitions and pauses, and the
seed plans that choose them."""

from __future__ import annotations

import pytest

from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError
from quorumlog.node.kv_service import Replier
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.raft.core import Role
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.shardkv.cluster import ShardCluster, ShardSimOptions
from quorumlog.testing.sim.shardkv.nemesis import (
    FAULT_KINDS,
    ShardNemesis,
    ShardNemesisOptions,
    weights_for,
)
from quorumlog.testing.sim.shardkv.runner import plan_options, run_shardkv_seed


def one_group(seed: int = 7) -> ShardCluster:
    cluster = ShardCluster(seed, ShardSimOptions())
    cluster.join(100)
    cluster.put("k", "v1")
    return cluster


def test_a_paused_leader_stops_then_resumes_with_its_state_and_steps_down() -> None:
    cluster = one_group()
    leader = cluster.leader_of(100)
    assert leader is not None
    term, applied = leader.core.term, leader.applied_index
    leader.pause()
    cluster.put("k", "v2")  # the others elect a leader and commit without it
    cluster.run(1000)
    assert (leader.core.term, leader.applied_index) == (term, applied)
    assert leader.core.role is Role.LEADER  # it cannot know yet
    assert leader.node.process.inbox  # what reached it meanwhile waits
    new_leader = cluster.leader_of(100)
    assert new_leader is not None and new_leader is not leader
    leader.resume()
    assert not leader.node.process.inbox
    assert cluster.run_until(
        lambda: (
            leader.applied_index == new_leader.applied_index and leader.core.role is Role.FOLLOWER
        ),
        5_000,
    )
    assert leader.core.term > term
    assert cluster.get("k") == "v2"
    cluster.shard_checker.check_replicas_agree()


def test_requests_to_a_paused_member_are_answered_after_it_resumes() -> None:
    cluster = one_group()
    member = cluster.group_members(100)[0]
    answers: list[wire.Frame] = []
    member.pause()
    read = wire.KVRead(request_id=1, keys=["k"], group=wire.shard_group_name(100))
    cluster.frames.register("client-probe", None)
    cluster.frames.call("client-probe", member.node_id, read, answers.append)
    cluster.run(2000)
    assert answers == []
    member.resume()
    cluster.run(100)
    assert len(answers) == 1


def test_a_crash_ends_a_pause_and_drops_what_was_held() -> None:
    cluster = one_group()
    member = cluster.group_members(100)[1]
    member.pause()
    cluster.run(500)
    assert member.node.process.inbox
    member.crash()
    assert not member.paused and not member.node.process.inbox
    member.resume()  # a no-op on a member that is down
    assert not member.up
    member.restart()
    cluster.settle()
    assert cluster.get("k") == "v1"


def nemesis_for(cluster: ShardCluster, options: ShardNemesisOptions) -> ShardNemesis:
    return ShardNemesis(cluster, options, derive_random(cluster.seed, "test-nemesis"))


def test_the_nemesis_injects_every_kind_then_heals_everything() -> None:
    cluster = ShardCluster(3, ShardSimOptions())
    cluster.join(100, 101, 102)
    nemesis = nemesis_for(cluster, ShardNemesisOptions(interval_ms_min=100, interval_ms_max=300))
    nemesis.start()
    cluster.run(15_000)
    assert set(nemesis.stats.faults) == set(FAULT_KINDS)
    assert nemesis.stats.one_way > 0
    nemesis.stop()
    assert not cluster.network.blocked
    members = cluster.controller_members + [
        member for gid in cluster.members for member in cluster.group_members(gid)
    ]
    assert not any(member.paused for member in members)
    cluster.settle()
    cluster.put("k", "after")
    assert cluster.get("k") == "after"


def test_one_way_cuts_block_one_direction_only() -> None:
    cluster = ShardCluster(4, ShardSimOptions())
    cluster.join(100)
    options = ShardNemesisOptions(
        one_way_probability=1.0,
        weights={"cut_controller": 1},
    )
    nemesis_for(cluster, options).start()
    assert cluster.run_until(lambda: bool(cluster.network.blocked), 5_000)
    blocked = cluster.network.blocked
    assert all((target, source) not in blocked for source, target in blocked)
    # One side sends into the void: the shard group or the controller group, not both.
    sources = {source.split("-")[0] for source, _ in blocked}
    targets = {target.split("-")[0] for _, target in blocked}
    assert len(sources) == 1 and len(targets) == 1 and sources != targets
    assert "ctl" in sources | targets


def test_pauses_leave_every_group_a_running_majority() -> None:
    cluster = ShardCluster(5, ShardSimOptions())
    cluster.join(100, 101)
    options = ShardNemesisOptions(
        interval_ms_min=20, interval_ms_max=60, paused_max=4, weights=weights_for(0, 1)
    )
    nemesis = nemesis_for(cluster, options)
    nemesis.start()
    groups = [cluster.controller_members] + [cluster.group_members(gid) for gid in cluster.members]
    most_paused = [0]

    def check() -> bool:
        paused = [sum(1 for member in group if member.paused) for group in groups]
        assert max(paused) <= 1, paused
        most_paused[0] = max(most_paused[0], sum(paused))
        return False

    cluster.run_until(check, 8_000)
    assert most_paused[0] >= 2  # pauses overlap, in different groups


def test_plans_vary_the_nemesis_and_the_concurrent_scenarios_use_it() -> None:
    weights = {tuple(sorted(plan_options(seed).nemesis.weights.items())) for seed in range(50)}
    assert len(weights) == 3  # mixed, partitions only, pauses only
    outcome = run_shardkv_seed(4)  # seed 4: concurrent_changes
    assert outcome.scenario == "concurrent_changes"
    assert outcome.result.ok, outcome.result.failure
    injected = sum(outcome.result.faults.get(kind, 0) for kind in FAULT_KINDS)
    assert injected > 0


def test_a_resumed_member_interleaves_links_but_keeps_each_links_order() -> None:
    cluster = one_group()
    member = cluster.group_members(100)[0]
    handled: list[tuple[str, int]] = []
    member.pause()
    for number in range(20):
        for link in ("raft:a", "rpc:b", "local"):
            member.node.process.enter(link, handled.append, (link, number))
    member.resume()
    assert len(handled) == 60
    for link in ("raft:a", "rpc:b", "local"):
        assert [number for name, number in handled if name == link] == list(range(20))
    assert handled != sorted(handled, key=lambda item: item[1])  # not arrival order


def test_a_queued_client_read_may_beat_the_new_leaders_messages() -> None:
    # A read that a paused leader queued may be handled first on its resume, as a process
    # after SIGCONT reads its sockets in any order; so answering reads from the applied
    # state without a ReadIndex round is caught.
    #
    # Rarely, though: of concurrent_changes seeds 4..1500 only two hit the window (a read
    # sent to a deposed leader that does not know it yet, after a write to its key
    # completed at the new leader, answered within the client's attempt timeout): 400 and
    # 562 before the Raft heartbeat fast path, 877 and 1435 after it and the snapshot-chunk
    # fix (as rare, other seeds; main also stalled on seed 526 in a snapshot-chunk storm,
    # KNOWN_CORE_BUGS.md core-16). The range below holds 877. The runs are deterministic,
    # so this cannot flake; but a change to the simulator's random streams or to Raft
    # timing moves the seed, and then the last assert fails: sweep the broken read path
    # over seeds 4..1500 again for one that fails (and widen the nemesis if none does).
    concurrent = range(832, 878, 9)  # concurrent_changes: the scenario with the nemesis

    def read_without_read_index(
        self: ShardGroupService, request: wire.KVRead | wire.KVScan, reply: Replier
    ) -> None:
        if not self.group.is_leader:
            self.reject(reply, request.request_id, NotLeaderError(self.group.node_id, None))
            return
        self.answer_read(request, reply)

    def failures() -> list[int]:
        failed: list[int] = []
        for seed in concurrent:
            outcome = run_shardkv_seed(seed, capture_trace=False)
            assert outcome.scenario == "concurrent_changes"
            if not outcome.result.ok:
                assert "not linearizable" in (outcome.result.failure or ""), seed
                failed.append(seed)
        return failed

    assert failures() == []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardGroupService, "read", read_without_read_index)
        assert failures() != [], "no seed in range finds the broken read path: re-pick seeds"

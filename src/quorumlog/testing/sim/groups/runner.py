"""Run consumer-group seeds: faults, the final heal, the checks.

The timeline of one seed:

    [0, heal)          consumers join, read, commit; from `fault_ms` the Raft nemesis
                       (crashes, pauses, partitions between coordinator nodes, leader
                       transfers, crashes mid-write) and the consumers' nemesis (leave
                       and join again, go silent shorter or longer than the session)
                       strike at seeded times, on a network that delays, drops and
                       duplicates frames
    heal               every fault ends, every node and consumer is up
    [heal, +settle)    every consumer must read what the coordinator assigns it, with no
                       rebalance under way; then the end checks

Invariants are checked as events happen (checks.py) and, at the end, the history of
commits and reads of committed offsets must be linearizable per partition.
"""

from __future__ import annotations

import functools
import hashlib
import time
import traceback
from collections.abc import Sequence

import msgspec

from quorumlog.testing.linearizability import KV_MODEL, check_linearizable
from quorumlog.testing.sim.checks import InvariantViolation, check_invariant
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.groups.world import GroupWorld, GroupWorldOptions
from quorumlog.testing.sim.nemesis import Nemesis, NemesisOptions
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.seed_runs import SeedRunSummary, format_seed_failure, map_seeds
from quorumlog.testing.sim.trace import TraceRecorder

SETTLE_MS = 20_000
TRACE_TAIL_LINES = 60
LINEARIZABILITY_STEPS_MAX = 200_000


class GroupPlan(msgspec.Struct, frozen=True):
    world: GroupWorldOptions
    nemesis: NemesisOptions
    fault_ms: int
    heal_ms: int


class GroupSeedResult(msgspec.Struct):
    seed: int
    ok: bool
    simulated_ms: int = 0
    wall_seconds: float = 0.0
    invariant_checks: int = 0
    operations: int = 0
    commits_ok: int = 0
    commits_refused: int = 0
    fenced_commits: int = 0
    takeovers_from_removed: int = 0
    generations_taken: int = 0
    heartbeats_answered: int = 0
    heartbeat_wait_ms: int = 0
    failure: str | None = None
    replay_command: str = ""
    trace_digest: str = ""
    trace_tail: list[str] = msgspec.field(default_factory=list)


def replay_command(seed: int) -> str:
    return f"quorumlog sim groups --seeds {seed}-{seed}"


def plan_seed(seed: int, seconds: float = 12.0) -> GroupPlan:
    rng = derive_random(seed, "groups-plan")
    network = NetworkFaults(
        delay_ms_min=1,
        delay_ms_max=rng.choice([3, 8, 15]),
        tail_probability=rng.choice([0.0, 0.01]),
        drop_probability=rng.choice([0.0, 0.01, 0.03]),
        duplicate_probability=rng.choice([0.0, 0.02]),
    )
    weights = {
        "partition": 3,
        "isolate_leader": 3,
        "cut": 2,
        "crash": 2,
        "crash_leader": 3,
        "pause": 3,
        "transfer": 2,
        "crash_mid_write": 1,
    }
    nemesis = NemesisOptions(
        interval_ms_min=300,
        interval_ms_max=2000,
        fault_ms_min=200,
        fault_ms_max=3000,
        weights=weights,
    )
    groups = {"billing": [["events", "orders"]] * 3}
    if rng.random() < 0.6:
        groups["audit"] = [["orders"], ["events", "orders"]]
    heal_ms = round(seconds * 1000)
    return GroupPlan(
        world=GroupWorldOptions(groups=groups, network=network),
        nemesis=nemesis,
        fault_ms=rng.randint(1500, 2500),
        heal_ms=heal_ms,
    )


class GroupSeed:
    def __init__(self, seed: int, plan: GroupPlan, trace: TraceRecorder | None) -> None:
        self.seed = seed
        self.plan = plan
        self.world = GroupWorld(seed, plan.world, trace)
        self.nemesis = Nemesis(self.world.cluster, plan.nemesis, derive_random(seed, "nemesis"))

    def run(self) -> None:
        world, plan = self.world, self.plan
        cluster = world.cluster
        world.start()
        world.events.schedule(plan.fault_ms, lambda _: self.start_faults())
        cluster.run_until_time(plan.heal_ms)
        self.nemesis.heal_all()
        world.stop_disturbing()
        settled = cluster.run_until(world.settled, SETTLE_MS // cluster.tick_ms)
        check_invariant(settled, f"the consumers did not settle {SETTLE_MS} ms after the heal:\n")
        cluster.run(ms=1000)
        self.final_checks()

    def start_faults(self) -> None:
        self.nemesis.start()
        self.world.start_disturbing()

    def final_checks(self) -> None:
        world = self.world
        world.cluster.check_converged()
        result = check_linearizable(
            world.history.operations(), KV_MODEL, time_budget_steps=LINEARIZABILITY_STEPS_MAX
        )
        if result.ok is False:
            raise InvariantViolation(
                f"committed offsets are not linearizable: {result.explanation}"
            )


def run_seed(
    seed: int,
    *,
    seconds: float = 12.0,
    trace: TraceRecorder | None = None,
    capture_trace: bool = True,
) -> GroupSeedResult:
    """Run one seed; on failure, run it again with tracing to capture the trace tail."""
    plan = plan_seed(seed, seconds)
    started = time.perf_counter()
    runner = GroupSeed(seed, plan, trace)
    failure = None
    try:
        runner.run()
    except InvariantViolation as error:
        failure = f"{error}\n{runner.world.describe()}"
    except Exception:  # a crash of the code under test is a finding too, with its seed
        failure = traceback.format_exc() + runner.world.describe()
    world = runner.world
    consumers = world.consumers.values()
    result = GroupSeedResult(
        seed=seed,
        ok=failure is None,
        simulated_ms=world.now_ms,
        wall_seconds=time.perf_counter() - started,
        invariant_checks=world.checker.checks + world.cluster.invariant_checks,
        operations=len(world.history),
        commits_ok=sum(consumer.commits_ok for consumer in consumers),
        commits_refused=sum(consumer.commits_refused for consumer in consumers),
        fenced_commits=world.checker.fenced_commits,
        takeovers_from_removed=world.checker.takeovers_from_removed,
        generations_taken=sum(consumer.taken_answers for consumer in consumers),
        heartbeats_answered=sum(consumer.heartbeats_answered for consumer in consumers),
        heartbeat_wait_ms=sum(consumer.heartbeat_wait_ms for consumer in consumers),
        failure=failure,
        replay_command=replay_command(seed),
    )
    if trace is not None:
        result.trace_digest = hashlib.sha256("\n".join(trace.lines).encode()).hexdigest()
    if failure is not None and capture_trace and trace is None:
        recorder = TraceRecorder()
        run_seed(seed, seconds=seconds, trace=recorder, capture_trace=False)
        result.trace_tail = recorder.tail(TRACE_TAIL_LINES)
    return result


class GroupRunSummary(SeedRunSummary[GroupSeedResult]):
    def world_figures(self) -> dict[str, object]:
        results = self.results
        return {
            "commits_acknowledged": sum(result.commits_ok for result in results),
            "commits_refused": sum(result.commits_refused for result in results),
            "fenced_commits": sum(result.fenced_commits for result in results),
            "takeovers_from_removed": sum(result.takeovers_from_removed for result in results),
            "heartbeat_wait_ms_mean": round(
                sum(result.heartbeat_wait_ms for result in results)
                / max(sum(result.heartbeats_answered for result in results), 1),
                2,
            ),
        }


def run_seeds(seeds: Sequence[int], jobs: int = 1, seconds: float = 12.0) -> GroupRunSummary:
    started = time.perf_counter()
    # The seconds go with every seed: a pool worker would otherwise run the default.
    results = map_seeds(functools.partial(run_seed, seconds=seconds), seeds, jobs)
    return GroupRunSummary.of(results, started)


def format_failure(result: GroupSeedResult) -> str:
    return format_seed_failure(result, "consumer groups")

"""Run seeds of the shard KV simulation: one scenario per seed, chosen and faulted by it.

Seed N runs scenario number N mod the scenario count (so consecutive seeds cover them
all), with settings drawn from the seed: network delays, drops and duplicates, snapshot
interval, chunked pulls (a small `pull_bytes_max` in some seeds), fsync latency, how far
members' applied state may lag their commit index (batches, delays, stalls), and how hard
the concurrent scenarios' nemesis partitions and pauses members (`shardkv.nemesis`). The
summary has the same shape as `quorumlog sim raft`'s (`sim.runner.RunSummary`); a failing
seed is reported with the scenario and the command that replays it, and a second traced
run of it supplies the trace tail.
"""

from __future__ import annotations

import time
import traceback

import msgspec

from quorumlog.raft.config import RaftConfig
from quorumlog.testing.history import OperationStatus
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.runner import RunSummary, SeedResult
from quorumlog.testing.sim.seed_runs import format_seed_failure, map_seeds
from quorumlog.testing.sim.shardkv.cluster import REPLICAS_PER_GROUP, ShardCluster, ShardSimOptions
from quorumlog.testing.sim.shardkv.nemesis import ShardNemesisOptions, weights_for
from quorumlog.testing.sim.shardkv.node import MemberOptions, ServerOptions
from quorumlog.testing.sim.shardkv.scenarios import SCENARIOS, ScenarioRun, finish
from quorumlog.testing.sim.trace import TraceRecorder

TRACE_TAIL_LINES = 60
APPLY_BATCH_CHOICES = (0, 1, 4, 16)
"""Entries applied per apply step; 0: no apply lag."""
NEMESIS_WEIGHT_CHOICES = (
    weights_for(1, 1),
    weights_for(1, 1),
    weights_for(1, 0),
    weights_for(0, 1),
)
"""Partitions and pauses mixed (twice as likely), partitions only, pauses only."""


def scenario_for_seed(seed: int) -> str:
    names = list(SCENARIOS)
    return names[seed % len(names)]


def plan_options(seed: int) -> ShardSimOptions:
    """The seed's settings; each choice widens what runs exercise (chunked pulls, frequent
    snapshots and small snapshot chunks, slow fsyncs that widen crash windows)."""
    rng = derive_random(seed, "shardkv-plan")
    raft = RaftConfig(
        node_id="template",
        election_ticks=10,
        heartbeat_ticks=1,
        pre_vote=rng.random() < 0.8,
        check_quorum=True,
        append_entries_max=rng.choice([4, 64]),
        snapshot_chunk_bytes_max=rng.choice([256, 1024 * 1024]),
    )
    fsync_ms_max = rng.choice([0, 3, 10])
    snapshot_interval_entries = rng.choice([8, 16, 48])
    snapshot_trailing_entries = rng.choice([0, 2, 8])
    server = ServerOptions(pull_bytes_max=rng.choice([0, 0, 24, 120]))
    network = NetworkFaults(
        delay_ms_min=1,
        delay_ms_max=rng.choice([5, 10, 20]),
        tail_probability=rng.choice([0.0, 0.01]),
        tail_delay_ms_max=300,
        drop_probability=rng.choice([0.0, 0.0, 0.01, 0.03]),
        duplicate_probability=rng.choice([0.0, 0.01, 0.03]),
    )
    # Drawn last so the draws above stay what they were for every seed. Most seeds let
    # members apply behind their commit index (bounded batches, seeded delays and stalls):
    # leaders then serve on an applied state that lags their log, as real ones do.
    member = MemberOptions(
        fsync_ms_max=fsync_ms_max,
        snapshot_interval_entries=snapshot_interval_entries,
        snapshot_trailing_entries=snapshot_trailing_entries,
        apply_batch_entries_max=rng.choice(APPLY_BATCH_CHOICES),
        apply_delay_ms_max=rng.choice([2, 10]),
        apply_stall_probability=rng.choice([0.0, 0.05, 0.2]),
        # Stalls of about a request timeout: long enough for another group to act on a
        # follower's newer state meanwhile, short enough that the stalled leader's answer
        # still reaches a requester waiting for it.
        apply_stall_ms_max=rng.choice([500, 800]),
    )
    # Drawn after everything above for the same reason; used by the concurrent scenarios
    # only. Faults last from under an election timeout (a leader paused briefly resumes
    # still leading, with held requests) to several (in the longest, a resumed leader's
    # migration requests have long timed out); every one is short enough that each
    # scripted step still ends well within its deadline.
    nemesis = ShardNemesisOptions(
        interval_ms_max=rng.choice([800, 1500, 3000]),
        fault_ms_max=rng.choice([800, 2000, 4000]),
        pause_ms_max=rng.choice([600, 1500, 4000]),
        one_way_probability=rng.choice([0.2, 0.5]),
        weights=rng.choice(NEMESIS_WEIGHT_CHOICES),
    )
    return ShardSimOptions(
        raft=raft, member=member, server=server, network=network, nemesis=nemesis
    )


def replay_command(seed: int, scenario: str | None) -> str:
    chosen = "" if scenario is None else f" --scenario {scenario}"
    return f"quorumlog sim shardkv --seeds {seed}-{seed}{chosen}"


class ShardSeedOutcome(msgspec.Struct):
    """A seed's result plus what the shard runner adds to the shared `SeedResult`."""

    result: SeedResult
    scenario: str
    chunks_applied: int = 0
    snapshots_restored: int = 0
    lagging_leaderships: int = 0
    """Shard group leaderships that began with applied behind commit (`SimStats`)."""
    deletes_ahead_of_apply: int = 0
    """Deletes a leader got for a configuration it had not applied yet: the state the
    delete handler must answer "not yet" in."""


def run_shardkv_seed(
    seed: int,
    scenario: str | None = None,
    *,
    trace: TraceRecorder | None = None,
    capture_trace: bool = True,
) -> ShardSeedOutcome:
    """Run one seed (its own scenario, or `scenario` if given); a failure is run again
    with tracing to capture the trace tail."""
    outcome = _run_once(seed, scenario, trace)
    result = outcome.result
    if not result.ok and trace is None and capture_trace:
        recorder = TraceRecorder(lines_max=TRACE_TAIL_LINES)
        replay = _run_once(seed, scenario, recorder)
        result.trace_tail = recorder.tail(TRACE_TAIL_LINES)
        if replay.result.failure != result.failure:
            result.failure = (
                f"{result.failure}\n(NOT DETERMINISTIC: the traced replay ended with: "
                f"{replay.result.failure})"
            )
    return outcome


def _run_once(seed: int, scenario: str | None, trace: TraceRecorder | None) -> ShardSeedOutcome:
    started = time.perf_counter()
    name = scenario if scenario is not None else scenario_for_seed(seed)
    options = plan_options(seed)
    result = SeedResult(
        seed=seed,
        node_count=REPLICAS_PER_GROUP * (len(options.gids) + 1),
        ok=True,
        simulated_ms=0,
        wall_seconds=0.0,
        invariant_checks=0,
        events=0,
        replay_command=replay_command(seed, scenario),
    )
    outcome = ShardSeedOutcome(result=result, scenario=name)
    cluster: ShardCluster | None = None
    run: ScenarioRun | None = None
    try:
        cluster = ShardCluster(seed, options, trace)
        run = ScenarioRun(cluster, derive_random(seed, f"scenario:{name}"))
        SCENARIOS[name](run)
        finish(run)
        result.linearizable = run.linearizable
    except Exception as error:  # any exception is a finding, reported with its seed
        result.ok = False
        kind = "invariant violated" if isinstance(error, InvariantViolation) else "exception"
        where = "".join(traceback.format_exception(error)[-6:])
        state = f"\ndeployment at {cluster.now_ms} ms:\n{cluster.describe()}" if cluster else ""
        result.failure = f"scenario {name}: {kind}: {type(error).__name__}: {error}\n{where}{state}"
    if cluster is not None:
        operations = cluster.history.operations()
        result.operations = len(operations)
        result.operations_ok = sum(1 for op in operations if op.status is OperationStatus.OK)
        result.operations_unknown = sum(
            1 for op in operations if op.status is OperationStatus.UNKNOWN
        )
        result.simulated_ms = cluster.now_ms
        result.invariant_checks = cluster.invariant_checks
        result.events = cluster.events.events_run
        result.faults = {
            "rpc_dropped": cluster.frames.stats.dropped_random,
            "rpc_duplicated": cluster.frames.stats.duplicated,
            "raft_dropped": sum(
                network.stats.dropped_random for network in cluster.raft_networks.values()
            ),
            "crashes": sum(
                member.crash_count
                for gid in cluster.members
                for member in cluster.group_members(gid)
            ),
        }
        if run is not None and run.nemesis is not None:
            nemesis_stats = run.nemesis.stats
            result.faults.update(sorted(nemesis_stats.faults.items()))
            result.faults["one_way"] = nemesis_stats.one_way
        stats = cluster.stats
        outcome.chunks_applied = len(stats.inserts_applied)
        outcome.lagging_leaderships = stats.lagging_leaderships
        outcome.deletes_ahead_of_apply = stats.deletes_ahead_of_apply
        outcome.snapshots_restored = stats.snapshots_restored
    result.wall_seconds = time.perf_counter() - started
    return outcome


def _run_job(arguments: tuple[int, str | None]) -> ShardSeedOutcome:
    seed, scenario = arguments
    return run_shardkv_seed(seed, scenario)


class ShardRunSummary(msgspec.Struct):
    summary: RunSummary
    outcomes: list[ShardSeedOutcome]

    def to_json_line(self) -> dict[str, object]:
        return self.summary.to_json_line()


def run_shardkv_seeds(
    first: int, last: int, *, scenario: str | None = None, jobs: int = 1
) -> ShardRunSummary:
    """Run seeds `first`..`last` (inclusive), in `jobs` processes; results in seed order."""
    if scenario is not None and scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    started = time.perf_counter()
    job_list = [(seed, scenario) for seed in range(first, last + 1)]
    outcomes = map_seeds(_run_job, job_list, jobs)
    summary = RunSummary.of([outcome.result for outcome in outcomes], started)
    return ShardRunSummary(summary=summary, outcomes=outcomes)


def format_failure(outcome: ShardSeedOutcome) -> str:
    return format_seed_failure(outcome.result, f"scenario {outcome.scenario}")


__all__ = [
    "ShardRunSummary",
    "ShardSeedOutcome",
    "format_failure",
    "plan_options",
    "run_shardkv_seed",
    "run_shardkv_seeds",
    "scenario_for_seed",
]

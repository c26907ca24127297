"""Run whole seeds: seeded settings, workload, nemesis, final heal, end-of-run checks.

A seed fixes everything: the Raft settings drawn for it, the network's faults, the disk's
latency and torn tails, the clients' operations and the nemesis schedule. The timeline of
a run of `simulated_seconds`:

    [0, heal)                  workload + nemesis
    [heal, heal + liveness)    every fault ended; a write called in here must complete
    [.., end - drain)          workload goes on
    [end - drain, end]         workload stops
    then                       every member must catch up with the leader's commit within
                               the liveness bound (often at once), and agree on the state

A failure is reported with the command that replays it and, from a second run of the same
seed with tracing on, the tail of the trace.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
import traceback
from collections.abc import Iterator, Sequence

import msgspec

from quorumlog.kv.machine import KVStateMachine
from quorumlog.raft.config import RaftConfig
from quorumlog.testing.history import Operation, OperationStatus
from quorumlog.testing.sim.checks import InvariantViolation, check_invariant
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.nemesis import Nemesis, NemesisOptions
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.node import NodeOptions
from quorumlog.testing.sim.seed_runs import SeedRunSummary, format_seed_failure, map_seeds
from quorumlog.testing.sim.trace import TraceRecorder
from quorumlog.testing.sim.workload import WorkloadOptions, appends_applied_twice

LIVENESS_TICKS = 200
GC_THRESHOLDS_DURING_RUN = (50_000, 20, 100)
"""`gc.set_threshold` while a seed runs (Python's default is 700, 10, 10). A run allocates
millions of short-lived objects (messages, Readies, events) that form no cycles, so frequent
collections, the full ones above all, only rescan live state. Measured on seeds 1-50: 1-4%
less CPU time (noisy on a shared machine), though hardly fewer instructions: what it saves
is mostly the cache misses of walking the whole heap."""
"""After the final heal, a newly called write must complete within this many ticks."""
DRAIN_MS = 3000
LIVENESS_WINDOW_MS_MIN = 4000
"""The least time between the final heal and the liveness deadline. A short run heals
earlier to keep it: with the heal at 40% of the run and `DRAIN_MS` after the deadline, a
10 s run left 3 s and a 5 s run none (every seed "failed" liveness, its deadline before the
heal); 1.5 s still failed 7 of 200 seeds that recover after an election or two."""
SIMULATED_SECONDS_MIN = (DRAIN_MS + LIVENESS_WINDOW_MS_MIN) / 1000
"""A run needs the drain and the liveness window after the heal; a shorter one is refused."""
TRACE_TAIL_LINES = 60
LINEARIZABILITY_STEPS_MAX = 2_000_000
RACE_SEED_FRACTION = 0.3
"""Seeds (of five nodes or more) whose membership cycles may run as races (nemesis.py)."""
LEASE_TRANSFER_SEED_FRACTION = 0.3
BIT_FLIP_SEED_FRACTION = 0.2
BIT_FLIP_PROBABILITY = 0.0005
"""Per read, in the seeds whose disks flip bits: a few flips a run, each one caught by the
stores' checksums and stopping that node's group (the node is then restarted)."""
DISK_FULL_SEED_FRACTION = 0.25
QUIET_SEED_FRACTION = 0.25
"""Seeds whose groups go quiet when idle (with node-level liveness), and whose clients
fall silent now and then (the nemesis's `idle`) so that they do, under the other faults."""
"""Seeds that serve lease reads and cut old leaders off right after a transfer."""


class SeedPlan(msgspec.Struct, frozen=True):
    """Everything a seed decides before the run starts."""

    options: SimOptions
    nemesis: NemesisOptions


class SeedResult(msgspec.Struct):
    seed: int
    node_count: int
    ok: bool
    simulated_ms: int
    wall_seconds: float
    invariant_checks: int
    events: int
    operations: int = 0
    operations_ok: int = 0
    operations_unknown: int = 0
    linearizable: bool | None = None
    failure: str | None = None
    replay_command: str = ""
    trace_tail: list[str] = msgspec.field(default_factory=list)
    faults: dict[str, int] = msgspec.field(default_factory=dict)


def replay_command(
    seed: int, node_count: int, simulated_seconds: float, quiet: bool | None = None
) -> str:
    seconds = "" if simulated_seconds == 30 else f" --seconds {simulated_seconds:g}"
    quiet_flag = " --quiet-groups" if quiet else ""
    return f"quorumlog sim raft --seeds {seed}-{seed} --nodes {node_count}{seconds}{quiet_flag}"


def plan_seed(seed: int, node_count: int, quiet: bool | None = None) -> SeedPlan:
    """Draw the settings of one seed. Each choice widens what the run exercises: tiny
    append batches and windows (pipelining), small pending limits (PendingFullError),
    frequent snapshots and small chunks (INSTALL_SNAPSHOT), slow fsyncs (crash windows).

    `quiet`: True makes the seed one of quiet groups (idle groups quiesce, clients fall
    silent now and then), False never; None: a `QUIET_SEED_FRACTION` of seeds are."""
    rng = derive_random(seed, "plan")
    membership = rng.random() < 0.3
    pauses = rng.random() < 0.7
    raft = RaftConfig(
        node_id="template",
        election_ticks=10,
        heartbeat_ticks=1,
        pre_vote=rng.random() < 0.8,
        check_quorum=True,
        lease_read=(not pauses) and rng.random() < 0.3,
        append_entries_max=rng.choice([1, 4, 16, 256]),
        inflight_appends_max=rng.choice([1, 4, 64]),
        append_timeout_ticks=rng.choice([2, 4, 8]),
        pending_entries_max=rng.choice([4, 16, 10_000]),
        snapshot_chunk_bytes_max=rng.choice([64, 512, 1024 * 1024]),
    )
    network = NetworkFaults(
        delay_ms_min=1,
        delay_ms_max=rng.choice([5, 10, 20, 30]),
        tail_probability=rng.choice([0.0, 0.01, 0.05]),
        tail_delay_ms_max=rng.choice([100, 400, 1000]),
        drop_probability=rng.choice([0.0, 0.01, 0.05, 0.1]),
        duplicate_probability=rng.choice([0.0, 0.01, 0.05]),
        fifo_links=rng.random() < 0.5,
    )
    node = NodeOptions(
        tick_ms=50,
        fsync_ms_min=0,
        fsync_ms_max=rng.choice([0, 2, 10]),
        snapshot_interval_entries=rng.choice([8, 32, 128]),
        snapshot_trailing_entries=rng.choice([0, 2, 16]),
        torn_tail_probability=0.5,
    )
    workload = WorkloadOptions(
        client_count=rng.randint(2, 5),
        key_count=rng.choice([1, 2, 3, 5]),
        think_ms_min=0,
        think_ms_max=rng.choice([60, 150, 400]),
    )
    weights = dict(NemesisOptions().weights)
    weights["membership"] = 3 if membership else 0
    if not pauses:
        weights["pause"] = 0
    interval_ms_max = rng.choice([1000, 2500, 5000])
    fault_ms_max = rng.choice([1500, 4000])
    # Drawn after every choice above, so a seed without these shapes keeps its plan.
    race = rng.random() < RACE_SEED_FRACTION and node_count >= 5
    lease_transfers = rng.random() < LEASE_TRANSFER_SEED_FRACTION
    if race:
        weights["membership"] = 3
    if lease_transfers:
        raft = msgspec.structs.replace(raft, lease_read=True)
        # Many clients that start afresh at a random node: one that reads at the old
        # leader right after another wrote at the new one is what a stale lease shows.
        workload = msgspec.structs.replace(workload, reconnect_fraction=0.6, read_fraction=0.6)
        weights["pause"] = 0  # a paused leader's ticks stop: no lease survives a SIGSTOP
        weights["transfer_then_cut"] = 3
    # Drawn after those too: disks that flip bits on reads, and disks that fill up.
    if rng.random() < BIT_FLIP_SEED_FRACTION:
        node = msgspec.structs.replace(node, read_bit_flip_probability=BIT_FLIP_PROBABILITY)
    if rng.random() < DISK_FULL_SEED_FRACTION:
        weights["disk_full"] = 2
    # Drawn last, so that the seeds without quiet groups keep their plans.
    quiet_drawn = rng.random() < QUIET_SEED_FRACTION
    if quiet if quiet is not None else quiet_drawn:
        raft = msgspec.structs.replace(raft, quiesce_idle_ticks=rng.choice([1, 2, 4]))
        weights["idle"] = 4
    nemesis = NemesisOptions(
        interval_ms_min=300,
        interval_ms_max=interval_ms_max,
        fault_ms_min=200,
        fault_ms_max=fault_ms_max,
        weights=weights,
        membership_race_probability=0.5 if race else 0.0,
    )
    options = SimOptions(
        node_count=node_count, raft=raft, node=node, network=network, workload=workload
    )
    return SeedPlan(options=options, nemesis=nemesis)


def silence_simulated_nodes() -> None:
    """Keep the simulated nodes' own log lines (a group stopped on a flipped bit, a log
    reset at open) off the console: they are events the nemesis caused on purpose, and a
    failing seed reports its trace instead."""
    logging.getLogger("quorumlog").setLevel(logging.CRITICAL)


def run_seed(
    seed: int,
    node_count: int = 3,
    simulated_seconds: float = 30,
    *,
    trace: TraceRecorder | None = None,
    capture_trace: bool = True,
    quiet: bool | None = None,
) -> SeedResult:
    """Run one seed; on failure, run it again with tracing to capture the trace tail.
    `quiet`: see `plan_seed`."""
    result = _run_once(seed, node_count, simulated_seconds, trace, quiet)
    if not result.ok and trace is None and capture_trace:
        recorder = TraceRecorder(lines_max=TRACE_TAIL_LINES)
        replay = _run_once(seed, node_count, simulated_seconds, recorder, quiet)
        result.trace_tail = recorder.tail(TRACE_TAIL_LINES)
        if replay.failure != result.failure:
            result.failure = (
                f"{result.failure}\n(NOT DETERMINISTIC: the traced replay ended with: "
                f"{replay.failure})"
            )
    return result


def _run_once(
    seed: int,
    node_count: int,
    simulated_seconds: float,
    trace: TraceRecorder | None,
    quiet: bool | None = None,
) -> SeedResult:
    if simulated_seconds < SIMULATED_SECONDS_MIN:
        raise ValueError(
            f"a run of {simulated_seconds:g} simulated seconds leaves no time to check liveness "
            f"after the final heal; the shortest is {SIMULATED_SECONDS_MIN:g}"
        )
    started = time.perf_counter()
    # Without `quiet`, called as before: tests put plans of their own in its place.
    plan = plan_seed(seed, node_count) if quiet is None else plan_seed(seed, node_count, quiet)
    end_ms = int(simulated_seconds * 1000)
    cluster: SimCluster | None = None
    nemesis: Nemesis | None = None
    result = SeedResult(
        seed=seed,
        node_count=node_count,
        ok=True,
        simulated_ms=0,
        wall_seconds=0.0,
        invariant_checks=0,
        events=0,
        replay_command=replay_command(seed, node_count, simulated_seconds, quiet),
    )
    try:
        with _fewer_collections():
            cluster = SimCluster(seed, plan.options, trace)
            nemesis = Nemesis(cluster, plan.nemesis, derive_random(seed, "nemesis"))
            _run_timeline(cluster, nemesis, end_ms)
            _check_history(cluster, result)
    except Exception as error:  # any exception is a finding, reported with its seed
        result.ok = False
        result.failure = _describe_failure(error, cluster)
    if cluster is not None:
        result.simulated_ms = cluster.now_ms
        result.invariant_checks = cluster.invariant_checks
        result.events = cluster.events.events_run
    if nemesis is not None:
        result.faults = dict(sorted(nemesis.stats.faults.items()))
    result.wall_seconds = time.perf_counter() - started
    return result


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect the young generation less often during a run; the caller's settings come
    back afterwards. Garbage is still collected (cycles included), only in larger batches."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*map(max, thresholds, GC_THRESHOLDS_DURING_RUN))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _run_timeline(cluster: SimCluster, nemesis: Nemesis, end_ms: int) -> None:
    tick_ms = cluster.tick_ms
    liveness_ms = LIVENESS_TICKS * tick_ms
    workload_end_ms = end_ms - DRAIN_MS
    heal_ms = min(
        max(int(end_ms * 0.4), workload_end_ms - liveness_ms - 1000),
        workload_end_ms - LIVENESS_WINDOW_MS_MIN,
    )
    liveness_deadline_ms = min(heal_ms + liveness_ms, workload_end_ms)
    cluster.workload.start()
    nemesis.start()
    cluster.run_until_time(heal_ms)
    nemesis.heal_all()
    cluster.run_until_time(liveness_deadline_ms)
    first = cluster.workload.stats.first_write_invoked_after(heal_ms)
    check_invariant(
        first is not None and first <= liveness_deadline_ms,
        f"liveness: no write called after the final heal at {heal_ms} ms completed by "
        f"{liveness_deadline_ms} ms\n{cluster.describe()}",
    )
    cluster.run_until_time(workload_end_ms)
    cluster.workload.stop()
    cluster.run_until_time(end_ms)
    # Quiet now: every member must catch up within the liveness bound (usually at once).
    caught_up = cluster.run_until(lambda: _lagging(cluster) == [], LIVENESS_TICKS)
    check_invariant(
        caught_up,
        f"members {_lagging(cluster)} did not catch up with the leader's commit within "
        f"{LIVENESS_TICKS} ticks of quiet after the workload stopped\n{cluster.describe()}",
    )
    cluster.check_converged()


def _lagging(cluster: SimCluster) -> list[str]:
    """Members that have not applied the leader's commit index (all, if no leader)."""
    leader_id = cluster.leader()
    if leader_id is None:
        return sorted(cluster.nodes)
    leader = cluster.nodes[leader_id]
    commit = leader.core.commit_index
    return [
        node_id
        for node_id in sorted(leader.core.configuration.members())
        if not cluster.nodes[node_id].up or cluster.nodes[node_id].applied_index < commit
    ]


def _check_history(cluster: SimCluster, result: SeedResult) -> None:
    operations = cluster.history.operations()
    result.operations = len(operations)
    result.operations_ok = sum(1 for op in operations if op.status is OperationStatus.OK)
    result.operations_unknown = sum(1 for op in operations if op.status is OperationStatus.UNKNOWN)
    verdict = cluster.check_linearizable(LINEARIZABILITY_STEPS_MAX)
    result.linearizable = verdict.ok
    check_invariant(verdict.ok is not False, f"not linearizable: {verdict.explanation}")
    _check_exactly_once(cluster, operations)


def _check_exactly_once(cluster: SimCluster, operations: list[Operation]) -> None:
    """Retried writes took effect once: no append's value twice in the converged state,
    and no client told its session is gone (sessions outlive any run: a refusal means
    the machine lost one)."""
    node = max(
        (node for node in cluster.nodes.values() if node.up),
        key=lambda node: node.applied_index,
        default=None,
    )
    if node is not None and isinstance(node.machine, KVStateMachine):
        twice = appends_applied_twice(operations, node.machine.data)
        check_invariant(not twice, f"appends applied twice (sessions did not dedup): {twice}")
    expired = cluster.workload.stats.sessions_expired
    check_invariant(expired == 0, f"clients were told {expired} times that a session is gone")


def _describe_failure(error: Exception, cluster: SimCluster | None) -> str:
    kind = "invariant violated" if isinstance(error, InvariantViolation) else "exception"
    where = "".join(traceback.format_exception(error)[-6:])
    state = f"\ncluster at {cluster.now_ms} ms:\n{cluster.describe()}" if cluster else ""
    return f"{kind}: {type(error).__name__}: {error}\n{where}{state}"


# --- many seeds -----------------------------------------------------------------------


class RunSummary(SeedRunSummary[SeedResult]):
    @property
    def linearizability_undecided(self) -> list[int]:
        """Seeds that passed but whose history the checker could not decide in its budget."""
        return [result.seed for result in self.results if result.ok and result.linearizable is None]

    def world_figures(self) -> dict[str, object]:
        return {"linearizability_undecided": self.linearizability_undecided}


def _run_seed_job(arguments: tuple[int, int, float, bool | None]) -> SeedResult:
    seed, node_count, simulated_seconds, quiet = arguments
    return run_seed(seed, node_count, simulated_seconds, quiet=quiet)


def run_seeds(
    seeds: Sequence[int],
    node_count: int = 3,
    simulated_seconds: float = 30,
    jobs: int = 1,
    quiet: bool | None = None,
) -> RunSummary:
    """Run every seed (in `jobs` processes); results come back in seed order."""
    started = time.perf_counter()
    jobs_list = [(seed, node_count, simulated_seconds, quiet) for seed in seeds]
    return RunSummary.of(map_seeds(_run_seed_job, jobs_list, jobs), started)


def format_failure(result: SeedResult) -> str:
    return format_seed_failure(result, f"{result.node_count} nodes")


def parse_seed_range(text: str) -> range:
    """ "7" or "10-19" (inclusive) -> a range of seeds."""
    low_text, _, high_text = text.partition("-")
    low = int(low_text)
    high = int(high_text) if high_text else low
    if high < low:
        raise ValueError(f"seed range {text!r} is empty")
    return range(low, high + 1)

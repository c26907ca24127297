"""Run ledger seeds: the seed's settings, clients, nemesis, the final heal, the checks.

The timeline of one seed:

    [0, heal)                 writers append; recoverers open the ledger with recovery at
                              seeded times (sometimes two at once), readers open it without;
                              the nemesis crashes, pauses, partitions and fills disks
    heal                      every fault ends
    [heal, heal + liveness)   every recovery started must finish, and the checker's own
                              recovery and read-back of every ledger must finish
    then                      the end-of-seed checks (checks.py)

A failed seed is reported with the command that replays it and, from a second run of the
same seed with tracing on, the tail of its trace.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Sequence

import msgspec

from quorumlog.ledger.metadata import new_ledger_metadata
from quorumlog.ledger.placement import choose_ensemble
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from quorumlog.testing.sim.checks import InvariantViolation, check_invariant
from quorumlog.testing.sim.events import derive_random, draw_int
from quorumlog.testing.sim.ledger.bookies import SimBookieOptions
from quorumlog.testing.sim.ledger.checks import ReadBack, check_ledger
from quorumlog.testing.sim.ledger.clients import LinkFaults
from quorumlog.testing.sim.ledger.metadata import MetadataFaults
from quorumlog.testing.sim.ledger.nemesis import LedgerNemesis, LedgerNemesisOptions
from quorumlog.testing.sim.ledger.workload import (
    CheckCounter,
    LedgerRecord,
    Reader,
    Recoverer,
    Writer,
)
from quorumlog.testing.sim.ledger.world import LedgerWorld, WorldOptions
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.seed_runs import SeedRunSummary, format_seed_failure, map_seeds
from quorumlog.testing.sim.trace import TraceRecorder

SHAPES = ((3, 2, 2), (3, 3, 2), (5, 3, 2), (4, 2, 2))
"""(ensemble, write quorum, ack quorum) of the seeds' ledgers."""
LIVENESS_MS = 30_000
"""After the final heal, every recovery (and the read-back) must finish within this."""
READ_BACK_MS_PER_ENTRY = 10
"""The read-back's deadline grows with the ledger: seeds that read 4 entries a frame over
a slow, lossy network need it."""
WRITER_STOP_MS = 10_000
"""After the checks, a writer still running must learn within this that it was fenced."""
TRACE_TAIL_LINES = 80
PASSWORD = b"sim-password"


class LedgerPlan(msgspec.Struct, frozen=True):
    """Everything a seed decides before it runs."""

    world: WorldOptions
    nemesis: LedgerNemesisOptions
    shape: tuple[int, int, int]
    ledger_count: int
    heal_ms: int
    think_ms_max: int
    batch_entries_max: int
    recovery_ms: list[int]
    """Per ledger: when its (first) recoverer starts; the second one, if any, 0-30 ms on."""
    second_recoverer: list[bool]
    writer_close_ms: list[int | None]
    """Per ledger: when its writer closes the ledger itself (None: it never does)."""
    reader_interval_ms: int


class LedgerSeedResult(msgspec.Struct):
    seed: int
    ok: bool
    shape: tuple[int, int, int] = (0, 0, 0)
    simulated_ms: int = 0
    wall_seconds: float = 0.0
    invariant_checks: int = 0
    events: int = 0
    entries_appended: int = 0
    entries_acknowledged: int = 0
    entries_read: int = 0
    recoveries: int = 0
    ensemble_changes: int = 0
    fenced_writers: int = 0
    failure: str | None = None
    replay_command: str = ""
    trace_digest: str = ""
    trace_tail: list[str] = msgspec.field(default_factory=list)
    faults: dict[str, int] = msgspec.field(default_factory=dict)


def replay_command(seed: int) -> str:
    return f"quorumlog sim ledger --seeds {seed}-{seed}"


def plan_seed(seed: int) -> LedgerPlan:
    rng = derive_random(seed, "ledger-plan")
    shape = rng.choice(SHAPES)
    ledger_count = 2 if rng.random() < 0.35 else 1
    protocol = LedgerProtocolConfig(
        request_timeout_ticks=rng.choice([10, 25, 50]),
        retry_delay_ticks=rng.choice([2, 5]),
        batch_entries_max=rng.choice([1, 8, 4096]),
        inflight_requests_max=rng.choice([1, 4, 64]),
        pending_entries_max=rng.choice([16, 256, 200_000]),
        read_entries_max=rng.choice([4, 64, 4096]),
        quarantine_ticks=rng.choice([50, 1000]),
    )
    network = NetworkFaults(
        delay_ms_min=1,
        delay_ms_max=rng.choice([2, 5, 10, 20]),
        tail_probability=rng.choice([0.0, 0.01, 0.05]),
        tail_delay_ms_max=rng.choice([100, 400]),
        drop_probability=rng.choice([0.0, 0.0, 0.002, 0.01]),
        duplicate_probability=rng.choice([0.0, 0.01]),
    )
    world = WorldOptions(
        bookie_count=shape[0] + rng.randint(1, 3),
        bookie=SimBookieOptions(
            fsync_ms_min=0,
            fsync_ms_max=rng.choice([0, 2, 10]),
            read_bit_flip_probability=0.001 if rng.random() < 0.2 else 0.0,
        ),
        network=network,
        links=LinkFaults(break_probability=rng.choice([0.0, 0.001, 0.01])),
        metadata=MetadataFaults(
            latency_ms_max=rng.choice([2, 10, 30]),
            unavailable_probability=rng.choice([0.0, 0.05, 0.2]),
        ),
        protocol=protocol,
    )
    nemesis = LedgerNemesisOptions(
        interval_ms_min=100,
        interval_ms_max=rng.choice([400, 1000, 2000]),
        fault_ms_min=100,
        fault_ms_max=rng.choice([600, 1500, 3000]),
    )
    heal_ms = rng.randint(3000, 6000)
    recovery_ms = [rng.randint(300, heal_ms) for _ in range(ledger_count)]
    return LedgerPlan(
        world=world,
        nemesis=nemesis,
        shape=shape,
        ledger_count=ledger_count,
        heal_ms=heal_ms,
        think_ms_max=rng.choice([5, 20, 60]),
        batch_entries_max=rng.choice([1, 5, 20]),
        recovery_ms=recovery_ms,
        second_recoverer=[rng.random() < 0.4 for _ in range(ledger_count)],
        writer_close_ms=[
            rng.randint(100, at) if rng.random() < 0.15 else None for at in recovery_ms
        ],
        reader_interval_ms=rng.choice([50, 150, 300]),
    )


class LedgerSeed:
    """One seed's world, clients and records, run along the timeline."""

    def __init__(self, seed: int, plan: LedgerPlan, trace: TraceRecorder | None) -> None:
        self.seed = seed
        self.plan = plan
        self.checks = CheckCounter()
        self.world = LedgerWorld(seed, plan.world, trace)
        self.nemesis = LedgerNemesis(self.world, plan.nemesis, derive_random(seed, "nemesis"))
        self.records: list[LedgerRecord] = []
        self.writers: list[Writer] = []
        self.recoverers: list[Recoverer] = []
        self.readers: list[Reader] = []
        for number in range(plan.ledger_count):
            self.add_ledger(number)

    def add_ledger(self, number: int) -> None:
        plan, world = self.plan, self.world
        ensemble_size, write_quorum, ack_quorum = plan.shape
        writable = [bookie.bookie_id for bookie in world.store.writable_bookies()]
        ensemble = choose_ensemble(writable, ensemble_size, derive_random(self.seed, "place"))
        metadata = world.store.create_ledger(
            new_ledger_metadata(
                ensemble=ensemble,
                write_quorum_size=write_quorum,
                ack_quorum_size=ack_quorum,
                password=PASSWORD,
            )
        )
        record = LedgerRecord(metadata, PASSWORD, self.checks)
        self.records.append(record)
        writer_client = world.add_client(f"writer{number}")
        writer = Writer(
            record,
            writer_client,
            derive_random(self.seed, f"writer{number}"),
            plan.think_ms_max,
            plan.batch_entries_max,
        )
        self.writers.append(writer)
        writer_client.run(writer.start)
        close_ms = plan.writer_close_ms[number]
        if close_ms is not None:
            writer_client.run(writer.close, close_ms)
        recoverer_count = 2 if plan.second_recoverer[number] else 1
        offsets_ms = [0, draw_int(derive_random(self.seed, f"second{number}"), 0, 30)]
        for index in range(recoverer_count):
            client = world.add_client(f"recoverer{number}{'ab'[index]}")
            recoverer = Recoverer(record, client, None)
            self.recoverers.append(recoverer)
            client.run(recoverer.start, plan.recovery_ms[number] + offsets_ms[index])
        reader_client = world.add_client(f"reader{number}")
        reader = Reader(
            record,
            reader_client,
            derive_random(self.seed, f"reader{number}"),
            plan.reader_interval_ms,
        )
        self.readers.append(reader)
        reader_client.run(reader.start, draw_int(derive_random(self.seed, "r"), 1, 200))

    def run(self) -> None:
        world = self.world
        self.nemesis.start()
        world.run_until_time(self.plan.heal_ms)
        self.nemesis.heal_all()
        deadline_ms = self.plan.heal_ms + LIVENESS_MS
        checker_client = world.add_client("checker")
        final = [Recoverer(record, checker_client, None) for record in self.records]
        for recoverer in final:
            checker_client.run(recoverer.start)
        everyone = self.recoverers + final
        finished = world.run_until(
            lambda: all(recoverer.result is not None for recoverer in everyone), deadline_ms
        )
        check_invariant(
            finished,
            "liveness: recoveries unfinished "
            f"{[r.client.name for r in everyone if r.result is None]} "
            f"{LIVENESS_MS} ms after the final heal (failures: "
            f"{[r.failures[-3:] for r in everyone if r.result is None]})",
        )
        for reader in self.readers:
            reader.stopped = True
        read_backs: list[ReadBack] = []
        for recoverer in final:
            result = recoverer.result
            check_invariant(result is not None, "the checker's recovery has no result")
            if result is not None:
                read_back = ReadBack(checker_client, result)
                read_backs.append(read_back)
                checker_client.run(read_back.start)
        entries = sum(read_back.closed.last_entry_id + 1 for read_back in read_backs)
        deadline_ms = world.now_ms + LIVENESS_MS + READ_BACK_MS_PER_ENTRY * entries
        read = world.run_until(lambda: all(r.finished for r in read_backs), deadline_ms)
        check_invariant(read, f"liveness: the read-back did not finish by {deadline_ms} ms")
        for record, recoverer, read_back in zip(self.records, final, read_backs, strict=True):
            if recoverer.result is not None:
                check_ledger(world, record, recoverer.result, read_back, self.checks.check)
        world.store.versions_never_went_back()
        self.check_writers_stop(world.now_ms + WRITER_STOP_MS)

    def check_writers_stop(self, deadline_ms: int) -> None:
        """Every writer still running fails once its ledger is recovered (its next adds
        are fenced, or its next metadata change finds the ledger closed)."""
        running = [
            writer
            for writer in self.writers
            if writer.handle is not None and writer.client.process.up and not writer.stopped
        ]

        def still_writing() -> list[str]:
            return [
                writer.client.name
                for writer in running
                if writer.handle is None or writer.handle.failure is None
            ]

        stopped = self.world.run_until(lambda: not still_writing(), deadline_ms)
        check_invariant(
            stopped,
            f"liveness: writers {still_writing()} still write to recovered ledgers at "
            f"{deadline_ms} ms",
        )

    def fill(self, result: LedgerSeedResult) -> None:
        world = self.world
        result.simulated_ms = world.now_ms
        result.invariant_checks = self.checks.count + world.store.checks
        result.events = world.events.events_run
        result.entries_appended = sum(len(record.appended) for record in self.records)
        result.entries_acknowledged = sum(
            record.acknowledged_through + 1 for record in self.records
        )
        result.entries_read = sum(record.read_entries for record in self.records)
        result.recoveries = sum(len(record.closes) for record in self.records)
        result.ensemble_changes = sum(
            len(world.store.read_ledger(record.ledger_id).ensembles) - 1 for record in self.records
        )
        result.fenced_writers = sum(
            1 for record in self.records if record.writer_failure == "LedgerFencedError"
        )
        result.faults = dict(sorted(self.nemesis.faults.items()))


def run_seed(
    seed: int, *, trace: TraceRecorder | None = None, capture_trace: bool = True
) -> LedgerSeedResult:
    """Run one seed; on failure, run it again with tracing to capture the trace tail."""
    result = _run_once(seed, trace)
    if not result.ok and trace is None and capture_trace:
        recorder = TraceRecorder(lines_max=TRACE_TAIL_LINES)
        replay = _run_once(seed, recorder)
        result.trace_tail = recorder.tail(TRACE_TAIL_LINES)
        if replay.failure != result.failure:
            result.failure = (
                f"{result.failure}\n(NOT DETERMINISTIC: the traced replay ended with: "
                f"{replay.failure})"
            )
    if trace is not None:
        result.trace_digest = hashlib.sha256(trace.to_bytes()).hexdigest()
    return result


def _run_once(seed: int, trace: TraceRecorder | None) -> LedgerSeedResult:
    started = time.perf_counter()
    plan = plan_seed(seed)
    result = LedgerSeedResult(
        seed=seed, ok=True, shape=plan.shape, replay_command=replay_command(seed)
    )
    run: LedgerSeed | None = None
    try:
        run = LedgerSeed(seed, plan, trace)
        run.run()
    except Exception as error:  # any exception is a finding, reported with its seed
        result.ok = False
        result.failure = _describe_failure(error, run)
    if run is not None:
        run.fill(result)
    result.wall_seconds = time.perf_counter() - started
    return result


def _describe_failure(error: Exception, run: LedgerSeed | None) -> str:
    kind = "invariant violated" if isinstance(error, InvariantViolation) else "exception"
    where = "".join(traceback.format_exception(error)[-6:])
    state = ""
    if run is not None:
        state = f"\nworld at {run.world.now_ms} ms:\n{run.world.describe()}"
    return f"{kind}: {type(error).__name__}: {error}\n{where}{state}"


# --- many seeds -----------------------------------------------------------------------


class LedgerRunSummary(SeedRunSummary[LedgerSeedResult]):
    def world_figures(self) -> dict[str, object]:
        results = self.results
        return {
            "entries_acknowledged": sum(result.entries_acknowledged for result in results),
            "entries_read": sum(result.entries_read for result in results),
            "recoveries": sum(result.recoveries for result in results),
            "ensemble_changes": sum(result.ensemble_changes for result in results),
            "fenced_writers": sum(result.fenced_writers for result in results),
        }


def run_seeds(seeds: Sequence[int], jobs: int = 1) -> LedgerRunSummary:
    """Run every seed (in `jobs` processes); results come back in seed order."""
    started = time.perf_counter()
    return LedgerRunSummary.of(map_seeds(run_seed, seeds, jobs), started)


def format_failure(result: LedgerSeedResult) -> str:
    ensemble, write_quorum, ack_quorum = result.shape
    return format_seed_failure(result, f"E={ensemble} Qw={write_quorum} Qa={ack_quorum}")

"""Property tests: the ledger protocol under random failure schedules (hypothesis).

A writer streams entries while messages are delivered in any order, dropped or held;
bookies crash (requests vanish), refuse connections, pause, answer errors (a failed
disk) and come back; the metadata
store goes unavailable; up to two recoverers start at any moment, and a reader opens the
ledger without recovery. Then everything heals, a final recovery runs, and the invariants
of issue 11 are checked:

- every acknowledged entry survives recovery, with its bytes;
- no entry beyond the recovered LAC is readable, and every entry up to it is one the writer
  appended (with its bytes);
- a fenced writer never gets an ack beyond the recovered LAC;
- recoveries agree: every recovery (and a close) that finished reports the stored end;
- metadata versions never go back (each stored update is the previous version + 1);
- a reader that opened without recovery reads only acknowledged entries.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, example, given, settings

from quorumlog.errors import LedgerEntryRangeError, LedgerError
from quorumlog.ledger.metadata import LedgerState
from quorumlog.ledger.protocol_read import EntryRangeRead
from quorumlog.ledger.protocol_recovery import LedgerRecovery
from tests.unit.ledger.harness import BookieDouble, LedgerWorld

SHAPES = [(3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 2, 2), (5, 3, 2), (2, 2, 1), (4, 3, 1)]

OPERATION_WEIGHTS = {
    "deliver": 50.0,
    "deliver_many": 10.0,
    "append": 12.0,
    "tick": 6.0,
    "drop": 3.0,
    "crash": 1.0,
    "refuse": 0.5,
    "pause": 1.0,
    "sicken": 0.5,
    "heal": 3.0,
    "store_down": 0.5,
    "store_up": 3.0,
    "recover": 0.4,
    "read_lac": 0.5,
    "close": 0.2,
}
FAULTY_BOOKIES_MAX = 2
"""Delivery dominates, so entries flow; faults are rare, so the writer gets somewhere
between them; recoveries come at random points."""


def random_operation(random: random_module.Random) -> tuple[str, int]:
    kind = random.choices(list(OPERATION_WEIGHTS), weights=list(OPERATION_WEIGHTS.values()))[0]
    return kind, random.randrange(1000)


class Run:
    def __init__(
        self,
        shape: tuple[int, int, int],
        seed: int,
        bookie_factory: Callable[[str], BookieDouble] | None = None,
    ) -> None:
        self.world = LedgerWorld(bookie_count=8, seed=seed, bookie_factory=bookie_factory)
        if seed % 4 == 0:
            # Bookies that do not return the length: recovery starts at the fragment.
            for bookie in self.world.bookies.values():
                bookie.keeps_length = False
        self.metadata = self.world.create_ledger(*shape)
        self.ledger_id = self.metadata.ledger_id
        self.world.writer("writer", self.metadata)
        self.recoverers: list[str] = []
        self.readers: list[str] = []
        self.appended = 0

    def apply(self, operation: tuple[str, int]) -> None:
        world = self.world
        kind, argument = operation
        bookie_id = f"b{argument % len(world.bookies)}"
        if kind == "append":
            self.append(1 + argument % 12)
        elif kind == "deliver" and world.queue:
            index = argument % len(world.queue)
            if world.deliverable(index):
                world.deliver(index)
        elif kind == "deliver_many":
            for _ in range(1 + argument % 40):
                if not world.step():
                    break
        elif kind == "drop" and world.queue:
            world.drop(argument % len(world.queue))
        elif kind == "tick":
            for _ in range(1 + argument % 30):
                world.tick()
        elif kind in ("crash", "refuse", "pause", "sicken"):
            if len(self.faulty()) < FAULTY_BOOKIES_MAX:
                self.fault(kind, bookie_id)
        elif kind == "heal" and self.faulty():
            faulty = self.faulty()
            self.heal(faulty[argument % len(faulty)])
        elif kind == "store_down":
            world.store_unavailable = True
        elif kind == "store_up":
            world.store_unavailable = False
        elif kind == "recover" and len(self.recoverers) < 2:
            name = f"recoverer{len(self.recoverers)}"
            self.recoverers.append(name)
            world.recovery(name, self.ledger_id)
        elif kind == "read_lac" and not self.readers:
            self.readers.append("lac")
            world.last_add_confirmed_read("lac", self.ledger_id)
        elif kind == "close":
            writer = world.writer_of("writer")
            if writer.failure is None and not writer.close_requested:
                writer.close()
                world.collect("writer")

    def fault(self, kind: str, bookie_id: str) -> None:
        world = self.world
        if kind == "crash":
            world.down.add(bookie_id)  # requests vanish
        elif kind == "refuse":
            world.unreachable.add(bookie_id)  # connections fail at once
        elif kind == "pause":
            world.paused.add(bookie_id)  # requests wait
        else:
            world.bookies[bookie_id].sick = True  # answers ErrorResponse

    def heal(self, bookie_id: str) -> None:
        world = self.world
        world.down.discard(bookie_id)
        world.unreachable.discard(bookie_id)
        world.paused.discard(bookie_id)
        world.bookies[bookie_id].sick = False

    def faulty(self) -> list[str]:
        world = self.world
        sick = {bookie_id for bookie_id, bookie in world.bookies.items() if bookie.sick}
        return sorted(world.down | world.unreachable | world.paused | sick)

    def append(self, count: int) -> None:
        for _ in range(count):
            entry_id = self.appended
            try:
                self.world.append("writer", b"entry-%d-" % entry_id + bytes(entry_id % 7))
            except LedgerError:
                return
            self.appended += 1

    def heal_and_finish(self) -> None:
        world = self.world
        for bookie_id in world.bookies:
            self.heal(bookie_id)
        world.store_unavailable = False
        world.run()
        world.recovery("final", self.ledger_id)
        final = world.clients["final"]
        world.run(until=lambda: final.closed is not None or final.failure is not None)
        assert final.failure is None, final.failure
        # Let the old writer run on: it must not get an ack beyond the recovered end.
        world.run()

    def check(self) -> None:
        world = self.world
        stored = world.store.read_ledger(self.ledger_id)
        assert stored.state is LedgerState.CLOSED
        last = stored.last_entry_id
        written = world.entries_written[self.ledger_id]
        writer = world.clients["writer"]
        # A fenced writer (or any writer) never got an ack beyond the recovered end.
        assert writer.last_add_confirmed <= last, (writer.last_add_confirmed, last)
        # Recoveries (and a close) that finished agree with what is stored.
        for name in [*self.recoverers, "final", "writer"]:
            closed = world.clients[name].closed
            if closed is not None:
                assert closed.last_entry_id == last, (name, closed.last_entry_id, last)
        # Every acknowledged entry survives with its bytes; nothing recovered is invented.
        entries = world.read_all(self.ledger_id)
        assert [entry.entry_id for entry in entries] == list(range(last + 1))
        for entry in entries:
            assert written[entry.entry_id] == entry.data
        assert stored.length == sum(len(entry.data) for entry in entries)
        # Nothing beyond the recovered end is readable.
        with pytest.raises(LedgerEntryRangeError):
            EntryRangeRead(
                stored, last + 1, last + 1, last, world.config, request_ids=world.request_ids
            )
        # Metadata versions never go back.
        versions = [metadata.version for metadata in world.store.history[self.ledger_id]]
        assert versions == list(range(len(versions))), versions
        # A reader without recovery saw only acknowledged entries.
        for name in self.readers:
            seen = world.clients[name].last_add_confirmed
            assert seen <= last


EXAMPLES = 150
"""Bounded for the everyday run (a few seconds); `pytest -m soak` runs SOAK_EXAMPLES."""
SOAK_EXAMPLES = 20_000


@given(
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(50, 400),
)
# Found by the soak: two recoveries disagreed (one re-wrote entries 41..45 it found on a
# bookie the other never heard), the other closed at 40, and the loser's re-writes had
# carried LAC 45 to the bookies: a reader without recovery then read beyond the end.
@example(shape=(3, 3, 2), seed=23711786, steps=276)
def check_random_failure_schedule(shape: tuple[int, int, int], seed: int, steps: int) -> None:
    run_random_failure_schedule(shape, seed, steps)


def run_random_failure_schedule(
    shape: tuple[int, int, int],
    seed: int,
    steps: int,
    bookie_factory: Callable[[str], BookieDouble] | None = None,
) -> None:
    # The schedule comes from a seeded Random, not from hypothesis' own draws: those lean
    # towards the simplest values (always the first kind, index 0), which makes dull runs.
    random = random_module.Random(seed)
    run = Run(shape, seed, bookie_factory)
    for _ in range(steps):
        run.apply(random_operation(random))
    run.heal_and_finish()
    run.check()
    report_coverage(run)


def test_invariants_hold_under_random_failure_schedules() -> None:
    settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(check_random_failure_schedule)()


@pytest.mark.soak
def test_soak_invariants_under_many_schedules(request: pytest.FixtureRequest) -> None:
    if "soak" not in str(request.config.getoption("markexpr")).replace("not soak", ""):
        pytest.skip("a long run: select it with -m soak")
    settings(
        max_examples=SOAK_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(check_random_failure_schedule)()


def report_coverage(run: Run) -> None:
    """Label the run (see --hypothesis-show-statistics), to see what the schedules reach."""
    stored = run.world.store.read_ledger(run.ledger_id)
    writer = run.world.clients["writer"]
    acknowledged = writer.last_add_confirmed + 1
    event(f"fragments: {min(len(stored.ensembles), 3)}")
    event(f"acknowledged before recovery: {min(acknowledged, 20) // 10 * 10}+")
    event(f"recovered beyond acknowledged: {stored.last_entry_id + 1 > acknowledged}")
    event(f"writer failure: {type(writer.failure).__name__}")
    writer_fragments = set(run.world.writer_of("writer").metadata.ensembles)
    event(f"fragments added by recovery: {bool(set(stored.ensembles) - writer_fragments)}")
    restarts = [
        core.restarts
        for core in (run.world.clients[name].core for name in [*run.recoverers, "final"])
        if isinstance(core, LedgerRecovery)
    ]
    event(f"recovery restarted: {any(restarts)}")

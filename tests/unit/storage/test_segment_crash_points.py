"""SegmentLogStore on the simulated disk, crashed at every point of a scripted run.

The script appends, syncs, rolls segments, truncates both ends and resets. It is run once to
count the disk changes it makes (writes, truncates, syncs, name changes); then, for every
count k, it is run again on a fresh disk whose process halts just before change k + 1, the
disk suffers a crash, and the store is reopened. What open finds must be allowed by the
store's contract for the step that was running (see `windows_of_step`):

- the first index is the old or the new one of that step;
- the entries are a prefix of the log as written, running at least through everything
  that was durable (synced, or made durable by a truncation that returned);
- nothing truncated by a truncation that returned comes back.

Crash faults alone never damage the middle of the log, so open must never raise
CorruptLogError here; damage in the middle (bit flips) is in test_sim_disk_faults.

Then, for every crash point, the store must stay usable (append, sync, reopen), and what
open found must be durable: a power loss right after open loses none of it (defect 5).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from quorumlog.storage import LogEntry, SegmentLogStore
from quorumlog.testing.sim.filesystem import SimFileSystem, SimulatedCrash

LOG = Path("/node/log")
SEGMENT_BYTES = 300
"""About four 64-byte entries: the script rolls several segments."""
POWER_LOSS_SEEDS = 3


def make_entries(first: int, count: int, term: int) -> list[LogEntry]:
    return [
        LogEntry(index=i, term=term, data=bytes([1 + (i * 13 + term) % 250]) * 40)
        for i in range(first, first + count)
    ]


@dataclass(frozen=True)
class LogState:
    """What the log holds as written, and how much of it must survive any crash."""

    first_index: int
    entries: tuple[LogEntry, ...] = ()
    durable_last: int = 0
    """Every entry up to here is durable."""

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.entries) - 1


@dataclass(frozen=True)
class Window:
    """One allowed outcome: this first index, and a prefix of `reference` ending in
    [last_min, last_max]."""

    first_index: int
    reference: tuple[LogEntry, ...]
    last_min: int
    last_max: int

    def allows(self, first_index: int, entries: list[LogEntry]) -> bool:
        last = first_index + len(entries) - 1
        if first_index != self.first_index or not self.last_min <= last <= self.last_max:
            return False
        return tuple(entries) == self.reference[: len(entries)]


def whole(state: LogState) -> Window:
    return Window(
        state.first_index,
        state.entries,
        max(state.durable_last, state.first_index - 1),
        state.last_index,
    )


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[SegmentLogStore], None]
    after: Callable[[LogState], LogState]
    windows: Callable[[LogState, LogState], list[Window]]
    """Outcomes allowed for a crash inside the step, from the states before and after."""


def append(first: int, count: int, term: int) -> Step:
    batch = make_entries(first, count, term)

    def after(state: LogState) -> LogState:
        return LogState(state.first_index, state.entries + tuple(batch), state.durable_last)

    def windows(before: LogState, later: LogState) -> list[Window]:
        return [Window(before.first_index, later.entries, before.durable_last, later.last_index)]

    return Step(f"append {first}..{first + count - 1}", lambda s: s.append(batch), after, windows)


def sync() -> Step:
    def after(state: LogState) -> LogState:
        return LogState(state.first_index, state.entries, state.last_index)

    return Step("sync", lambda s: s.sync(), after, lambda before, _: [whole(before)])


def truncate_suffix(last_kept: int) -> Step:
    def after(state: LogState) -> LogState:
        kept = state.entries[: last_kept - state.first_index + 1]
        return LogState(state.first_index, kept, min(state.durable_last, last_kept))

    def windows(before: LogState, _: LogState) -> list[Window]:
        # Segments go from the back: any prefix of the old log that keeps the durable part
        # up to last_kept.
        lowest = max(min(before.durable_last, last_kept), before.first_index - 1)
        return [Window(before.first_index, before.entries, lowest, before.last_index)]

    return Step(
        f"truncate_suffix({last_kept})", lambda s: s.truncate_suffix(last_kept), after, windows
    )


def truncate_prefix(first_kept: int) -> Step:
    def after(state: LogState) -> LogState:
        kept = state.entries[first_kept - state.first_index :]
        return LogState(first_kept, kept, max(state.durable_last, first_kept - 1))

    def windows(before: LogState, later: LogState) -> list[Window]:
        return [whole(before), Window(later.first_index, later.entries, later.durable_last,
                                      later.last_index)]  # fmt: skip

    return Step(
        f"truncate_prefix({first_kept})", lambda s: s.truncate_prefix(first_kept), after, windows
    )


def reset(next_index: int) -> Step:
    def after(_: LogState) -> LogState:
        return LogState(next_index, (), next_index - 1)

    def windows(before: LogState, later: LogState) -> list[Window]:
        return [whole(before), whole(later)]

    return Step(f"reset({next_index})", lambda s: s.reset(next_index), after, windows)


SCRIPT = [
    append(1, 3, term=1),
    sync(),
    append(4, 6, term=1),  # rolls the open segment
    append(10, 5, term=1),
    sync(),
    append(15, 3, term=1),  # unsynced when the truncation comes
    truncate_suffix(12),  # unlinks whole segments, renames a closed one back to open
    append(13, 8, term=2),
    sync(),
    append(21, 3, term=2),  # unsynced when the prefix goes
    truncate_prefix(8),
    append(24, 4, term=2),
    truncate_prefix(25),  # past the durable part (through 20): the meta must not outrun it
    truncate_suffix(26),
    sync(),
    reset(40),
    append(40, 6, term=3),
    sync(),
    append(46, 2, term=3),
]


def open_store(disk: SimFileSystem) -> SegmentLogStore:
    return SegmentLogStore.open(LOG, segment_bytes_max=SEGMENT_BYTES, file_system=disk)


@dataclass
class Outcome:
    """Where a halted run stopped and what it allows."""

    step_index: int
    windows: list[Window] = field(default_factory=list)
    script: list[Step] = field(default_factory=list)


def run_script(disk: SimFileSystem, halt_after: int | None, script: list[Step] = SCRIPT) -> Outcome:
    """Run `script` until the disk halts the process; return the outcomes it allows."""
    state = LogState(first_index=1)
    disk.halt_after(halt_after)
    try:
        store = open_store(disk)
    except SimulatedCrash:
        return Outcome(-1, [whole(state)], script)
    for number, step in enumerate(script):
        later = step.after(state)
        try:
            step.run(store)
        except SimulatedCrash:
            return Outcome(number, [*step.windows(state, later), whole(state)], script)
        state = later
    disk.halt_after(None)
    return Outcome(len(script), [whole(state)], script)


def operations_of_script(script: list[Step] = SCRIPT) -> int:
    disk = SimFileSystem(random.Random(0))
    run_script(disk, None, script)
    return disk.operation_count


def read_log(store: SegmentLogStore) -> tuple[int, list[LogEntry]]:
    return store.first_index, store.entries(store.first_index, store.last_index + 1)


def check_outcome(
    store: SegmentLogStore, outcome: Outcome, where: str
) -> tuple[int, list[LogEntry]]:
    first_index, entries = read_log(store)
    allowed = any(window.allows(first_index, entries) for window in outcome.windows)
    step, script = outcome.step_index, outcome.script
    step_name = script[step].name if 0 <= step < len(script) else ("open" if step < 0 else "end")
    assert allowed, (
        f"{where}: in step {step} ({step_name}) "
        f"open found first_index={first_index}, last_index={first_index + len(entries) - 1}; "
        f"allowed: {[(w.first_index, w.last_min, w.last_max) for w in outcome.windows]}"
    )
    return first_index, entries


def check_durable_and_usable(disk: SimFileSystem, store: SegmentLogStore, where: str) -> None:
    """A power loss right after open keeps all it found; then it takes an append."""
    found = read_log(store)
    disk.crash(random.Random(0), keep_unsynced=False)
    store = open_store(disk)
    assert read_log(store) == found, f"{where}: a power loss after open lost what open found"
    last = store.last_index
    extra = make_entries(last + 1, 2, term=99)
    store.append(extra)
    store.sync()
    disk.process_crash()
    store = open_store(disk)
    assert store.entries(last + 1, last + 3) == extra, where
    store.close()


CRASH_KINDS = ["power-loss", "power-loss-keeping-nothing-unsynced", "process-only"]


@pytest.mark.parametrize("crash_kind", CRASH_KINDS)
def test_every_crash_point_of_the_script_reopens_to_an_allowed_log(crash_kind: str) -> None:
    total = operations_of_script()
    assert total > 60  # the script really rolls, truncates and resets
    seeds = range(POWER_LOSS_SEEDS) if crash_kind == "power-loss" else range(1)
    for halt_after in range(total + 1):
        for seed in seeds:
            where = f"halt after {halt_after} of {total} changes, {crash_kind}, seed {seed}"
            disk = SimFileSystem(random.Random(seed))
            outcome = run_script(disk, halt_after)
            if crash_kind == "process-only":
                disk.process_crash()
            else:
                disk.crash(
                    random.Random(halt_after * 1000 + seed),
                    keep_unsynced=crash_kind == "power-loss",
                )
            store = open_store(disk)
            check_outcome(store, outcome, where)
            check_durable_and_usable(disk, store, where)


def test_a_crash_during_recovery_is_recovered_from_too() -> None:
    """Halt the process inside open itself (cutting a torn tail, finishing a reset, ...),
    crash again, and open once more: still an allowed log."""
    total = operations_of_script()
    for halt_after in range(0, total + 1, 3):
        disk = SimFileSystem(random.Random(halt_after))
        outcome = run_script(disk, halt_after)
        disk.crash(random.Random(halt_after))
        before_open = disk.operation_count
        open_store(disk).close()
        changes_of_open = disk.operation_count - before_open
        for inner in range(changes_of_open):
            attempt = SimFileSystem(random.Random(halt_after))
            run_script(attempt, halt_after)
            attempt.crash(random.Random(halt_after))
            attempt.halt_after(inner)
            with pytest.raises(SimulatedCrash):
                open_store(attempt)
            attempt.crash(random.Random(inner))
            store = open_store(attempt)
            check_outcome(store, outcome, f"halt after {halt_after}, then in open after {inner}")
            store.close()


# --- random scripts ------------------------------------------------------------------------


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "sync", "suffix", "prefix", "reset"]),
        st.integers(0, 1000),
    ),
    min_size=1,
    max_size=14,
)


def build_script(operations: list[tuple[str, int]]) -> list[Step]:
    """Steps with arguments that fit the log as it will be when each runs."""
    state = LogState(first_index=1)
    script: list[Step] = []
    term = 1
    for kind, number in operations:
        if kind == "append":
            if number % 4 == 0:
                term += 1
            step = append(state.last_index + 1, 1 + number % 9, term)
        elif kind == "sync":
            step = sync()
        elif kind == "suffix" and state.entries:
            step = truncate_suffix(state.first_index - 1 + number % (len(state.entries) + 1))
        elif kind == "prefix" and state.entries:
            step = truncate_prefix(state.first_index + 1 + number % len(state.entries))
        elif kind == "reset":
            step = reset(state.last_index + 1 + number % 5)
        else:
            continue
        script.append(step)
        state = step.after(state)
    return script


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS, halt_fraction=st.floats(0, 1), seed=st.integers(0, 2**32))
def test_random_scripts_crashed_at_a_random_point_reopen_to_an_allowed_log(
    operations: list[tuple[str, int]], halt_fraction: float, seed: int
) -> None:
    script = build_script(operations)
    total = operations_of_script(script)
    halt_after = round(halt_fraction * total)
    disk = SimFileSystem(random.Random(seed))
    outcome = run_script(disk, halt_after, script)
    disk.crash(random.Random(seed))
    store = open_store(disk)
    check_outcome(store, outcome, f"halt after {halt_after} of {total}, seed {seed}")
    check_durable_and_usable(disk, store, f"halt after {halt_after} of {total}, seed {seed}")

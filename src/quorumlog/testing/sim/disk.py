"""A seeded disk for one simulated node: the log store, hard state and snapshot stores that
`RaftHost` is given, with what a crash keeps following what a real disk promises:

- entries through `synced_index` survive; of the entries appended since the last sync, a
  seeded prefix may survive too (the tail of the write reached the platter, the rest was
  torn off), never a later entry without the earlier ones;
- the hard state is saved (atomically) only by the host's sync job, so a crash keeps the
  last one saved: an unsaved hard state is lost whole;
- truncations, snapshot saves and log resets are durable when they return, as the store
  contract says (they go through a rename and a directory sync).

Each persistence step is a separate call, so a crash can fall between any two of them (for
example between saving an installed snapshot and resetting the log).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import msgspec

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.storage.base import RecoveryReport
from quorumlog.storage.entry import LogEntry
from quorumlog.storage.memory import MemoryLogStore
from quorumlog.testing.sim.checks import require


class SavedSnapshot(msgspec.Struct, frozen=True):
    meta: SnapshotMeta
    data: bytes


class CrashReport(msgspec.Struct, frozen=True):
    entries_lost: int
    entries_torn_kept: int
    hard_state_reverted: bool


class SimLogStore:
    """A `LogStore` in memory that knows which entries are durable."""

    def __init__(self) -> None:
        self.memory = MemoryLogStore()
        self.synced_index = 0
        """Entries at or below this index are durable."""
        self.sync_count = 0

    @property
    def first_index(self) -> int:
        return self.memory.first_index

    @property
    def last_index(self) -> int:
        return self.memory.last_index

    @property
    def recovery(self) -> RecoveryReport:
        return self.memory.recovery

    def append(self, entries: Sequence[LogEntry]) -> None:
        self.memory.append(entries)

    def sync(self) -> None:
        self.synced_index = self.memory.last_index
        self.sync_count += 1

    def entry(self, index: int) -> LogEntry:
        return self.memory.entry(index)

    def entries(self, low: int, high: int) -> list[LogEntry]:
        return self.memory.entries(low, high)

    def iter_entries(self, low: int, high: int) -> Iterator[LogEntry]:
        return self.memory.iter_entries(low, high)

    def term(self, index: int) -> int:
        return self.memory.term(index)

    def truncate_suffix(self, last_kept: int) -> None:
        self.memory.truncate_suffix(last_kept)
        self.synced_index = min(self.synced_index, self.memory.last_index)

    def truncate_prefix(self, first_kept: int) -> None:
        self.memory.truncate_prefix(first_kept)

    def reset(self, next_index: int) -> None:
        self.memory.reset(next_index)
        self.synced_index = next_index - 1

    def close(self) -> None:
        pass

    def lose_unsynced(self, rng: random.Random, torn_tail_probability: float) -> tuple[int, int]:
        """A crash: keep a seeded prefix of the unsynced entries; (lost, kept)."""
        unsynced = self.memory.last_index - self.synced_index
        kept = 0
        if unsynced > 0 and rng.random() < torn_tail_probability:
            kept = rng.randint(0, unsynced)
        if unsynced > kept:
            self.memory.truncate_suffix(self.synced_index + kept)
        self.synced_index = self.memory.last_index
        return unsynced - kept, kept


class SimHardStateStore:
    def __init__(self) -> None:
        self.saved = HardState()

    def needs_save(self, state: HardState) -> bool:
        # The same rule as the real file: term and vote must be durable; commit rides along.
        return (state.term, state.vote) != (self.saved.term, self.saved.vote)

    def save(self, state: HardState) -> None:
        self.saved = state


class SimSnapshotStore:
    def __init__(self) -> None:
        self.snapshot: SavedSnapshot | None = None

    def latest(self) -> SavedSnapshot | None:
        return self.snapshot

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        require(
            self.snapshot is None or meta.index >= self.snapshot.meta.index,
            f"snapshot at {meta.index} would replace a newer one",
        )
        self.snapshot = SavedSnapshot(meta, data)


class SimDisk:
    """The durable side of one node, as the host's three stores."""

    def __init__(self) -> None:
        self.store = SimLogStore()
        self.hard_state = SimHardStateStore()
        self.snapshots = SimSnapshotStore()

    @property
    def durable_hard_state(self) -> HardState:
        return self.hard_state.saved

    @property
    def snapshot(self) -> SavedSnapshot | None:
        return self.snapshots.snapshot

    @property
    def synced_index(self) -> int:
        return self.store.synced_index

    @property
    def sync_count(self) -> int:
        return self.store.sync_count

    def crash(self, rng: random.Random, torn_tail_probability: float) -> CrashReport:
        """Lose every unsynced write, keeping a seeded prefix of the unsynced entries."""
        lost, kept = self.store.lose_unsynced(rng, torn_tail_probability)
        return CrashReport(lost, kept, hard_state_reverted=False)

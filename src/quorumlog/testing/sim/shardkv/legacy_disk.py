"""TEMPORARY: the entry-level disk of the shard simulator's own Ready loop (member.py), kept only
until that member runs on `RaftHost` like the Raft simulator's node; then this file goes.


What a crash keeps follows what a real disk promises:

- entries through `synced_index` survive; of the entries appended since the last sync, a
  seeded prefix may survive too (the tail of the write reached the platter, the rest was
  torn off), never a later entry without the earlier ones;
- the hard state is written to its own small file, so it is either the last synced one or
  (if it was not synced) that one again: an unsynced hard state is lost whole;
- truncations, snapshot saves and log resets are durable when they return, as the store
  contract says (they go through a rename and a directory sync).
"""

from __future__ import annotations

import random

import msgspec

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.storage.entry import LogEntry
from quorumlog.storage.memory import MemoryLogStore
from quorumlog.testing.sim.checks import SimulationError, require


class SavedSnapshot(msgspec.Struct, frozen=True):
    meta: SnapshotMeta
    data: bytes


class CrashReport(msgspec.Struct, frozen=True):
    entries_lost: int
    entries_torn_kept: int
    hard_state_reverted: bool


class SimDisk:
    """The durable side of one node. The node's RaftCore reads `store` directly."""

    def __init__(self) -> None:
        self.store = MemoryLogStore()
        self.synced_index = 0
        """Entries at or below this index are durable."""
        self.hard_state = HardState()
        self.durable_hard_state = HardState()
        self.snapshot: SavedSnapshot | None = None
        self.sync_count = 0

    # --- writes ----------------------------------------------------------------------

    def append(self, entries: list[LogEntry]) -> None:
        self.store.append(entries)

    def set_hard_state(self, hard_state: HardState) -> None:
        self.hard_state = hard_state

    def truncate_suffix(self, last_kept: int) -> None:
        self.store.truncate_suffix(last_kept)
        self.synced_index = min(self.synced_index, self.store.last_index)

    def sync(self) -> None:
        self.synced_index = self.store.last_index
        self.durable_hard_state = self.hard_state
        self.sync_count += 1

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Write a snapshot the node took of its own state machine (atomically)."""
        require(
            self.snapshot is None or meta.index >= self.snapshot.meta.index,
            f"snapshot at {meta.index} would replace a newer one",
        )
        self.snapshot = SavedSnapshot(meta, data)

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Replace the whole log by a snapshot from the leader: empty from meta.index + 1."""
        self.snapshot = SavedSnapshot(meta, data)
        self.store.reset(meta.index + 1)
        self.synced_index = meta.index

    def compact(self, first_kept: int) -> None:
        """Drop entries before `first_kept`; they are covered by the saved snapshot."""
        snapshot = self.snapshot
        if snapshot is None:
            raise SimulationError("compacting a log with no snapshot")
        require(
            first_kept <= snapshot.meta.index + 1,
            f"compacting to {first_kept}, past the snapshot at {snapshot.meta.index}",
        )
        first_kept = min(first_kept, self.store.last_index + 1)
        if first_kept > self.store.first_index:
            self.store.truncate_prefix(first_kept)

    # --- crash -----------------------------------------------------------------------

    def crash(self, rng: random.Random, torn_tail_probability: float) -> CrashReport:
        """Lose every unsynced write, keeping a seeded prefix of the unsynced entries."""
        unsynced = self.store.last_index - self.synced_index
        kept = 0
        if unsynced > 0 and rng.random() < torn_tail_probability:
            kept = rng.randint(0, unsynced)
        if unsynced > kept:
            self.store.truncate_suffix(self.synced_index + kept)
        self.synced_index = self.store.last_index
        reverted = self.hard_state != self.durable_hard_state
        self.hard_state = self.durable_hard_state
        return CrashReport(unsynced - kept, kept, reverted)

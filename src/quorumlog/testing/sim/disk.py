"""One simulated node's disk: the stores that ship, on a byte-level simulated file system.

`RaftHost` gets the real `SegmentLogStore`, `HardStateFile` and `SnapshotStore`, each on
the node's `SimFileSystem` (testing/sim/filesystem.py). So what a crash does is what a
power loss does to those files: every write not yet fsynced may be lost or torn at any
byte, directory entries not yet fsynced may vanish or come back, and the stores' own
recovery (torn tails, atomic replaces, the meta file) decides what the node restarts with.

- `crash(rng, torn_tail_probability)`: power loss, then the restarted process opens the
  stores again (open is where the stores repair and make durable what they find). With
  probability `torn_tail_probability` a seeded part of the unsynced writes survives (torn),
  else none does.
- `halt_after(operations)`: the process dies at its next disk change after that many, in
  the middle of whatever it was doing (between saving a snapshot and resetting the log, in
  the middle of a segment roll, ...). The change raises `SimulatedCrash` (a BaseException,
  so no handler in the code under test can swallow it); `SimProcess` turns it into a crash.
- `snapshot_halt_probability`: after a snapshot is saved, the chance that the disk halts
  the process within the next few changes — between an installed snapshot's save and the
  log's reset, or a taken snapshot's save and the compaction: the crash points where the
  log and the snapshot must be reconciled at open.
- `read_bit_flip_probability` and `bytes_max` pass through to the file system: reads that
  flip a bit (the stores must detect it) and a disk that fills up.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import msgspec

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.runtime.stable import HardStateFile, SnapshotFile, SnapshotStore
from quorumlog.storage.segment import SegmentLogStore
from quorumlog.testing.sim.filesystem import DiskCrashReport, SimFileSystem

SNAPSHOT_HALT_CHANGES_MAX = 8
"""How many disk changes after a snapshot save an armed halt may fall."""
DIVERGENT_INSTALL_HALT_PROBABILITY = 0.5
SEGMENT_BYTES_MAX = 16 * 1024
"""Small segments, so that rolling from one to the next happens in every run."""
ROOT = Path("/node")


class CrashReport(msgspec.Struct, frozen=True):
    entries_lost: int
    """Log entries the crash took (unsynced, or torn beyond repair)."""
    disk: DiskCrashReport


class TruthfulReads:
    """A `with` block in which the file system flips no bits (a plain class: the checker
    enters one after every event, and a generator-based context manager costs more)."""

    __slots__ = ("depth", "file_system", "flips")

    def __init__(self, file_system: SimFileSystem) -> None:
        self.file_system = file_system
        self.flips = 0.0
        self.depth = 0

    def __enter__(self) -> None:
        if self.depth == 0:
            self.flips = self.file_system.read_bit_flip_probability
            self.file_system.read_bit_flip_probability = 0.0
        self.depth += 1

    def __exit__(self, *exception: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.file_system.read_bit_flip_probability = self.flips


class CachedSnapshots:
    """The snapshot store, with its newest snapshot kept in memory (the checker asks for
    it often; reading it from the file each time would cost a decode per question)."""

    def __init__(self, store: SnapshotStore, after_save: Callable[[SnapshotMeta], None]) -> None:
        self.store = store
        self.after_save = after_save
        self.newest = store.latest()

    def latest(self) -> SnapshotFile | None:
        return self.newest

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        self.store.save(meta, data)
        if self.newest is None or meta.index >= self.newest.meta.index:
            self.newest = SnapshotFile(meta, data)
        self.after_save(meta)


class SimDisk:
    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        read_bit_flip_probability: float = 0.0,
        bytes_max: int | None = None,
    ) -> None:
        self.rng = rng if rng is not None else random.Random(0)
        self.file_system = SimFileSystem(
            self.rng, read_bit_flip_probability=read_bit_flip_probability, bytes_max=bytes_max
        )
        self.snapshot_halt_probability = 0.0
        self.snapshot_halts = 0
        self.truthful_reads = TruthfulReads(self.file_system)
        self.store: SegmentLogStore
        self.hard_state: HardStateFile
        self.snapshots: CachedSnapshots
        self.open_stores()

    def open_stores(self) -> None:
        """What a (re)started process does first: open its stores, recovering them."""
        file_system = self.file_system
        self.store = SegmentLogStore.open(
            ROOT / "log", segment_bytes_max=SEGMENT_BYTES_MAX, file_system=file_system
        )
        self.hard_state = HardStateFile(ROOT, file_system)
        self.snapshots = CachedSnapshots(
            SnapshotStore(ROOT / "snapshots", 2, file_system), self.maybe_halt_soon
        )

    def maybe_halt_soon(self, meta: SnapshotMeta) -> None:
        probability = self.snapshot_halt_probability
        if probability and self.log_diverges_at(meta):
            # Installing over a log that holds another entry at the snapshot's index: the
            # rare shape in which a crash before the reset leaves a log that does not follow
            # the snapshot. Make it likely whenever it arises.
            probability = max(probability, DIVERGENT_INSTALL_HALT_PROBABILITY)
        if probability and self.rng.random() < probability:
            self.snapshot_halts += 1
            # Half the time at the very next change: right after an installed snapshot's
            # save, that is the log's reset, the gap that must be reconciled at open.
            changes = (
                0 if self.rng.random() < 0.5 else self.rng.randint(1, SNAPSHOT_HALT_CHANGES_MAX)
            )
            self.file_system.halt_after(changes)

    def log_diverges_at(self, meta: SnapshotMeta) -> bool:
        store = self.store
        return (
            store.first_index <= meta.index <= store.last_index
            and store.term(meta.index) != meta.term
        )

    @property
    def durable_hard_state(self) -> HardState:
        return self.hard_state.saved

    @property
    def snapshot(self) -> SnapshotFile | None:
        return self.snapshots.latest()

    def crash(self, rng: random.Random, torn_tail_probability: float) -> CrashReport:
        """Power loss, then the stores opened again as a restarted process would."""
        last_before = self.store.last_index
        report = self.file_system.crash(rng, keep_unsynced=rng.random() < torn_tail_probability)
        # Reopened with reads that never flip: a flip at open would stop the restart itself
        # (the stores' open under flips is tested on its own, storage tests); flips are
        # for the running node, whose group must stop on one.
        with self.reading_truthfully():
            self.open_stores()
        return CrashReport(max(0, last_before - self.store.last_index), report)

    def reading_truthfully(self) -> TruthfulReads:
        """Reads without bit flips inside the block: for the checker, which observes the
        system under test and must not be misled (or stopped) by the faults it injects."""
        return self.truthful_reads

    def halt_after(self, operations: int | None) -> None:
        self.file_system.halt_after(operations)

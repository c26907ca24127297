"""HardStateFile and SnapshotStore on the simulated disk, crashed at every disk change.

Both replace small files atomically, so after a crash inside a save the file read back is
the old version or the new one, never a mix, never damage; after a save returned, it is the
new one. Each run is repeated with the process halted before each of its changes, then a
power loss (seeded, or keeping nothing unsynced) or a process crash.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from quorumlog.errors import DiskFullError
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.runtime.stable import HardStateFile, SnapshotStore
from quorumlog.testing.sim.filesystem import SimFileSystem, SimulatedCrash

DATA = Path("/node/group")
SNAPSHOTS = DATA / "snapshots"
CRASHES = ["power-loss-0", "power-loss-1", "power-loss-keeping-nothing-unsynced", "process"]

Saved = TypeVar("Saved")


def crash(disk: SimFileSystem, kind: str, seed: int) -> None:
    if kind == "process":
        disk.process_crash()
    else:
        disk.crash(random.Random(seed), keep_unsynced=kind != "power-loss-keeping-nothing-unsynced")


def sweep_crash_points(
    versions: list[Saved],
    save: Callable[[SimFileSystem, Saved], None],
    load: Callable[[SimFileSystem], Saved],
    initial: Saved,
) -> None:
    """Save `versions` in turn with a crash before every disk change; after each, the
    version read back must be the one being saved or the one before it."""
    counting = SimFileSystem(random.Random(0))
    for version in versions:
        save(counting, version)
    total = counting.operation_count
    for halt_after in range(total + 1):
        for kind in CRASHES:
            disk = SimFileSystem(random.Random(halt_after))
            disk.halt_after(halt_after)
            previous = initial
            allowed = [initial]
            try:
                for version in versions:
                    allowed = [previous, version]
                    save(disk, version)
                    previous = version
                allowed = [previous]
            except SimulatedCrash:
                pass
            crash(disk, kind, seed=halt_after * 10 + CRASHES.index(kind))
            found = load(disk)
            assert found in allowed, f"halt after {halt_after} of {total}, {kind}: {found}"


def hard_states() -> list[HardState]:
    return [
        HardState(term=1, vote="a", commit=0),
        HardState(term=2, vote=None, commit=3),
        HardState(term=2, vote="b", commit=3),
        HardState(term=7, vote="c" * 200, commit=40),  # a longer file than the one before
        HardState(term=8, vote=None, commit=41),
    ]


def test_hard_state_after_a_crash_is_the_old_or_the_new_one() -> None:
    def save(disk: SimFileSystem, state: HardState) -> None:
        HardStateFile(DATA, disk).save(state)

    def load(disk: SimFileSystem) -> HardState:
        return HardStateFile(DATA, disk).saved

    sweep_crash_points(hard_states(), save, load, initial=HardState())


def snapshot_meta(index: int) -> SnapshotMeta:
    return SnapshotMeta(index=index, term=1 + index // 10, configuration=Configuration(("a",)))


def test_snapshot_after_a_crash_is_the_old_or_the_new_one() -> None:
    versions = [(snapshot_meta(index), bytes([index]) * (50 + index)) for index in (5, 12, 30, 31)]

    def save(disk: SimFileSystem, version: tuple[SnapshotMeta, bytes]) -> None:
        SnapshotStore(SNAPSHOTS, keep=2, file_system=disk).save(*version)

    def load(disk: SimFileSystem) -> tuple[SnapshotMeta, bytes] | None:
        store = SnapshotStore(SNAPSHOTS, keep=2, file_system=disk)
        latest = store.latest()
        assert not any(name.endswith(".tmp") for name in disk.list_directory(SNAPSHOTS))
        assert len(store.paths()) <= 3  # an unlink of an old one may come back, no more
        return None if latest is None else (latest.meta, latest.data)

    sweep_crash_points(versions, save, load, initial=None)


def test_a_full_disk_keeps_the_saved_hard_state() -> None:
    disk = SimFileSystem(random.Random(0))
    hard_state_file = HardStateFile(DATA, disk)
    hard_state_file.save(HardState(term=3, vote="a", commit=1))
    disk.bytes_max = disk.bytes_used
    with pytest.raises(DiskFullError):
        hard_state_file.save(HardState(term=4, vote="b", commit=1))
    disk.crash(random.Random(0))
    assert HardStateFile(DATA, disk).saved == HardState(term=3, vote="a", commit=1)
    disk.bytes_max = None
    HardStateFile(DATA, disk).save(HardState(term=4, vote="b", commit=1))
    assert HardStateFile(DATA, disk).saved.term == 4

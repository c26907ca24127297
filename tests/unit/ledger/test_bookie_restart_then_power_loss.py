"""A bookie killed (the OS lives on), restarted, and later losing power must open again.

Found by the ledger simulator (seeds 519, 532, 1080 of `quorumlog sim ledger` on 72337e4;
tests/sim/KNOWN_CORE_BUGS.md, "bookie-1"): open replayed the newest log file with writes
that were never synced (a kill keeps them readable) and started a new file after it, so
that file was no longer the newest; a later power loss tore those unsynced bytes, and open
refused the older file as corrupt ("record header cut short") for good. Open now makes the
newest file it found durable before it starts the next one.
"""

from __future__ import annotations

import random
from pathlib import Path

from quorumlog.errors import DiskFullError
from quorumlog.ledger.bookie_storage import BookieStorage
from quorumlog.testing.sim.filesystem import SimFileSystem

DIRECTORY = Path("/bookie")
SEEDS = 40


def sync(storage: BookieStorage) -> None:
    job = storage.begin_sync()
    if job is not None:
        job.run()
        storage.finish_sync(job, None)


def stored(storage: BookieStorage) -> dict[int, bytes]:
    return {entry.entry_id: entry.data for entry in storage.read_entries(1, 0, 100, 10**6, 100)}


def synced_then_unsynced(disk: SimFileSystem) -> BookieStorage:
    storage = BookieStorage.open(DIRECTORY, file_system=disk)
    storage.add_entries(1, b"key", -1, [0, 1, 2], [b"zero", b"one", b"two"])
    sync(storage)
    storage.add_entries(1, b"key", 2, [3, 4], [b"three" * 20, b"four" * 20])
    return storage


def kill_restart_power_loss(disk: SimFileSystem, seed: int) -> BookieStorage:
    disk.process_crash()  # killed: every unsynced byte is still readable
    BookieStorage.open(DIRECTORY, file_system=disk)  # restarted (a new log file)
    disk.crash(random.Random(seed), keep_unsynced=True)  # later, the power goes
    return BookieStorage.open(DIRECTORY, file_system=disk)


def test_unsynced_adds_replayed_after_a_kill_survive_a_later_power_loss() -> None:
    for seed in range(SEEDS):
        disk = SimFileSystem(random.Random(seed))
        synced_then_unsynced(disk)
        reopened = kill_restart_power_loss(disk, seed)
        found = stored(reopened)
        assert {entry_id: found[entry_id] for entry_id in (0, 1, 2)} == {
            0: b"zero",
            1: b"one",
            2: b"two",
        }, seed


def test_a_write_cut_back_after_a_full_disk_survives_a_kill_and_a_power_loss() -> None:
    for seed in range(SEEDS):
        disk = SimFileSystem(random.Random(seed))
        storage = synced_then_unsynced(disk)
        sync(storage)
        disk.bytes_max = disk.bytes_used + 10  # the next add is written in part, then cut
        try:
            storage.add_entries(1, b"key", 4, [5], [b"five" * 50])
        except DiskFullError:
            pass
        else:
            raise AssertionError("the add should not fit")
        disk.bytes_max = None
        reopened = kill_restart_power_loss(disk, seed)
        assert sorted(stored(reopened)) == [0, 1, 2, 3, 4], seed

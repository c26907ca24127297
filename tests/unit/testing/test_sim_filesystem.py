"""The simulated disk keeps the durability contract of storage/filesystem.py, and no more."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorumlog.errors import DirectoryInUseError, DiskFullError, StorageError
from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.filesystem import SimFileSystem, SimulatedCrash

ROOT = Path("/disk")


def new_disk(seed: int = 0, **options: object) -> SimFileSystem:
    disk = SimFileSystem(random.Random(seed), **options)  # type: ignore[arg-type]
    disk.make_directory(ROOT)
    disk.sync_directory(Path("/"))
    return disk


def durable_file(disk: SimFileSystem, name: str, data: bytes) -> None:
    handle = disk.create_file(ROOT / name)
    handle.write_at(data, 0)
    handle.sync()
    handle.close()
    disk.sync_directory(ROOT)


def test_unsynced_writes_are_readable_and_lost_by_a_crash_that_keeps_nothing() -> None:
    disk = new_disk()
    durable_file(disk, "f", b"durable")
    handle = disk.open_file(ROOT / "f", writable=True)
    handle.write_at(b"+more", 7)
    assert disk.read_file(ROOT / "f") == b"durable+more"
    disk.crash(random.Random(1), keep_unsynced=False)
    assert disk.read_file(ROOT / "f") == b"durable"


def test_a_file_whose_name_was_not_synced_vanishes_even_if_its_data_was() -> None:
    disk = new_disk()
    handle = disk.create_file(ROOT / "new")
    handle.write_at(b"data", 0)
    handle.sync()
    disk.crash(random.Random(1), keep_unsynced=False)
    assert not disk.exists(ROOT / "new")


def test_a_rename_reverts_and_an_unlink_comes_back_without_a_directory_sync() -> None:
    disk = new_disk()
    durable_file(disk, "a", b"A")
    durable_file(disk, "b", b"B")
    disk.rename(ROOT / "a", ROOT / "c")
    disk.unlink(ROOT / "b")
    assert disk.list_directory(ROOT) == ["c"]
    disk.crash(random.Random(1), keep_unsynced=False)
    assert disk.list_directory(ROOT) == ["a", "b"]
    assert disk.read_file(ROOT / "a") == b"A"


def test_a_rename_over_a_file_keeps_the_old_or_the_new_never_both_nor_none() -> None:
    outcomes = set()
    for seed in range(40):
        disk = new_disk()
        durable_file(disk, "target", b"old")
        durable_file(disk, "temporary", b"new")
        disk.rename(ROOT / "temporary", ROOT / "target")
        disk.crash(random.Random(seed))
        outcomes.add((disk.read_file(ROOT / "target"), disk.exists(ROOT / "temporary")))
    assert outcomes == {(b"old", True), (b"new", False)}


def test_a_crash_keeps_a_prefix_of_the_writes_the_last_one_possibly_torn() -> None:
    writes = [b"aaaa", b"bbbb", b"cccc"]
    seen = set()
    for seed in range(300):
        disk = new_disk()
        durable_file(disk, "f", b"")
        handle = disk.open_file(ROOT / "f", writable=True)
        for number, data in enumerate(writes):
            handle.write_at(data, 4 * number)
        disk.crash(random.Random(seed))
        kept = disk.read_file(ROOT / "f")
        full = b"".join(writes)
        data_end = len(kept.rstrip(b"\0"))
        assert kept[:data_end] == full[:data_end], kept
        assert set(kept[data_end:]) <= {0} and len(kept) <= len(full), kept
        seen.add(kept)
    # Every prefix length shows up, with and without zeros after a tear.
    assert {len(kept.rstrip(b"\0")) for kept in seen} == set(range(13))
    assert any(kept.endswith(b"\0") for kept in seen)


def test_a_process_crash_keeps_everything_readable_but_makes_nothing_durable() -> None:
    disk = new_disk()
    durable_file(disk, "f", b"one")
    handle = disk.open_file(ROOT / "f", writable=True)
    handle.write_at(b"two", 3)
    disk.create_file(ROOT / "g").close()
    lock = disk.lock_directory(ROOT)
    disk.process_crash()
    assert disk.read_file(ROOT / "f") == b"onetwo"
    assert disk.exists(ROOT / "g")
    with pytest.raises(SimulationError):
        handle.write_at(b"x", 0)  # a handle of the dead process
    disk.lock_directory(ROOT).release()  # the dead process's lock went with it
    lock.release()  # harmless
    disk.crash(random.Random(0), keep_unsynced=False)
    assert disk.read_file(ROOT / "f") == b"one"
    assert not disk.exists(ROOT / "g")


def test_halt_after_kills_the_process_before_the_next_change() -> None:
    disk = new_disk()
    start = disk.operation_count
    disk.halt_after(2)
    handle = disk.create_file(ROOT / "f")  # change 1
    handle.write_at(b"x", 0)  # change 2
    with pytest.raises(SimulatedCrash, match="sync"):
        handle.sync()
    assert disk.operation_count == start + 2
    with pytest.raises(SimulatedCrash):
        disk.read_file(ROOT / "f")  # the process is dead: nothing runs
    handle.close()  # closing never fails
    disk.process_crash()
    assert disk.read_file(ROOT / "f") == b"x"


def test_the_byte_budget_raises_disk_full_after_writing_what_fits() -> None:
    disk = new_disk(bytes_max=10)
    handle = disk.create_file(ROOT / "f")
    handle.write_at(b"12345678", 0)
    with pytest.raises(DiskFullError):
        handle.write_at(b"abcdef", 6)
    assert disk.read_file(ROOT / "f") == b"123456abcd"
    handle.write_at(b"XY", 0)  # overwriting needs no room
    handle.truncate(4)
    handle.write_at(b"zzzzzz", 4)  # room again
    assert disk.bytes_used == 10
    disk.bytes_max = None
    handle.write_at(b"more", 10)


def test_bit_flips_on_read_change_what_is_returned_not_what_is_stored() -> None:
    disk = new_disk(seed=5, read_bit_flip_probability=1.0)
    durable_file(disk, "f", bytes(64))
    flipped = disk.read_file(ROOT / "f")
    assert flipped != bytes(64)
    assert sum(bin(byte).count("1") for byte in flipped) == 1
    disk.read_bit_flip_probability = 0.0
    assert disk.read_file(ROOT / "f") == bytes(64)
    assert disk.bit_flips == 1


def test_errors_are_the_typed_ones_of_the_os_file_system() -> None:
    disk = new_disk()
    with pytest.raises(StorageError, match="No such file"):
        disk.open_file(ROOT / "missing")
    durable_file(disk, "f", b"")
    with pytest.raises(StorageError, match="File exists"):
        disk.create_file(ROOT / "f")
    disk.lock_directory(ROOT)
    with pytest.raises(DirectoryInUseError):
        disk.lock_directory(ROOT)
    with pytest.raises(SimulationError):
        disk.rename(ROOT / "f", Path("/elsewhere"))


def run_and_crash(seed: int) -> tuple[dict[str, bytes], object]:
    disk = new_disk(seed)
    for number in range(20):
        handle = disk.create_file(ROOT / f"f{number % 7}", exclusive=False)
        handle.write_at(bytes([number]) * (10 + number), number)
        if number % 3 == 0:
            handle.sync()
        if number % 5 == 0:
            disk.sync_directory(ROOT)
        if number % 4 == 0:
            disk.rename(ROOT / f"f{number % 7}", ROOT / f"g{number % 3}")
    report = disk.crash(random.Random(seed))
    return disk.file_contents(), report


def test_one_seed_gives_one_outcome() -> None:
    outcomes = [run_and_crash(seed) for seed in range(10)]
    assert outcomes == [run_and_crash(seed) for seed in range(10)]
    assert len({repr(outcome) for outcome in outcomes}) > 5

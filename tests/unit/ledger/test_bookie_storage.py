"""Bookie storage on disk: restart replays the log, crashes lose only unsynced writes, a torn
tail is cut, damage elsewhere is reported, versions are checked, dropped ledgers' files go."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorumlog.errors import CorruptLogError, DirectoryInUseError, FormatVersionError
from quorumlog.ledger.bookie_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    VERSION_FILE_NAME,
    encode_file_header,
    encode_version_file,
    log_file_name,
)
from quorumlog.ledger.bookie_storage import BookieStorage, BookieStorageSettings
from tests.unit.ledger.bookie_harness import CrashableFileSystem, open_storage, stored_data

SMALL_FILES = BookieStorageSettings(file_bytes_max=4096)


def write_synced(storage: BookieStorage, ledger_id: int, first: int, count: int) -> None:
    storage.add_entries(
        ledger_id,
        b"key",
        first - 1,
        list(range(first, first + count)),
        [b"data-%d-%d" % (ledger_id, i) for i in range(first, first + count)],
    )
    sync(storage)


def sync(storage: BookieStorage) -> None:
    job = storage.begin_sync()
    if job is not None:
        job.run()
        storage.finish_sync(job, None)


def expected(ledger_id: int, first: int, count: int) -> dict[int, bytes]:
    return {i: b"data-%d-%d" % (ledger_id, i) for i in range(first, first + count)}


def test_restart_replays_entries_lacs_keys_and_fences(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 5)
    write_synced(storage, 1, 5, 5)  # carries LAC 4
    write_synced(storage, 2, 0, 3)
    storage.fence(2, b"key")
    sync(storage)
    storage.close()

    reopened = open_storage(tmp_path)
    assert stored_data(reopened, 1) == expected(1, 0, 10)
    assert stored_data(reopened, 2) == expected(2, 0, 3)
    first, second = reopened.ledger(1), reopened.ledger(2)
    assert first is not None and second is not None
    assert (first.last_add_confirmed, first.last_entry_id, first.fenced) == (4, 9, False)
    assert (second.master_key, second.fenced) == (b"key", True)
    assert reopened.recovery.entries_found == 13
    assert reopened.recovery.torn_bytes_dropped == 0


def test_the_piggybacked_lac_is_the_highest_seen(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    storage.add_entries(1, b"key", 5, [7], [b"a"])
    storage.add_entries(1, b"key", 3, [8], [b"b"])  # a late, lower LAC does not win
    state = storage.ledger(1)
    assert state is not None and state.last_add_confirmed == 5


def test_an_overwrite_wins_and_survives_restart(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    storage.add_entries(1, b"key", -1, [0, 1], [b"old-0", b"old-1"])
    storage.add_entries(1, b"key", 0, [1], [b"new-1"])
    sync(storage)
    assert stored_data(storage, 1) == {0: b"old-0", 1: b"new-1"}
    storage.close()
    assert stored_data(open_storage(tmp_path), 1) == {0: b"old-0", 1: b"new-1"}


def test_a_crash_loses_only_unsynced_adds(tmp_path: Path) -> None:
    """Seeded power losses: every synced entry comes back whole; of the unsynced ones, each
    id that comes back has its own bytes (a prefix of the writes, never garbage)."""
    for seed in range(40):
        directory = tmp_path / f"seed-{seed}"
        disk = CrashableFileSystem()
        storage = open_storage(directory, disk, SMALL_FILES)
        rng = random.Random(seed)
        for round_number in range(rng.randint(1, 6)):
            write_synced(storage, rng.choice([1, 2]), 1000 * round_number, rng.randint(1, 30))
        synced = {ledger_id: stored_data(storage, ledger_id) for ledger_id in (1, 2)}
        for ledger_id in (1, 2):
            storage.add_entries(
                ledger_id, b"key", -1, [10**6, 10**6 + 1], [b"unsynced-a", b"unsynced-b"]
            )
        storage.close()
        disk.crash(rng)

        reopened = open_storage(directory, disk, SMALL_FILES)
        for ledger_id in (1, 2):
            found = stored_data(reopened, ledger_id)
            unsynced = {10**6: b"unsynced-a", 10**6 + 1: b"unsynced-b"}
            assert {i: found[i] for i in synced[ledger_id]} == synced[ledger_id], seed
            for entry_id, data in found.items():
                assert data == synced[ledger_id].get(entry_id, unsynced.get(entry_id)), seed
        reopened.close()


def test_a_torn_tail_is_cut_at_every_byte(tmp_path: Path) -> None:
    """Cut the unsynced record off at every byte (and zero-fill the rest instead): open
    keeps the synced entries, drops the torn record, and reports the bytes dropped."""
    source = tmp_path / "source"
    storage = open_storage(source)
    write_synced(storage, 1, 0, 3)
    synced_end = storage.writer_offset
    storage.add_entries(1, b"key", 2, [3, 4], [b"torn-3", b"torn-4"])
    name = log_file_name(storage.writer_number)
    storage.close()
    whole = (source / name).read_bytes()
    version = (source / VERSION_FILE_NAME).read_bytes()
    for cut in range(synced_end, len(whole)):
        for zero_filled in (False, True):
            directory = tmp_path / f"cut-{cut}-{zero_filled}"
            directory.mkdir()
            (directory / VERSION_FILE_NAME).write_bytes(version)
            torn = whole[:cut] + (bytes(len(whole) - cut) if zero_filled else b"")
            (directory / name).write_bytes(torn)
            reopened = open_storage(directory)
            assert stored_data(reopened, 1) == expected(1, 0, 3), cut
            assert reopened.recovery.torn_bytes_dropped == len(torn) - synced_end
            reopened.close()


def test_a_torn_new_file_is_removed_whole(tmp_path: Path) -> None:
    """A crash while a new file was being started (torn in its header or checkpoint)."""
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 3)
    number = storage.writer_number
    storage.close()
    (tmp_path / log_file_name(number + 1)).write_bytes(encode_file_header(number + 1)[:20])
    reopened = open_storage(tmp_path)
    assert stored_data(reopened, 1) == expected(1, 0, 3)
    assert reopened.recovery.torn_bytes_dropped == 20
    assert reopened.recovery.torn_file == str(tmp_path / log_file_name(number + 1))
    assert reopened.writer_number == number + 1  # started afresh


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_damage_before_the_tail_is_corruption(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 3)
    damaged_offset = storage.writer_offset + RECORD_HEADER_BYTES + 20  # inside entry data
    write_synced(storage, 1, 3, 3)
    write_synced(storage, 1, 6, 3)  # valid records follow the damage
    name = log_file_name(storage.writer_number)
    storage.close()
    flip_byte(tmp_path / name, damaged_offset)
    with pytest.raises(CorruptLogError) as caught:
        open_storage(tmp_path)
    assert name in str(caught.value)


def test_damage_in_an_older_file_is_corruption(tmp_path: Path) -> None:
    storage = open_storage(tmp_path, settings=SMALL_FILES)
    for first in range(0, 300, 10):
        write_synced(storage, 1, first, 10)
    assert len(storage.file_numbers) > 2
    oldest = log_file_name(storage.file_numbers[0])
    storage.close()
    flip_byte(tmp_path / oldest, FILE_HEADER_BYTES + RECORD_HEADER_BYTES + 5)
    with pytest.raises(CorruptLogError, match=oldest):
        open_storage(tmp_path, settings=SMALL_FILES)


def test_damage_to_the_last_record_header_followed_by_data_is_corruption(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 3)
    last_record = storage.writer_offset
    write_synced(storage, 1, 3, 3)
    name = log_file_name(storage.writer_number)
    storage.close()
    flip_byte(tmp_path / name, last_record + 4)  # its body length; the body is not zeros
    with pytest.raises(CorruptLogError):
        open_storage(tmp_path)


def test_a_flipped_bit_is_caught_on_read(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 1)
    state = storage.ledger(1)
    assert state is not None
    location = state.index.get(0)
    assert location is not None
    flip_byte(tmp_path / log_file_name(location.file_number), location.offset + 16 + 2)
    with pytest.raises(CorruptLogError):
        storage.read_entries(1, 0, 0, 1 << 20, 10)


def test_another_format_version_is_refused_in_one_line(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    write_synced(storage, 1, 0, 1)
    storage.close()
    (tmp_path / VERSION_FILE_NAME).write_bytes(encode_version_file(7))
    with pytest.raises(FormatVersionError) as caught:
        open_storage(tmp_path)
    message = str(caught.value)
    assert "format version 7" in message and "format version 2" in message
    assert "\n" not in message
    assert (caught.value.found_version, caught.value.supported_version) == (7, 2)


def test_a_file_of_another_version_is_refused(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    number = storage.writer_number
    storage.close()
    path = tmp_path / log_file_name(number)
    data = path.read_bytes()
    path.write_bytes(encode_file_header(number, version=3) + data[FILE_HEADER_BYTES:])
    with pytest.raises(FormatVersionError, match="format version 3"):
        open_storage(tmp_path)


def test_log_files_without_a_version_file_are_refused(tmp_path: Path) -> None:
    open_storage(tmp_path).close()
    (tmp_path / VERSION_FILE_NAME).unlink()
    with pytest.raises(CorruptLogError, match="VERSION"):
        open_storage(tmp_path)


def test_one_open_storage_per_directory(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    with pytest.raises(DirectoryInUseError):
        open_storage(tmp_path)
    storage.close()
    open_storage(tmp_path).close()


def test_files_roll_and_dropped_ledgers_files_are_deleted(tmp_path: Path) -> None:
    storage = open_storage(tmp_path, settings=SMALL_FILES)
    for first in range(0, 1000, 20):
        write_synced(storage, 1, first, 20)  # ledger 1 fills files alone ...
    files_of_one = set(storage.file_numbers) - {storage.writer_number}
    write_synced(storage, 2, 0, 5)  # ... then ledger 2 shares the newest
    assert len(files_of_one) >= 3
    size_before = storage.bytes_on_disk

    storage.drop(1)
    sync(storage)  # the drop is durable: its files may go
    assert not files_of_one & set(storage.file_numbers)
    assert storage.bytes_on_disk < size_before
    for number in files_of_one:
        assert not (tmp_path / log_file_name(number)).exists()
    assert storage.ledger(1) is None
    storage.close()

    reopened = open_storage(tmp_path, settings=SMALL_FILES)
    assert reopened.ledger(1) is None
    assert stored_data(reopened, 2) == expected(2, 0, 5)


def test_a_drop_survives_restart_even_when_its_file_is_gone(tmp_path: Path) -> None:
    """Ledger 1's entries sit in file A, kept alive by ledger 2; the drop of 1 is recorded
    in file B, which is deleted once ledger 4 (the rest of B) is dropped too. The
    checkpoint at the head of each newer file still says ledger 1 is gone."""
    storage = open_storage(tmp_path, settings=SMALL_FILES)
    write_synced(storage, 1, 0, 5)
    write_synced(storage, 2, 0, 5)
    file_a = storage.writer_number
    first = 0
    while storage.writer_number == file_a:
        write_synced(storage, 4, first, 10)
        first += 10
    file_b = storage.writer_number
    storage.drop(1)
    while storage.writer_number == file_b:
        write_synced(storage, 4, first, 10)
        first += 10
    storage.drop(4)
    sync(storage)
    assert file_a in storage.file_numbers
    assert file_b not in storage.file_numbers  # the file with the drop of ledger 1 is gone
    storage.close()
    for _ in range(2):
        reopened = open_storage(tmp_path, settings=SMALL_FILES)
        assert reopened.ledger(1) is None
        assert reopened.ledger(4) is None
        assert stored_data(reopened, 2) == expected(2, 0, 5)
        reopened.close()


def test_a_sync_that_spans_a_file_roll_covers_both_files(tmp_path: Path) -> None:
    """Many adds, one sync, a roll in between: the rolled file is synced whole before the
    next one starts, so after a power loss every add of that sync is there."""
    for seed in range(10):
        directory = tmp_path / f"seed-{seed}"
        disk = CrashableFileSystem()
        storage = open_storage(directory, disk, SMALL_FILES)
        first_file = storage.writer_number
        for first in range(0, 400, 10):
            storage.add_entries(
                1,
                b"key",
                -1,
                list(range(first, first + 10)),
                [b"data-1-%d" % i for i in range(first, first + 10)],
            )
        assert storage.writer_number > first_file
        sync(storage)
        storage.close()
        disk.crash(random.Random(seed))
        assert stored_data(open_storage(directory, disk, SMALL_FILES), 1) == expected(1, 0, 400)


def test_a_fence_on_a_new_ledger_keeps_its_key_across_restart(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    storage.fence(9, b"the-key")
    sync(storage)
    storage.close()
    state = open_storage(tmp_path).ledger(9)
    assert state is not None
    assert (state.master_key, state.fenced, state.last_entry_id) == (b"the-key", True, -1)


def test_restarts_leave_no_pile_of_empty_files(tmp_path: Path) -> None:
    for _ in range(5):
        storage = open_storage(tmp_path)
        storage.close()
    storage = open_storage(tmp_path)
    assert len(storage.file_numbers) == 1


def test_a_bad_setting_is_named() -> None:
    with pytest.raises(ValueError, match="file_bytes_max"):
        BookieStorageSettings(file_bytes_max=10).validate()

"""The ledger length a bookie keeps with the LAC (storage format version 2): stored with the
highest LAC, durable as the LAC is (replay, checkpoints), answered on read-LAC and fence,
and unknown (-1) in directories of format version 1, which are read, not refused."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import google_crc32c

from quorumlog.codec import wire
from quorumlog.codec.wire import BookieStatus
from quorumlog.ledger.bookie_format import (
    FORMAT_VERSION,
    VERSION_FILE_NAME,
    RecordKind,
    decode_file_header,
    decode_version_file,
    encode_file_header,
    encode_version_file,
    log_file_name,
)
from quorumlog.ledger.bookie_storage import BookieStorage, BookieStorageSettings
from tests.unit.ledger.bookie_harness import BookieRig, add, open_storage, stored_data

OK = BookieStatus.OK


def sync(storage: BookieStorage) -> None:
    job = storage.begin_sync()
    if job is not None:
        job.run()
        storage.finish_sync(job, None)


def lac_and_length(storage: BookieStorage, ledger_id: int) -> tuple[int, int]:
    state = storage.ledger(ledger_id)
    assert state is not None
    return state.last_add_confirmed, state.length


def test_the_length_goes_with_the_highest_lac(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    storage.add_entries(1, b"key", -1, [0, 1], [b"aa", b"bbb"], length=-1)
    assert lac_and_length(storage, 1) == (-1, -1)
    storage.add_entries(1, b"key", 1, [2], [b"c"], length=5)
    storage.add_entries(1, b"key", 0, [3], [b"d"], length=2)  # late, lower: ignored
    assert lac_and_length(storage, 1) == (1, 5)
    storage.add_entries(1, b"key", 2, [4], [b"e"])  # a writer that did not send it
    assert lac_and_length(storage, 1) == (2, -1)
    storage.add_entries(1, b"key", 2, [], [], length=6)  # the same LAC, now with it
    assert lac_and_length(storage, 1) == (2, 6)
    storage.add_entries(1, b"key", 2, [], [], length=-1)  # never forgotten again
    assert lac_and_length(storage, 1) == (2, 6)


def test_the_length_survives_restart_and_a_crash_once_synced(tmp_path: Path) -> None:
    for seed in range(10):
        rig = BookieRig(tmp_path / f"seed-{seed}")
        rig.call(add(1, 0, 3, lac=-1, length=-1))
        rig.call(add(1, 3, 3, lac=2, length=21))
        rig.send(add(1, 6, 1, lac=5, length=42))  # never synced: may be lost, never torn
        rig.restart(random.Random(seed))
        assert lac_and_length(rig.storage, 1) in ((2, 21), (5, 42)), seed
        rig.restart()
        answer = rig.call(wire.ReadLastAddConfirmed(9, 1))
        assert isinstance(answer, wire.LastAddConfirmedResult)
        assert (answer.last_add_confirmed, answer.length) in ((2, 21), (5, 42)), seed


def test_read_lac_and_fence_answer_the_stored_length(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 5, lac=-1))
    rig.call(add(1, 5, 1, lac=3, length=28))
    read = rig.call(wire.ReadLastAddConfirmed(7, 1))
    assert read == wire.LastAddConfirmedResult(7, 1, OK, 3, 5, length=28)
    fenced = rig.call(wire.ReadLastAddConfirmed(8, 1, fence=True, master_key=b"key"))
    assert fenced == wire.LastAddConfirmedResult(8, 1, OK, 3, 5, length=28)
    rig.restart()
    again = rig.call(wire.ReadLastAddConfirmed(9, 1, fence=True, master_key=b"key"))
    assert again == wire.LastAddConfirmedResult(9, 1, OK, 3, 5, length=28)


def test_a_checkpoint_carries_the_length_once_the_files_it_was_written_in_are_gone(
    tmp_path: Path,
) -> None:
    """Ledger 1's LAC and length rode on an add with no entries, so no file is pinned by it:
    once the files it was written in are deleted, only the checkpoints restate it."""
    settings = BookieStorageSettings(file_bytes_max=4096)
    storage = open_storage(tmp_path, settings=settings)
    storage.fence(1, b"key")
    storage.add_entries(1, b"key", 9, [], [], length=1234)
    first_file = storage.writer_number
    for first in range(0, 400, 20):
        storage.add_entries(2, b"key", first - 1, list(range(first, first + 20)), [bytes(50)] * 20)
    storage.drop(2)
    sync(storage)
    assert first_file not in storage.file_numbers
    storage.close()
    reopened = open_storage(tmp_path, settings=settings)
    assert lac_and_length(reopened, 1) == (9, 1234)
    state = reopened.ledger(1)
    assert state is not None and state.fenced


# --- format version 1, packed by hand from its documented layout --------------------------

_VERSION_1_PREFIX = struct.Struct("<IIB3xIQqI")


def version_1_record(kind: RecordKind, ledger_id: int, lac: int, count: int, body: bytes) -> bytes:
    prefix = _VERSION_1_PREFIX.pack(
        google_crc32c.value(body), len(body), kind, count, ledger_id, lac, 0
    )
    return prefix + struct.pack("<I", google_crc32c.value(prefix)) + body


def version_1_entries(ledger_id: int, lac: int, datas: dict[int, bytes]) -> bytes:
    body = b"".join(
        struct.pack("<QII", entry_id, len(data), google_crc32c.value(data)) + data
        for entry_id, data in datas.items()
    )
    return version_1_record(RecordKind.ENTRIES, ledger_id, lac, len(datas), body)


def write_version_1_directory(directory: Path) -> None:
    """Two files: ledger 3's key and entries 0..2 (LAC 1) in the first; the second starts
    with a checkpoint naming ledger 3 (LAC 1, fenced) and holds entry 3 (LAC 2)."""
    directory.mkdir()
    (directory / VERSION_FILE_NAME).write_bytes(encode_version_file(1))
    empty_checkpoint = version_1_record(RecordKind.CHECKPOINT, 0, -1, 0, b"")
    first = (
        encode_file_header(1, version=1)
        + empty_checkpoint
        + version_1_record(RecordKind.MASTER_KEY, 3, -1, 0, b"key")
        + version_1_entries(3, 1, {0: b"zero", 1: b"one", 2: b"two"})
    )
    (directory / log_file_name(1)).write_bytes(first)
    item = struct.pack("<QqHH", 3, 1, 1, 3) + b"key"
    second = (
        encode_file_header(2, version=1)
        + version_1_record(RecordKind.CHECKPOINT, 0, -1, 1, item)
        + version_1_entries(3, 2, {3: b"three"})
    )
    (directory / log_file_name(2)).write_bytes(second)


def test_a_version_1_directory_is_read_with_the_length_unknown(tmp_path: Path) -> None:
    directory = tmp_path / "bookie"
    write_version_1_directory(directory)
    storage = open_storage(directory)
    assert stored_data(storage, 3) == {0: b"zero", 1: b"one", 2: b"two", 3: b"three"}
    assert lac_and_length(storage, 3) == (2, -1)
    state = storage.ledger(3)
    assert state is not None and state.fenced and state.master_key == b"key"
    # From now on the directory is version 2: a version-1 program refuses it.
    assert decode_version_file((directory / VERSION_FILE_NAME).read_bytes()) == FORMAT_VERSION
    new_file = (directory / log_file_name(storage.writer_number)).read_bytes()
    assert decode_file_header(new_file) == (FORMAT_VERSION, 3)
    storage.add_entries(
        3,
        b"key",
        3,
        [4],
        [b"four"],
        length=16,
    )
    sync(storage)
    storage.close()

    reopened = open_storage(directory)  # version-1 and version-2 files side by side
    assert stored_data(reopened, 3)[4] == b"four"
    assert lac_and_length(reopened, 3) == (3, 16)


def test_a_torn_tail_of_a_version_1_file_is_cut_at_its_own_record_size(tmp_path: Path) -> None:
    directory = tmp_path / "bookie"
    write_version_1_directory(directory)
    path = directory / log_file_name(2)
    whole = path.read_bytes()
    path.write_bytes(whole + version_1_entries(3, 3, {4: b"four"})[:30] + bytes(10))
    storage = open_storage(directory)
    assert storage.recovery.torn_bytes_dropped == 40
    assert 4 not in stored_data(storage, 3)
    assert lac_and_length(storage, 3) == (2, -1)

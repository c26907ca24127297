"""The bookie's request handling: group commit, fencing, keys, reads, drops, bad input."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from quorumlog.codec import wire
from quorumlog.codec.wire import BookieStatus
from quorumlog.ledger.bookie import BookieRequest, BookieSettings
from quorumlog.ledger.bookie_format import ID_MAX
from quorumlog.ledger.bookie_storage import BookieStorageSettings
from tests.unit.ledger.bookie_harness import (
    BookieRig,
    CrashableFileSystem,
    add,
    entries,
    stored_data,
)

OK = BookieStatus.OK


def status_of(response: wire.Frame) -> BookieStatus:
    assert isinstance(
        response, wire.AddEntriesResult | wire.ReadEntriesResult | wire.LastAddConfirmedResult
    ), response
    return response.status


# --- group commit ------------------------------------------------------------------------


def test_adds_from_many_ledgers_share_one_fsync(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    syncs_before = rig.disk.syncs
    pending = [rig.send(add(ledger_id, 0, 50, request_id=ledger_id)) for ledger_id in range(1, 21)]
    assert all(not responses for responses in pending)  # nothing is answered before a sync
    rig.settle()
    assert rig.disk.syncs - syncs_before == 1
    assert rig.bookie.syncs_completed == 1
    for ledger_id, responses in enumerate(pending, start=1):
        assert responses == [wire.AddEntriesResult(ledger_id, ledger_id, OK, list(range(50)))]


def test_an_add_is_answered_only_after_its_sync_completes(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    responses = rig.send(add(1, 0, 3))
    rig.run_turn()  # the sync is handed to the background ...
    assert len(rig.background.jobs) == 1
    assert responses == []  # ... and nothing is acknowledged until it reports
    later = rig.send(add(1, 3, 3))  # arrives while the sync runs: waits for the next one
    rig.background.run_one()
    assert [status_of(r) for r in responses] == [OK]
    assert later == []
    assert len(rig.background.jobs) == 1  # the next sync started at once for it
    rig.settle()
    assert [status_of(r) for r in later] == [OK]


def test_a_crash_before_the_sync_loses_only_unacknowledged_adds(tmp_path: Path) -> None:
    for seed in range(20):
        rig = BookieRig(tmp_path / f"seed-{seed}")
        assert status_of(rig.call(add(1, 0, 10, prefix=b"acked"))) is OK
        unacknowledged = rig.send(add(1, 10, 10, prefix=b"maybe"))
        rig.run_turn()  # the sync is submitted but never reports: the process dies
        assert unacknowledged == []
        rig.restart(random.Random(seed))
        found = stored_data(rig.storage, 1)
        assert {i: found[i] for i in range(10)} == {i: b"acked-%d" % i for i in range(10)}
        assert all(found[i] == b"maybe-%d" % i for i in found if i >= 10)


def test_a_failed_sync_acknowledges_nothing_and_stops_writes(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.disk.fail_next_sync = True
    responses = rig.send(add(1, 0, 3))
    fence = rig.send(wire.ReadLastAddConfirmed(2, 2, fence=True, master_key=b"key"))
    rig.settle()
    assert [status_of(r) for r in responses] == [BookieStatus.READ_ONLY]
    assert [status_of(r) for r in fence] == [BookieStatus.READ_ONLY]
    assert status_of(rig.call(add(1, 3, 1))) is BookieStatus.READ_ONLY
    assert not rig.bookie.writable
    # Reads go on.
    read = rig.call(wire.ReadEntries(3, 1, 0, 2))
    assert status_of(read) is OK


# --- fencing -------------------------------------------------------------------------------


def test_fencing_refuses_later_adds_but_not_recovery_adds(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 5, lac=-1))
    rig.call(add(1, 5, 1, lac=3))
    fenced = rig.call(wire.ReadLastAddConfirmed(7, 1, fence=True, master_key=b"key"))
    assert fenced == wire.LastAddConfirmedResult(7, 1, OK, last_add_confirmed=3, last_entry_id=5)
    assert status_of(rig.call(add(1, 6, 1))) is BookieStatus.FENCED
    assert status_of(rig.call(add(1, 6, 1, recovery=True))) is OK
    # Idempotent: fencing again answers the same (now with the recovery add).
    again = rig.call(wire.ReadLastAddConfirmed(8, 1, fence=True, master_key=b"key"))
    assert again == wire.LastAddConfirmedResult(8, 1, OK, last_add_confirmed=3, last_entry_id=6)


def test_a_fence_is_answered_only_once_durable_and_survives_a_crash(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 2))
    responses = rig.send(wire.ReadLastAddConfirmed(1, 1, fence=True, master_key=b"key"))
    repeated = rig.send(wire.ReadLastAddConfirmed(2, 1, fence=True, master_key=b"key"))
    rig.run_turn()
    assert responses == [] and repeated == []  # not durable yet, not even the repeat
    rig.background.run_one()
    assert [status_of(r) for r in responses + repeated] == [OK, OK]
    rig.restart(random.Random(1))
    assert status_of(rig.call(add(1, 2, 1))) is BookieStatus.FENCED


def test_fencing_an_unknown_ledger_takes_its_key_and_bars_the_old_writer(tmp_path: Path) -> None:
    """A bookie of the last ensemble that never got an entry must still refuse the old
    writer after recovery fenced it."""
    rig = BookieRig(tmp_path)
    fenced = rig.call(wire.ReadLastAddConfirmed(1, 4, fence=True, master_key=b"key"))
    assert fenced == wire.LastAddConfirmedResult(1, 4, OK, -1, -1)
    assert status_of(rig.call(add(4, 0, 1))) is BookieStatus.FENCED
    assert status_of(rig.call(add(4, 0, 1, key=b"other"))) is BookieStatus.UNAUTHORIZED
    read = rig.call(wire.ReadEntries(2, 4, 0, 0))
    assert status_of(read) is BookieStatus.NO_SUCH_ENTRY  # an explicit not-found


def test_fencing_with_the_wrong_key_is_refused(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 1))
    refused = rig.call(wire.ReadLastAddConfirmed(1, 1, fence=True, master_key=b"wrong"))
    assert status_of(refused) is BookieStatus.UNAUTHORIZED
    assert status_of(rig.call(add(1, 1, 1))) is OK  # not fenced


# --- keys ----------------------------------------------------------------------------------


def test_a_wrong_master_key_is_refused_and_stores_nothing(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 2, key=b"right"))
    assert status_of(rig.call(add(1, 2, 2, key=b"wrong"))) is BookieStatus.UNAUTHORIZED
    assert status_of(rig.call(add(1, 0, 1, key=b"", prefix=b"evil"))) is (BookieStatus.UNAUTHORIZED)
    rig.restart()
    assert stored_data(rig.storage, 1) == {0: b"entry-0", 1: b"entry-1"}
    state = rig.storage.ledger(1)
    assert state is not None and state.master_key == b"right"


# --- reads ---------------------------------------------------------------------------------


def test_reads_answer_stored_entries_with_the_stored_lac(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    # Striped: this bookie holds 0, 1, 3, 4 (E=3, Qw=2 gives it two of every three).
    rig.call(wire.AddEntries(1, 1, b"key", -1, [wire.LedgerEntryData(0, b"a")]))
    rig.call(wire.AddEntries(2, 1, b"key", 0, [wire.LedgerEntryData(1, b"b")]))
    rig.call(wire.AddEntries(3, 1, b"key", 2, [wire.LedgerEntryData(3, b"d")]))
    rig.call(wire.AddEntries(4, 1, b"key", 3, [wire.LedgerEntryData(4, b"e")]))
    read = rig.call(wire.ReadEntries(5, 1, 0, 10))
    assert read == wire.ReadEntriesResult(
        5,
        1,
        OK,
        [
            wire.LedgerEntryData(0, b"a"),
            wire.LedgerEntryData(1, b"b"),
            wire.LedgerEntryData(3, b"d"),
            wire.LedgerEntryData(4, b"e"),
        ],
        last_add_confirmed=3,
    )
    missing = rig.call(wire.ReadEntries(6, 1, 2, 4))
    assert missing == wire.ReadEntriesResult(6, 1, BookieStatus.NO_SUCH_ENTRY, [], 3)
    beyond = rig.call(wire.ReadEntries(7, 1, 5, 5))
    assert status_of(beyond) is BookieStatus.NO_SUCH_ENTRY
    unknown = rig.call(wire.ReadEntries(8, 99, 0, 0))
    assert status_of(unknown) is BookieStatus.NO_SUCH_LEDGER
    lac = rig.call(wire.ReadLastAddConfirmed(9, 1))
    assert lac == wire.LastAddConfirmedResult(9, 1, OK, last_add_confirmed=3, last_entry_id=4)
    assert status_of(rig.call(wire.ReadLastAddConfirmed(10, 99))) is BookieStatus.NO_SUCH_LEDGER


def test_a_read_stops_at_its_byte_and_entry_bounds_but_returns_the_first(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path, settings=BookieSettings(read_entries_max=4))
    rig.call(
        wire.AddEntries(1, 1, b"key", -1, [wire.LedgerEntryData(i, bytes(100)) for i in range(10)])
    )
    by_bytes = rig.call(wire.ReadEntries(2, 1, 0, 9, bytes_max=250))
    assert isinstance(by_bytes, wire.ReadEntriesResult)
    assert [e.entry_id for e in by_bytes.entries] == [0, 1]
    tiny = rig.call(wire.ReadEntries(3, 1, 5, 9, bytes_max=1))
    assert isinstance(tiny, wire.ReadEntriesResult)
    assert [e.entry_id for e in tiny.entries] == [5]
    by_count = rig.call(wire.ReadEntries(4, 1, 0, 9))
    assert isinstance(by_count, wire.ReadEntriesResult)
    assert [e.entry_id for e in by_count.entries] == [0, 1, 2, 3]


def test_reads_see_entries_of_rolled_files(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path, storage_settings=BookieStorageSettings(file_bytes_max=4096))
    for first in range(0, 500, 25):
        rig.call(add(1, first, 25))
    assert len(rig.storage.file_numbers) > 2
    read = rig.call(wire.ReadEntries(1, 1, 0, 499))
    assert isinstance(read, wire.ReadEntriesResult)
    assert [e.data for e in read.entries] == [b"entry-%d" % i for i in range(500)]


def test_a_damaged_entry_reads_as_unknown_never_as_not_found(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 1))
    state = rig.storage.ledger(1)
    assert state is not None
    where = state.index.get(0)
    assert where is not None
    path = rig.directory / f"entries_{where.file_number:010d}.log"
    data = bytearray(path.read_bytes())
    data[where.offset + 17] ^= 1
    path.write_bytes(bytes(data))
    response = rig.call(wire.ReadEntries(5, 1, 0, 0))
    assert isinstance(response, wire.ErrorResponse)
    assert (response.request_id, response.code) == (5, wire.ErrorCode.INTERNAL)


# --- drops ---------------------------------------------------------------------------------


def test_drop_forgets_a_ledger_durably_and_is_idempotent(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 3))
    rig.call(add(2, 0, 3))
    responses = rig.send(wire.DropLedger(7, 1))
    assert responses == []  # answered once durable
    rig.settle()
    assert responses == [wire.Done(7)]
    assert rig.call(wire.DropLedger(8, 1)) == wire.Done(8)
    assert rig.call(wire.DropLedger(9, 12345)) == wire.Done(9)
    assert status_of(rig.call(wire.ReadEntries(1, 1, 0, 0))) is BookieStatus.NO_SUCH_LEDGER
    rig.restart(random.Random(3))
    assert rig.storage.ledger(1) is None
    assert stored_data(rig.storage, 2) == {i: b"entry-%d" % i for i in range(3)}


# --- bad input -------------------------------------------------------------------------------

BAD_ADDS: list[tuple[str, wire.AddEntries, BookieStatus]] = [
    (
        "length below -1",
        wire.AddEntries(1, 1, b"key", 0, entries(2, 1), length=-2),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "length too large",
        wire.AddEntries(1, 1, b"key", 0, entries(2, 1), length=ID_MAX + 1),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "negative ledger id",
        wire.AddEntries(1, -1, b"key", -1, entries(0, 1)),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "ledger id too large",
        wire.AddEntries(1, ID_MAX + 1, b"key", -1, entries(0, 1)),
        BookieStatus.BAD_REQUEST,
    ),
    ("LAC below -1", wire.AddEntries(1, 1, b"key", -2, entries(0, 1)), BookieStatus.BAD_REQUEST),
    (
        "negative entry id",
        wire.AddEntries(1, 1, b"key", -1, entries(-1, 1)),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "entry id too large",
        wire.AddEntries(1, 1, b"key", -1, entries(ID_MAX + 1, 1)),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "entry ids out of order",
        wire.AddEntries(1, 1, b"key", -1, [*entries(5, 1), *entries(4, 1)]),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "duplicate entry ids",
        wire.AddEntries(1, 1, b"key", -1, [*entries(5, 1), *entries(5, 1)]),
        BookieStatus.BAD_REQUEST,
    ),
    (
        "entry over entry_bytes_max",
        wire.AddEntries(1, 1, b"key", -1, [wire.LedgerEntryData(0, bytes(1025))]),
        BookieStatus.TOO_LARGE,
    ),
    (
        "request over request_bytes_max",
        wire.AddEntries(1, 1, b"key", -1, [wire.LedgerEntryData(i, bytes(1000)) for i in range(5)]),
        BookieStatus.TOO_LARGE,
    ),
    ("too many entries", wire.AddEntries(1, 1, b"key", -1, entries(0, 11)), BookieStatus.TOO_LARGE),
    (
        "master key too long",
        wire.AddEntries(1, 1, bytes(17), -1, entries(0, 1)),
        BookieStatus.TOO_LARGE,
    ),
]

SMALL_BOUNDS = BookieSettings(
    entry_bytes_max=1024,
    request_bytes_max=4096,
    entries_per_request_max=10,
    master_key_bytes_max=16,
)


@pytest.mark.parametrize(("name", "frame", "status"), BAD_ADDS, ids=[c[0] for c in BAD_ADDS])
def test_a_bad_add_is_refused_and_stores_nothing(
    tmp_path: Path, name: str, frame: wire.AddEntries, status: BookieStatus
) -> None:
    rig = BookieRig(tmp_path, settings=SMALL_BOUNDS)
    rig.call(add(1, 0, 2))
    written = rig.storage.written_position
    response = rig.call(frame)
    assert response == wire.AddEntriesResult(frame.request_id, frame.ledger_id, status), name
    assert rig.storage.written_position == written
    rig.restart()
    assert stored_data(rig.storage, 1) == {0: b"entry-0", 1: b"entry-1"}


BAD_READS: list[tuple[str, BookieRequest]] = [
    ("read: negative ledger", wire.ReadEntries(1, -5, 0, 0)),
    ("read: first after last", wire.ReadEntries(1, 1, 3, 2)),
    ("read: negative first", wire.ReadEntries(1, 1, -1, 2)),
    ("read: last too large", wire.ReadEntries(1, 1, 0, ID_MAX + 1)),
    ("read: no bytes", wire.ReadEntries(1, 1, 0, 0, bytes_max=0)),
    ("lac: negative ledger", wire.ReadLastAddConfirmed(1, -1)),
    ("fence: negative ledger", wire.ReadLastAddConfirmed(1, -1, fence=True, master_key=b"key")),
]


@pytest.mark.parametrize(("name", "frame"), BAD_READS, ids=[c[0] for c in BAD_READS])
def test_a_bad_read_is_refused(tmp_path: Path, name: str, frame: BookieRequest) -> None:
    rig = BookieRig(tmp_path)
    rig.call(add(1, 0, 2))
    assert status_of(rig.call(frame)) is BookieStatus.BAD_REQUEST, name


def test_bad_drops_fences_and_frames(tmp_path: Path) -> None:
    rig = BookieRig(tmp_path, settings=SMALL_BOUNDS)
    rig.call(add(1, 0, 2))
    dropped = rig.call(wire.DropLedger(3, -1))
    assert isinstance(dropped, wire.ErrorResponse) and dropped.code is wire.ErrorCode.BAD_REQUEST
    long_key = rig.call(wire.ReadLastAddConfirmed(4, 1, fence=True, master_key=bytes(17)))
    assert status_of(long_key) is BookieStatus.TOO_LARGE
    stranger = rig.call(wire.KVRead(5, "key"))  # type: ignore[arg-type]
    assert stranger == wire.ErrorResponse(
        5, wire.ErrorCode.BAD_REQUEST, "KVRead is not a bookie request"
    )
    assert status_of(rig.call(add(1, 2, 1))) is OK  # still serving


def test_garbage_frames_never_break_the_bookie_or_lose_data(tmp_path: Path) -> None:
    """Mutated frames: those that still decode are answered (once, with a status), the
    ones that do not are the transport's to refuse; acknowledged entries stay intact."""
    rig = BookieRig(tmp_path, settings=SMALL_BOUNDS)
    rig.call(add(1, 0, 5))
    rng = random.Random(11)
    templates = [
        wire.encode(add(1, 5, 3)),
        wire.encode(wire.ReadEntries(1, 1, 0, 4)),
        wire.encode(wire.ReadLastAddConfirmed(1, 1, fence=False)),
        wire.encode(wire.DropLedger(1, 2)),
    ]
    answered = 0
    for _ in range(3000):
        payload = bytearray(rng.choice(templates))
        for _ in range(rng.randint(1, 4)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        try:
            frame = wire.decode(bytes(payload))
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            # msgspec raises UnicodeDecodeError for bad UTF-8 in a tag; either way the
            # transport's to refuse, not the bookie's.
            continue
        if not isinstance(
            frame, wire.AddEntries | wire.ReadEntries | wire.ReadLastAddConfirmed | wire.DropLedger
        ):
            continue
        if isinstance(frame, wire.DropLedger) and frame.ledger_id == 1:
            continue  # a valid drop of the ledger we check would rightly remove it
        responses = rig.send(frame)
        rig.settle()
        assert len(responses) == 1
        answered += 1
    assert answered > 100
    rig.restart()
    found = stored_data(rig.storage, 1)
    assert {i: found[i] for i in range(5)} == {i: b"entry-%d" % i for i in range(5)}


# --- a full disk -----------------------------------------------------------------------------


def test_a_full_disk_answers_read_only_and_loses_nothing(tmp_path: Path) -> None:
    disk = CrashableFileSystem()
    rig = BookieRig(tmp_path, disk=disk)
    rig.call(add(1, 0, 5))
    disk.bytes_free = 120  # less than the next record: a partial write
    assert status_of(rig.call(add(1, 5, 5))) is BookieStatus.READ_ONLY
    assert not rig.bookie.writable
    disk.bytes_free = 30  # less than any record
    fence = rig.call(wire.ReadLastAddConfirmed(2, 7, fence=True, master_key=b"key"))
    assert status_of(fence) is BookieStatus.READ_ONLY
    dropped = rig.call(wire.DropLedger(3, 1))
    assert isinstance(dropped, wire.ErrorResponse)
    assert dropped.code is wire.ErrorCode.UNAVAILABLE
    assert status_of(rig.call(wire.ReadEntries(4, 1, 0, 4))) is OK
    disk.bytes_free = None  # room again: writes go on where they left off ...
    assert status_of(rig.call(add(1, 5, 1))) is OK  # ... (shorter than the failed one)
    assert rig.bookie.writable
    assert status_of(rig.call(add(1, 6, 4))) is OK
    rig.restart()
    assert stored_data(rig.storage, 1) == {i: b"entry-%d" % i for i in range(10)}
    rig.restart(random.Random(5))
    assert stored_data(rig.storage, 1) == {i: b"entry-%d" % i for i in range(10)}


def test_a_full_disk_while_rolling_a_file_loses_nothing(tmp_path: Path) -> None:
    disk = CrashableFileSystem()
    settings = BookieStorageSettings(file_bytes_max=2048)
    rig = BookieRig(tmp_path, disk=disk, storage_settings=settings)
    first = 0
    while len(rig.storage.file_numbers) == 1:
        rig.call(add(1, first, 10))
        first += 10
    number = rig.storage.writer_number
    # Fill the file again to just below the roll, then leave room for no new file.
    while rig.storage.writer_offset + 400 < settings.file_bytes_max:
        rig.call(add(1, first, 10))
        first += 10
    disk.bytes_free = 60  # not even the new file's header and checkpoint fit
    assert status_of(rig.call(add(1, first, 10))) is BookieStatus.READ_ONLY
    assert rig.storage.writer_number == number
    assert rig.storage.file_numbers[-1] == number
    assert not (tmp_path / f"entries_{number + 1:010d}.log").exists()
    disk.bytes_free = None
    assert status_of(rig.call(add(1, first, 10))) is OK
    rig.restart(random.Random(2))
    assert stored_data(rig.storage, 1) == {i: b"entry-%d" % i for i in range(first + 10)}


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="entry_bytes_max"):
        BookieSettings(entry_bytes_max=10, request_bytes_max=5).validate()
    with pytest.raises(ValueError, match="read_entries_max"):
        BookieSettings(read_entries_max=0).validate()

"""Fault injection for the mmap store: torn tails at every byte, cut files, flipped bits, lost
index tails, crashes inside truncations, a full disk. See mmap_recovery for the rules."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import msgspec
import pytest

from quorumlog.storage import (
    CorruptLogError,
    DiskFullError,
    EntryTooLargeError,
    LogEntry,
    MmapLogStore,
    StorageError,
    StoreClosedError,
    SyncPolicy,
)
from quorumlog.storage.filesystem import atomic_write
from quorumlog.storage.mmap_format import (
    BLANK,
    BLANK_MAGIC,
    ENTRY_HEADER_BYTES,
    INDEX_SLOT_BYTES,
    decode_index_slot,
    decode_meta,
    encode_meta,
    entry_size,
)

DATA_FILE_BYTES = 4096
INDEX_FILE_BYTES = 32 * 16
ENTRY_BYTES_MAX = 1024


def open_store(path: Path, **options: object) -> MmapLogStore:
    return MmapLogStore.open(
        path,
        data_file_bytes=DATA_FILE_BYTES,
        index_file_bytes=INDEX_FILE_BYTES,
        entry_bytes_max=ENTRY_BYTES_MAX,
        **options,  # type: ignore[arg-type]
    )


def make_entries(first: int, count: int, size: int = 40, term: int = 1) -> list[LogEntry]:
    # Bodies never contain zero bytes, so "the last non-zero byte" is the end of the body.
    return [
        LogEntry(index=i, term=term, data=bytes([1 + i % 250]) * size)
        for i in range(first, first + count)
    ]


def build(path: Path, entries: list[LogEntry], batch: int = 7) -> None:
    store = open_store(path)
    for start in range(0, len(entries), batch):
        store.append(entries[start : start + batch])
        store.sync()
    store.close()


# --- reading and writing the streams behind the store's back ----------------------------


class Stream:
    """The data/ or index/ stream of a closed store, as bytes at stream positions."""

    def __init__(self, directory: Path, file_bytes: int) -> None:
        self.directory = directory
        self.file_bytes = file_bytes

    def files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.name.isdigit())

    def path_at(self, position: int) -> Path:
        return self.directory / f"{position - position % self.file_bytes:020d}"

    def read(self, low: int, high: int) -> bytes:
        chunks = []
        while low < high:
            offset = low % self.file_bytes
            length = min(high - low, self.file_bytes - offset)
            with open(self.path_at(low), "rb") as file:
                file.seek(offset)
                chunks.append(file.read(length).ljust(length, b"\0"))
            low += length
        return b"".join(chunks)

    def write(self, position: int, data: bytes) -> None:
        while data:
            offset = position % self.file_bytes
            length = min(len(data), self.file_bytes - offset)
            with open(self.path_at(position), "r+b") as file:
                file.seek(offset)
                file.write(data[:length])
            position += length
            data = data[length:]

    def zero(self, low: int, high: int) -> None:
        self.write(low, bytes(high - low))

    def flip(self, position: int, bit: int = 0) -> None:
        self.write(position, bytes([self.read(position, position + 1)[0] ^ (1 << bit)]))

    @property
    def end(self) -> int:
        files = self.files()
        return int(files[-1].name) + self.file_bytes if files else 0


def data_stream(path: Path) -> Stream:
    return Stream(path / "data", DATA_FILE_BYTES)


def index_stream(path: Path) -> Stream:
    return Stream(path / "index", INDEX_FILE_BYTES)


class Slot(msgspec.Struct, frozen=True):
    index: int
    position: int
    size: int


def slots(path: Path) -> list[Slot]:
    """The index slots on disk (the store is fresh: first index 1 at slot 0)."""
    stream = index_stream(path)
    raw = stream.read(int(stream.files()[0].name), stream.end)
    found = []
    for offset in range(0, len(raw), INDEX_SLOT_BYTES):
        slot = decode_index_slot(raw, offset)
        if slot.magic:
            found.append(Slot(slot.index, slot.position, slot.size))
    return found


def written_end(path: Path) -> int:
    stream = data_stream(path)
    raw = stream.read(0, stream.end)
    return len(raw.rstrip(b"\0"))


def copy_of(template: Path, target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(template, target)
    return target


def reopen_and_check(path: Path, entries: list[LogEntry]) -> MmapLogStore:
    store = open_store(path)
    assert store.first_index == 1
    assert store.entries(1, store.last_index + 1) == entries[: store.last_index]
    return store


# --- torn tails ------------------------------------------------------------------------


class Record(msgspec.Struct, frozen=True):
    is_entry: bool
    position: int
    nonzero_end: int
    """Where the record's non-zero bytes end (entry bodies hold no zero bytes)."""


def records(path: Path, entries: list[LogEntry]) -> list[Record]:
    """Each entry and blank record of the data stream, in stream order."""
    found: list[Record] = []
    previous_end = 0
    stream = data_stream(path)
    for slot, entry in zip(slots(path), entries, strict=True):
        if slot.position != previous_end:  # a blank filled the rest of the file
            blank = stream.read(previous_end, previous_end + 8)
            assert BLANK.unpack(blank)[0] == BLANK_MAGIC
            found.append(Record(False, previous_end, previous_end + len(blank.rstrip(b"\0"))))
        body_end = slot.position + ENTRY_HEADER_BYTES + len(entry.data)
        found.append(Record(True, slot.position, body_end))
        previous_end = slot.position + slot.size
    return found


def edge_cuts(found: list[Record], low: int, high: int) -> list[int]:
    """Offsets in [low, high] to cut at: every byte of each record's first 64 bytes (its
    header, or a whole blank) and last 8, every 8th byte of the bodies between. The middle
    of a body behaves the same at every byte; this keeps fsync-bound tests quick."""
    cuts = set(range(low, high + 1, 8)) | {high}
    for record in found:
        cuts |= set(range(record.position, record.position + 64))
        cuts |= set(range(record.nonzero_end - 8, record.nonzero_end + 1))
    return sorted(cut for cut in cuts if low <= cut <= high)


def check_zeroed_from(template: Path, work: Path, entries: list[LogEntry], cut: int) -> None:
    """Zero the data stream from `cut` to the end of what was written, reopen, and check
    that exactly the complete entries before `cut` survive and the rest is reported."""
    path = copy_of(template, work)
    end = written_end(path)
    stream = data_stream(path)
    stream.zero(cut, end)
    kept = 0
    stop = end
    for record in records(template, entries):
        if cut < record.nonzero_end:
            stop = record.position
            break
        kept += record.is_entry
    expected_dropped = len(stream.read(stop, end).rstrip(b"\0"))
    store = open_store(path)
    try:
        assert store.last_index == kept, f"cut at {cut}"
        assert store.entries(1, kept + 1) == entries[:kept]
        assert store.recovery.torn_bytes_dropped == expected_dropped, f"cut at {cut}"
        expected_file = str(stream.path_at(stop)) if expected_dropped else None
        assert store.recovery.torn_file == expected_file
        assert store.recovery.entries_found == kept
    finally:
        store.close()
    # The torn bytes and their index slots are gone for good.
    assert stream.read(stop, end) == bytes(end - stop)
    assert [slot.index for slot in slots(path)] == list(range(1, kept + 1))
    if cut % 5:
        return  # the rest is slower and needs no every-byte coverage
    store = open_store(path)
    try:
        assert store.recovery.torn_bytes_dropped == 0
        assert store.last_index == kept
        store.append(make_entries(kept + 1, 2, size=300))
        store.sync()
    finally:
        store.close()
    store = open_store(path)
    assert store.last_index == kept + 2
    assert store.entry(kept + 2) == make_entries(kept + 2, 1, size=300)[0]
    store.close()


def test_zeroing_the_tail_at_every_byte_keeps_exactly_the_complete_entries(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 12)
    build(template, entries)
    first_cut = slots(template)[-3].position
    for cut in range(first_cut, written_end(template) + 1):
        check_zeroed_from(template, tmp_path / "work", entries, cut)


def test_zeroing_the_tail_across_a_blank_padded_rollover(tmp_path: Path) -> None:
    template = tmp_path / "template"
    # 37 entries of 104 bytes leave 248 bytes in file 0: entry 38 (300 bytes of body)
    # does not fit, so a blank fills file 0 and entry 38 starts file 1.
    entries = [*make_entries(1, 37, size=56), *make_entries(38, 1, size=300)]
    build(template, entries)
    assert [slot.position for slot in slots(template)][-1] == DATA_FILE_BYTES
    first_cut = slots(template)[-2].position
    for cut in edge_cuts(records(template, entries), first_cut, written_end(template)):
        check_zeroed_from(template, tmp_path / "work", entries, cut)


def test_ftruncated_last_data_file_is_refilled_and_its_tail_cut(tmp_path: Path) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 12)
    build(template, entries)
    data_file = data_stream(template).files()[-1]
    first_length = slots(template)[-3].position
    lengths = edge_cuts(records(template, entries), first_length, written_end(template))
    for length in [0, *lengths]:
        path = copy_of(template, tmp_path / "work")
        os.truncate(path / "data" / data_file.name, length)
        complete = [s for s in slots(path) if s.position + ENTRY_HEADER_BYTES + 40 <= length]
        store = open_store(path)
        try:
            assert store.last_index == len(complete), f"length {length}"
            assert store.entries(1, len(complete) + 1) == entries[: len(complete)]
        finally:
            store.close()
        assert (path / "data" / data_file.name).stat().st_size == DATA_FILE_BYTES


def test_entries_exactly_filling_a_file_need_no_blank(tmp_path: Path) -> None:
    path = tmp_path / "log"
    body = DATA_FILE_BYTES // 8 - ENTRY_HEADER_BYTES
    entries = make_entries(1, 8, size=body)
    build(path, entries, batch=8)
    stream = data_stream(path)
    assert len(stream.files()) == 1
    assert written_end(path) == DATA_FILE_BYTES
    store = open_store(path)
    assert store.last_index == 8
    assert store.recovery.torn_bytes_dropped == 0
    store.append(make_entries(9, 1, size=body))
    store.close()
    assert [slot.position for slot in slots(path)][-2:] == [DATA_FILE_BYTES - 512, DATA_FILE_BYTES]
    store = reopen_and_check(path, make_entries(1, 9, size=body))
    assert store.last_index == 9
    store.close()


def test_blank_padding_fills_the_file_and_the_entry_starts_the_next(tmp_path: Path) -> None:
    path = tmp_path / "log"
    entries = [*make_entries(1, 3, size=1000), *make_entries(4, 1, size=1000)]
    store = open_store(path)
    store.append(entries)
    store.sync()
    store.close()
    size = entry_size(1000)
    blank_position = 3 * size
    stream = data_stream(path)
    magic, blank_bytes = BLANK.unpack(stream.read(blank_position, blank_position + 8))
    assert (magic, blank_bytes) == (BLANK_MAGIC, DATA_FILE_BYTES - blank_position)
    assert stream.read(blank_position + 8, DATA_FILE_BYTES) == bytes(blank_bytes - 8)
    assert slots(path)[3] == Slot(4, DATA_FILE_BYTES, size)
    store = reopen_and_check(path, entries)
    assert store.last_index == 4
    store.close()


# --- flipped bits ----------------------------------------------------------------------


def test_a_flipped_bit_in_the_middle_is_corruption_on_read_naming_file_and_offset(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 60)
    build(template, entries)
    victim = slots(template)[29]  # entry 30, in the middle of the second data file
    for byte in [0, 5, 12, 20, 27, 33, 37, 41, 45, 47, 48, 70, 87]:
        path = copy_of(template, tmp_path / "work")
        data_stream(path).flip(victim.position + byte, bit=byte % 8)
        store = open_store(path)
        try:
            assert store.last_index == 60
            assert store.recovery.torn_bytes_dropped == 0
            with pytest.raises(CorruptLogError) as raised:
                store.entry(30)
            assert raised.value.path == str(data_stream(path).path_at(victim.position))
            assert raised.value.offset == victim.position % DATA_FILE_BYTES
            with pytest.raises(CorruptLogError):
                store.entries(1, 61)
            with pytest.raises(CorruptLogError):
                list(store.iter_entries(25, 35))
            if byte < ENTRY_HEADER_BYTES - 8:  # the fields the chain crc covers
                with pytest.raises(CorruptLogError):
                    store.term(30)
            assert store.entries(31, 61) == entries[30:]
        finally:
            store.close()


def test_a_flipped_bit_in_the_last_entry_is_cut_off_as_a_torn_tail(tmp_path: Path) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 20)
    build(template, entries)
    last = slots(template)[-1]
    for byte in range(ENTRY_HEADER_BYTES + 40):
        path = copy_of(template, tmp_path / "work")
        stream = data_stream(path)
        stream.flip(last.position + byte, bit=(byte * 3) % 8)
        remains = len(stream.read(last.position, last.position + last.size).rstrip(b"\0"))
        store = open_store(path)
        try:
            assert store.last_index == 19, f"flip at byte {byte}"
            assert store.entries(1, 20) == entries[:19]
            assert store.recovery.torn_bytes_dropped == remains
            assert store.recovery.torn_file == str(stream.path_at(last.position))
        finally:
            store.close()


def test_damage_followed_by_valid_entries_is_corruption_at_open(tmp_path: Path) -> None:
    """With the index tail lost, open parses the data across the damage and must refuse."""
    template = tmp_path / "template"
    entries = make_entries(1, 30)
    build(template, entries)
    victim = slots(template)[24]
    for damage in ("flip", "zero"):
        path = copy_of(template, tmp_path / "work")
        index_stream(path).zero(20 * INDEX_SLOT_BYTES, 30 * INDEX_SLOT_BYTES)
        if damage == "flip":
            data_stream(path).flip(victim.position + 60)
        else:
            data_stream(path).zero(victim.position, victim.position + victim.size)
        with pytest.raises(CorruptLogError) as raised:
            open_store(path)
        assert raised.value.path == str(data_stream(path).path_at(victim.position))
        assert raised.value.offset == victim.position % DATA_FILE_BYTES


def test_a_flipped_blank_before_good_entries_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    entries = make_entries(1, 8, size=1000)
    build(path, entries, batch=8)
    index_stream(path).zero(0, index_stream(path).end)  # force open to parse all the data
    blank_position = 3 * entry_size(1000)
    data_stream(path).flip(blank_position + 5)
    with pytest.raises(CorruptLogError) as raised:
        open_store(path)
    assert raised.value.offset == blank_position


def test_a_flipped_index_slot_is_rebuilt_from_the_data_on_read_and_at_open(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 40)
    build(template, entries)
    path = copy_of(template, tmp_path / "middle")
    index_stream(path).flip(10 * INDEX_SLOT_BYTES + 6)  # entry 11's position
    store = open_store(path)
    try:
        assert store.entry(11) == entries[10]
        assert store.term(11) == 1
    finally:
        store.close()
    assert slots(path) == slots(template)
    path = copy_of(template, tmp_path / "tail")
    index_stream(path).flip(39 * INDEX_SLOT_BYTES + 25)  # entry 40's term
    store = reopen_and_check(path, entries)
    assert store.last_index == 40
    store.close()
    assert slots(path) == slots(template)


def test_index_holes_below_the_last_good_slot_are_healed_on_read(tmp_path: Path) -> None:
    """A crash can lose unflushed index pages out of order: a hole, then slots that survived."""
    template = tmp_path / "template"
    entries = make_entries(1, 60)
    build(template, entries)
    path = copy_of(template, tmp_path / "hole")
    index_stream(path).zero(20 * INDEX_SLOT_BYTES, 45 * INDEX_SLOT_BYTES)
    store = open_store(path)
    try:
        assert store.last_index == 60
        assert store.entry(30) == entries[29]  # walks the data from entry 20
        assert store.entries(1, 61) == entries
        store.sync()
    finally:
        store.close()
    assert slots(path) == slots(template)


def test_an_index_hole_over_damaged_data_is_corruption_naming_the_data(tmp_path: Path) -> None:
    template = tmp_path / "template"
    entries = make_entries(1, 60)
    build(template, entries)
    path = copy_of(template, tmp_path / "hole")
    index_stream(path).zero(20 * INDEX_SLOT_BYTES, 45 * INDEX_SLOT_BYTES)
    victim = slots(template)[25]  # entry 26
    data_stream(path).flip(victim.position + 10)
    store = open_store(path)
    try:
        assert store.entry(25) == entries[24]
        with pytest.raises(CorruptLogError) as raised:
            store.entry(30)
        assert raised.value.path == str(data_stream(path).path_at(victim.position))
        assert raised.value.offset == victim.position % DATA_FILE_BYTES
    finally:
        store.close()


# --- the index ------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["zeroed", "ftruncated", "deleted", "all deleted", "garbage"])
def test_an_index_that_lost_its_tail_is_rebuilt_from_the_data(tmp_path: Path, loss: str) -> None:
    path = tmp_path / "log"
    entries = make_entries(1, 40)
    build(path, entries)
    original = slots(path)
    stream = index_stream(path)
    last_file = stream.files()[-1]
    if loss == "zeroed":
        stream.zero(33 * INDEX_SLOT_BYTES, 40 * INDEX_SLOT_BYTES)
    elif loss == "ftruncated":
        os.truncate(last_file, 100)
    elif loss == "deleted":
        last_file.unlink()
    elif loss == "all deleted":
        for file in stream.files():
            file.unlink()
    else:
        stream.write(36 * INDEX_SLOT_BYTES, b"\x5a" * (4 * INDEX_SLOT_BYTES))
    store = reopen_and_check(path, entries)
    assert store.last_index == 40
    assert store.recovery.torn_bytes_dropped == 0
    store.close()
    assert slots(path) == original


def test_index_slots_past_the_end_of_the_data_are_zeroed(tmp_path: Path) -> None:
    path = tmp_path / "log"
    entries = make_entries(1, 20)
    build(path, entries)
    last = slots(path)[-5]
    data_stream(path).zero(last.position, written_end(path))  # lose the last 5 entries
    store = reopen_and_check(path, entries)
    assert store.last_index == 15
    assert store.recovery.torn_bytes_dropped == 0  # a clean end: nothing non-zero was cut
    store.close()
    assert [slot.index for slot in slots(path)] == list(range(1, 16))


# --- truncations and crashes inside them --------------------------------------------------


def test_crash_between_the_meta_write_and_the_unlinks_of_truncate_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    entries = make_entries(1, 120)
    build(path, entries)
    data_files_before = data_stream(path).files()
    store = open_store(path)
    real_unlink = os.unlink

    def failing_unlink(target: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "injected crash before unlink")

    monkeypatch.setattr(os, "unlink", failing_unlink)
    with pytest.raises(StorageError):
        store.truncate_prefix(70)
    monkeypatch.setattr(os, "unlink", real_unlink)
    assert store.first_index == 70  # the meta was written: the truncation took effect
    store.close()
    assert data_stream(path).files() == data_files_before  # nothing was deleted
    store = open_store(path)
    try:
        assert (store.first_index, store.last_index) == (70, 120)
        assert store.entries(70, 121) == entries[69:]
    finally:
        store.close()
    first_kept_position = slots(path)[0].position
    assert slots(path)[0].index >= 1
    for file in data_stream(path).files():
        assert int(file.name) + DATA_FILE_BYTES > first_kept_position
    assert len(data_stream(path).files()) < len(data_files_before)


def test_crash_between_the_meta_write_and_the_unlinks_of_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    build(path, make_entries(1, 50))
    store = open_store(path)

    def failing_unlink(target: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "injected crash before unlink")

    monkeypatch.setattr(os, "unlink", failing_unlink)
    with pytest.raises(StorageError):
        store.reset(500)
    monkeypatch.undo()
    with pytest.raises(StorageError):
        store.append(make_entries(500, 1))  # half done: only a reopen may go on
    store.close()
    store = open_store(path)
    try:
        assert (store.first_index, store.last_index) == (500, 499)
        store.append(make_entries(500, 3))
        store.sync()
    finally:
        store.close()
    store = open_store(path)
    assert store.entries(500, 503) == make_entries(500, 3)
    store.close()
    assert len(data_stream(path).files()) == 1


def test_crash_inside_truncate_suffix_is_finished_at_open(tmp_path: Path) -> None:
    """The meta says a cut is pending; the zeroing reached only part of the disk."""
    path = tmp_path / "log"
    entries = make_entries(1, 40)
    build(path, entries)
    cut = slots(path)[19]  # keep 1..19
    meta = decode_meta((path / "meta").read_bytes())
    assert not isinstance(meta, str)
    pending = msgspec.structs.replace(
        meta, cut_pending=True, cut_last_kept=19, cut_data_position=cut.position
    )
    atomic_write(path / "meta", encode_meta(pending))
    data_stream(path).zero(cut.position, cut.position + 100)  # the first page got its zeros
    store = open_store(path)
    try:
        assert store.last_index == 19
        assert store.entries(1, 20) == entries[:19]
    finally:
        store.close()
    meta_after = decode_meta((path / "meta").read_bytes())
    assert not isinstance(meta_after, str) and not meta_after.cut_pending
    assert written_end(path) == cut.position


def test_without_a_pending_cut_the_same_hole_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    build(path, make_entries(1, 40))
    cut = slots(path)[19]
    data_stream(path).zero(cut.position, cut.position + 100)
    index_stream(path).zero(19 * INDEX_SLOT_BYTES, 40 * INDEX_SLOT_BYTES)
    with pytest.raises(CorruptLogError):
        open_store(path)


def test_meta_first_index_past_the_data_is_corruption_but_an_empty_log_is_legal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lost"
    build(path, make_entries(1, 60))
    store = open_store(path)
    store.truncate_prefix(40)
    store.close()
    first = slots(path)[0]
    data_stream(path).zero(first.position, written_end(path))
    with pytest.raises(CorruptLogError) as raised:
        open_store(path)
    assert raised.value.path == str(path / "meta")

    path = tmp_path / "empty"
    build(path, make_entries(1, 60))
    store = open_store(path)
    store.truncate_prefix(61)
    store.close()
    store = open_store(path)
    assert (store.first_index, store.last_index) == (61, 60)
    store.reset(1000)
    store.close()
    store = open_store(path)
    assert (store.first_index, store.last_index) == (1000, 999)
    store.close()


def test_truncate_suffix_to_empty_then_reopen_is_not_mistaken_for_data_loss(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    build(path, make_entries(1, 30))
    store = open_store(path)
    store.truncate_prefix(10)
    store.truncate_suffix(9)
    store.close()
    store = open_store(path)
    assert (store.first_index, store.last_index) == (10, 9)
    store.append(make_entries(10, 2, term=5))
    store.close()
    store = open_store(path)
    assert store.entries(10, 12) == make_entries(10, 2, term=5)
    store.close()


def test_damaged_or_missing_meta_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    build(path, make_entries(1, 5))
    meta = (path / "meta").read_bytes()
    (path / "meta").write_bytes(meta[:10] + bytes([meta[10] ^ 4]) + meta[11:])
    with pytest.raises(CorruptLogError):
        open_store(path)
    (path / "meta").unlink()
    with pytest.raises(CorruptLogError):
        open_store(path)


def test_a_gap_in_the_data_files_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    build(path, make_entries(1, 150))
    files = data_stream(path).files()
    assert len(files) >= 3
    files[1].unlink()
    with pytest.raises(CorruptLogError):
        open_store(path)


# --- a full disk ----------------------------------------------------------------------


def fail_fallocate_after(monkeypatch: pytest.MonkeyPatch, calls_allowed: int) -> None:
    real = os.posix_fallocate
    calls = 0

    def fallocate(descriptor: int, offset: int, length: int) -> None:
        nonlocal calls
        calls += 1
        if calls > calls_allowed:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real(descriptor, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)


@pytest.mark.parametrize("calls_allowed", [0, 1])
def test_disk_full_fails_the_append_cleanly_and_appends_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls_allowed: int
) -> None:
    """calls_allowed=0: the data file cannot be made; 1: the data file can, the index not."""
    path = tmp_path / "log"
    entries = [*make_entries(1, 30), *make_entries(31, 15, size=100)]
    store = open_store(path)
    store.append(entries[:30])  # 30 * 88 bytes: most of data file 0, index files 0 and 1
    store.sync()
    files_before = (data_stream(path).files(), index_stream(path).files())
    fail_fallocate_after(monkeypatch, calls_allowed)
    with pytest.raises(DiskFullError):
        store.append(entries[30:45])  # needs data file 1 and index file 2
    assert store.last_index == 30
    assert (data_stream(path).files(), index_stream(path).files()) == files_before
    assert store.entries(1, 31) == entries[:30]
    store.append(entries[30:32])  # fits the files that exist
    with pytest.raises(DiskFullError):
        store.append(entries[32:45])
    monkeypatch.undo()
    store.append(entries[32:45])
    store.sync()
    store.close()
    store = reopen_and_check(path, entries)
    assert store.last_index == 45
    store.close()


def test_disk_full_while_creating_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log"
    fail_fallocate_after(monkeypatch, 0)
    store = open_store(path)
    with pytest.raises(DiskFullError):
        store.append(make_entries(1, 1))
    assert data_stream(path).files() == []
    monkeypatch.undo()
    store.append(make_entries(1, 1))
    store.close()


def test_a_failed_write_stops_appends_until_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    store = open_store(path)
    store.append(make_entries(1, 5))
    store.sync()

    def failing_pwrite(*args: object) -> int:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    monkeypatch.setattr(os, "pwritev", failing_pwrite)
    with pytest.raises(StorageError):
        store.append(make_entries(6, 3))
    monkeypatch.undo()
    with pytest.raises(StorageError, match="reopen"):
        store.append(make_entries(6, 1))
    assert store.entries(1, 6) == make_entries(1, 5)
    store.close()
    store = reopen_and_check(path, make_entries(1, 5))
    assert store.last_index == 5
    store.close()


# --- options and policies -------------------------------------------------------------


def test_bad_options_raise_value_errors(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with pytest.raises(ValueError, match="multiple of 32"):
        MmapLogStore.open(path, data_file_bytes=4096, index_file_bytes=100, entry_bytes_max=10)
    with pytest.raises(ValueError, match="must fit one data file"):
        MmapLogStore.open(path, data_file_bytes=4096, index_file_bytes=512, entry_bytes_max=4096)
    with pytest.raises(ValueError, match="multiple of 8"):
        MmapLogStore.open(path, data_file_bytes=4100, index_file_bytes=512, entry_bytes_max=10)
    with pytest.raises(ValueError):
        MmapLogStore.open(path, sync_policy="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must fit one data file"):
        MmapLogStore.open(path, entry_bytes_max=64 * 1024 * 1024)
    open_store(path).close()
    with pytest.raises(ValueError, match="same sizes"):
        MmapLogStore.open(path, data_file_bytes=8192, index_file_bytes=512, entry_bytes_max=10)


@pytest.mark.parametrize("policy", list(SyncPolicy))
def test_sync_policies_decide_when_mappings_are_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: SyncPolicy
) -> None:
    flushed: list[tuple[int, int]] = []
    from quorumlog.storage import mmap_files

    real_flush = mmap_files.MappedFileList.flush

    def counting_flush(self: mmap_files.MappedFileList, low: int, high: int) -> None:
        flushed.append((low, high))
        real_flush(self, low, high)

    monkeypatch.setattr(mmap_files.MappedFileList, "flush", counting_flush)
    store = open_store(tmp_path / "log", sync_policy=policy)
    flushed.clear()  # open flushes what recovery repaired
    store.append(make_entries(1, 3))
    after_append = len(flushed)
    store.sync()
    after_sync = len(flushed)
    store.close()
    # One msync for the data; the index lags until enough slots wait (see the next test).
    assert after_append == (1 if policy is SyncPolicy.EVERY_APPEND else 0)
    assert after_sync == (1 if policy is SyncPolicy.EXPLICIT else after_append)


def test_sync_flushes_the_index_once_its_lag_bound_is_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quorumlog.storage import mmap_files, mmap_store

    flushed: list[Path] = []
    real_flush = mmap_files.MappedFileList.flush

    def recording_flush(self: mmap_files.MappedFileList, low: int, high: int) -> None:
        flushed.append(self.directory)
        real_flush(self, low, high)

    monkeypatch.setattr(mmap_files.MappedFileList, "flush", recording_flush)
    monkeypatch.setattr(mmap_store, "INDEX_FLUSH_LAG_BYTES", 10 * INDEX_SLOT_BYTES)
    store = open_store(tmp_path / "log")
    flushed.clear()
    store.append(make_entries(1, 10))
    store.sync()
    assert flushed == [tmp_path / "log" / "data"]
    store.append(make_entries(11, 1))
    store.sync()
    assert flushed[1:] == [tmp_path / "log" / "data", tmp_path / "log" / "index"]
    store.close()


def test_default_entry_limit_is_what_a_data_file_holds(tmp_path: Path) -> None:
    store = MmapLogStore.open(tmp_path / "small", data_file_bytes=4096, index_file_bytes=512)
    store.append([LogEntry(index=1, term=1, data=b"x" * (4096 - ENTRY_HEADER_BYTES))])
    with pytest.raises(EntryTooLargeError):
        store.append([LogEntry(index=2, term=1, data=b"x" * (4096 - ENTRY_HEADER_BYTES + 1))])
    store.close()
    store = MmapLogStore.open(tmp_path / "default", data_file_bytes=1024 * 1024)
    store.close()


def test_the_index_lives_in_files_not_in_python_memory(tmp_path: Path) -> None:
    import tracemalloc

    store = MmapLogStore.open(
        tmp_path / "log",
        data_file_bytes=1024 * 1024,
        index_file_bytes=1024 * 1024,
        entry_bytes_max=1024,
        sync_policy=SyncPolicy.NEVER,
    )
    batches = [make_entries(1 + 256 * n, 256, size=20) for n in range(40)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for batch in batches:
        store.append(batch)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    store.close()
    assert (after - before) / (256 * 40) < 32


def test_the_store_is_a_log_store(tmp_path: Path) -> None:
    from quorumlog.storage import LogStore

    store = open_store(tmp_path / "log")
    assert isinstance(store, LogStore)
    store.close()
    store.close()  # closing twice is harmless
    with pytest.raises(StoreClosedError):
        store.append(make_entries(1, 1))
    with pytest.raises(StoreClosedError):
        store.entry(1)


def record_durability_events(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Log flushes (per directory) and meta writes in the order the store makes them."""
    from quorumlog.storage import mmap_files, mmap_store

    real_flush = mmap_files.MappedFileList.flush
    real_zero = mmap_files.MappedFileList.zero
    real_atomic_write = atomic_write

    def flush(self: mmap_files.MappedFileList, low: int, high: int) -> None:
        events.append(f"flush {self.directory.name}")
        real_flush(self, low, high)

    def zero(self: mmap_files.MappedFileList, low: int, high: int) -> None:
        events.append(f"zero {self.directory.name}")
        real_zero(self, low, high)

    def recording_atomic_write(path: Path, data: bytes) -> None:
        meta = decode_meta(data)
        assert not isinstance(meta, str)
        events.append("meta cut pending" if meta.cut_pending else "meta")
        real_atomic_write(path, data)

    monkeypatch.setattr(mmap_files.MappedFileList, "flush", flush)
    monkeypatch.setattr(mmap_files.MappedFileList, "zero", zero)
    monkeypatch.setattr(mmap_store, "atomic_write", recording_atomic_write)


def test_truncate_prefix_makes_the_data_durable_before_the_meta_claims_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "log")
    store.append(make_entries(1, 20))  # not synced
    events: list[str] = []
    record_durability_events(monkeypatch, events)
    store.truncate_prefix(10)
    store.close()
    assert "meta" in events
    assert "flush data" in events[: events.index("meta")]


def test_truncate_suffix_records_the_cut_before_zeroing_and_clears_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "log")
    store.append(make_entries(1, 20))
    store.sync()
    events: list[str] = []
    record_durability_events(monkeypatch, events)
    store.truncate_suffix(12)
    store.close()
    assert events[0] == "meta cut pending"
    assert events[-1] == "meta"
    middle = events[1:-1]
    assert {"zero data", "zero index", "flush data", "flush index"} <= set(middle)
    assert middle.index("zero data") < middle.index("flush data")


def test_open_makes_everything_it_found_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 5: the process died without syncing but the OS lived on, so unsynced entries
    read back at open. The core counts them as persisted, so open must flush them (every
    data file they may lie in) and sync the directories before it returns."""
    from quorumlog.storage import mmap_files, mmap_store

    store = open_store(tmp_path / "log")
    store.append(make_entries(1, 150))  # several data files, none of it synced
    store.close()  # the process dies: close does not sync
    flushed: list[tuple[str, int, int]] = []
    synced_directories: list[str] = []
    real_flush = mmap_files.MappedFileList.flush
    real_fsync_directory = mmap_store.fsync_directory

    def recording_flush(self: mmap_files.MappedFileList, low: int, high: int) -> None:
        flushed.append((self.directory.name, low, high))
        real_flush(self, low, high)

    def recording_fsync_directory(directory: str | os.PathLike[str]) -> None:
        synced_directories.append(Path(directory).name)
        real_fsync_directory(directory)

    monkeypatch.setattr(mmap_files.MappedFileList, "flush", recording_flush)
    monkeypatch.setattr(mmap_store, "fsync_directory", recording_fsync_directory)
    open_store(tmp_path / "log").close()
    stream = data_stream(tmp_path / "log")
    data_end = len(stream.read(0, stream.end).rstrip(b"\0"))  # the last entry's last byte
    assert data_end > 2 * DATA_FILE_BYTES
    data_flushes = [(low, high) for name, low, high in flushed if name == "data"]
    assert any(low == 0 and high >= data_end for low, high in data_flushes), flushed
    assert {"data", "index", "log"} <= set(synced_directories)

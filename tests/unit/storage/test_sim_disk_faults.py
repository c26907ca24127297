"""SegmentLogStore on the simulated disk: bytes readable at restart but not durable (defect 5),
bit flips on read, a full disk. See test_segment_crash_points for crashes at every point."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorumlog.errors import CorruptLogError, DiskFullError
from quorumlog.storage import LogEntry, SegmentLogStore
from quorumlog.testing.sim.filesystem import SimFileSystem
from quorumlog.testing.sim.filesystem_state import SimFile

LOG = Path("/node/log")
SEGMENT_BYTES = 400


def make_entries(first: int, count: int, term: int = 1, size: int = 40) -> list[LogEntry]:
    """Data with no zero byte, so zeros on disk always mean a torn or lost write."""
    return [
        LogEntry(index=i, term=term, data=bytes([1 + (i * 7 + j) % 250 for j in range(size)]))
        for i in range(first, first + count)
    ]


def open_store(disk: SimFileSystem) -> SegmentLogStore:
    return SegmentLogStore.open(LOG, segment_bytes_max=SEGMENT_BYTES, file_system=disk)


# --- defect 5: what open finds is durable when open returns ------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_entries_found_at_restart_are_made_durable_before_open_returns(seed: int) -> None:
    """The process dies with unsynced entries that the OS still holds; the restarted store
    reads them back and the core counts them as persisted (a COMPARE may acknowledge them).
    A power loss after that must not take them."""
    disk = SimFileSystem(random.Random(seed))
    store = open_store(disk)
    entries = make_entries(1, 30)
    store.append(entries[:5])
    store.sync()
    store.append(entries[5:])  # rolls segments; the last one's tail is never synced
    disk.process_crash()  # the process dies, the OS does not

    store = open_store(disk)
    assert store.entries(1, 31) == entries  # readable, as if durable

    disk.crash(random.Random(seed), keep_unsynced=seed % 2 == 0)  # then the OS loses power
    store = open_store(disk)
    assert store.last_index == 30
    assert store.entries(1, 31) == entries
    store.close()


# --- bit flips -------------------------------------------------------------------------


def written_log(disk: SimFileSystem, count: int) -> list[LogEntry]:
    store = open_store(disk)
    entries = make_entries(1, count)
    for start in range(0, count, 4):
        store.append(entries[start : start + 4])
        store.sync()
    store.close()
    return entries


def test_bit_flips_on_read_are_detected_never_returned() -> None:
    disk = SimFileSystem(random.Random(3))
    entries = written_log(disk, 40)
    store = open_store(disk)
    disk.read_bit_flip_probability = 0.3
    caught = 0
    for _ in range(5):
        for index in range(1, 41):
            try:
                assert store.entry(index) == entries[index - 1]
            except CorruptLogError:
                caught += 1
        try:
            assert store.entries(1, 41) == entries
        except CorruptLogError:
            caught += 1
    assert caught > 20
    assert disk.bit_flips >= caught


def test_bit_flips_while_opening_raise_or_leave_the_whole_log() -> None:
    """A flip while open scans must never pass for a torn tail and cut durable entries off:
    open either raises CorruptLogError or finds every entry."""
    disk = SimFileSystem(random.Random(11))
    entries = written_log(disk, 40)
    outcomes = {"corrupt": 0, "whole": 0}
    for _ in range(200):
        disk.read_bit_flip_probability = 0.5
        try:
            store = open_store(disk)
        except CorruptLogError:
            outcomes["corrupt"] += 1
            disk.process_crash()
            continue
        disk.read_bit_flip_probability = 0.0
        assert (store.first_index, store.last_index) == (1, 40)
        assert store.entries(1, 41) == entries
        store.close()
        outcomes["whole"] += 1
    assert outcomes["corrupt"] > 0 and outcomes["whole"] > 0, outcomes


class FlipOnceDisk(SimFileSystem):
    """Flips one chosen bit in the next whole-file read of a segment, and no other."""

    def __init__(self) -> None:
        super().__init__(random.Random(0))
        self.flip_bit_at: int | None = None

    def read(self, node: SimFile, size: int, offset: int) -> bytes:
        data = super().read(node, size, offset)
        if self.flip_bit_at is None or offset != 0 or size != len(node.current):
            return data
        flipped = bytearray(data)
        flipped[self.flip_bit_at // 8] ^= 1 << (self.flip_bit_at % 8)
        self.flip_bit_at = None
        return bytes(flipped)


@pytest.mark.parametrize("data_byte", [10, 20, 38])
def test_one_flip_in_the_last_entry_is_not_taken_for_a_torn_tail(data_byte: int) -> None:
    """The last entry's data ends in zeros. A flip among them, with zeros after it, looks
    like a torn write that was zero-filled from there on. On one read at open, it must not
    get the entry cut off: open reads a tail twice before cutting it, and refuses when the
    reads disagree."""
    disk = FlipOnceDisk()
    store = open_store(disk)
    entries = [
        LogEntry(index=1, term=1, data=b"x" * 40),
        LogEntry(index=2, term=1, data=b"y" * 10 + bytes(30)),
    ]
    store.append(entries)
    store.sync()
    disk.process_crash()
    disk.flip_bit_at = (64 + 24 + data_byte) * 8 + 2
    with pytest.raises(CorruptLogError, match="disagree"):
        open_store(disk)
    disk.process_crash()
    store = open_store(disk)  # the disk reads true again: nothing was cut
    assert store.entries(1, 3) == entries
    store.close()


# --- a full disk -----------------------------------------------------------------------


@pytest.mark.parametrize("room_bytes", [0, 1, 24, 63, 64, 200, 700])
def test_a_full_disk_fails_the_append_and_the_store_goes_on_once_space_is_freed(
    room_bytes: int,
) -> None:
    disk = SimFileSystem(random.Random(room_bytes))
    entries = make_entries(1, 40)
    store = open_store(disk)
    store.append(entries[:10])
    store.sync()
    disk.bytes_max = disk.bytes_used + room_bytes
    acknowledged = 10
    with pytest.raises(DiskFullError):
        for start in range(10, 40, 3):
            store.append(entries[start : start + 3])
            store.sync()
            acknowledged = start + 3
    assert store.last_index == acknowledged
    assert store.entries(1, acknowledged + 1) == entries[:acknowledged]
    assert disk.bytes_used <= disk.bytes_max
    with pytest.raises(DiskFullError):
        store.append(entries[acknowledged : acknowledged + 3])  # still full: still refused
    disk.bytes_max = None  # space is freed
    store.append(entries[acknowledged:])
    store.sync()
    disk.crash(random.Random(room_bytes), keep_unsynced=False)
    store = open_store(disk)
    assert store.entries(1, 41) == entries
    assert store.recovery.torn_bytes_dropped == 0
    store.close()


def test_a_full_disk_during_truncate_prefix_changes_nothing() -> None:
    disk = SimFileSystem(random.Random(0))
    entries = written_log(disk, 30)
    store = open_store(disk)
    disk.bytes_max = disk.bytes_used  # the meta's temporary file finds no room
    with pytest.raises(DiskFullError):
        store.truncate_prefix(20)
    assert (store.first_index, store.last_index) == (1, 30)
    disk.bytes_max = None
    store.truncate_prefix(20)
    disk.crash(random.Random(0), keep_unsynced=False)
    store = open_store(disk)
    assert (store.first_index, store.last_index) == (20, 30)
    assert store.entries(20, 31) == entries[19:]
    store.close()


# --- the example in the simulated disk's docs ----------------------------------------------


def test_the_documented_example_runs() -> None:
    from quorumlog.testing.sim import filesystem

    docs = filesystem.__doc__ or ""
    example = docs[docs.index("    import random") :]
    code = "\n".join(line[4:] for line in example.splitlines())
    exec(compile(code, "SimFileSystem example", "exec"), {})

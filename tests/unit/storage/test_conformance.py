"""The contract every log store keeps (see quorumlog.storage.base), checked for all three."""

from __future__ import annotations

import pytest

from quorumlog.storage import (
    EntryTooLargeError,
    EntryType,
    InvalidTruncateError,
    LogEntry,
    LogIndexError,
    NonContiguousAppendError,
)
from tests.unit.storage.conftest import ENTRY_BYTES_MAX, StoreHarness


def make_entries(first: int, count: int, term: int = 1, size: int = 10) -> list[LogEntry]:
    return [
        LogEntry(index=i, term=term, data=bytes([i % 251]) * size)
        for i in range(first, first + count)
    ]


def test_empty_store_has_last_index_below_first(harness: StoreHarness) -> None:
    store = harness.open()
    assert store.first_index == 1
    assert store.last_index == 0
    with pytest.raises(LogIndexError):
        store.entry(1)
    assert store.entries(1, 1) == []
    store.close()


def test_append_then_read_back_every_field(harness: StoreHarness) -> None:
    store = harness.open()
    entries = [
        LogEntry(index=1, term=1, data=b"a"),
        LogEntry(index=2, term=1, data=b"", type=EntryType.NO_OP),
        LogEntry(index=3, term=2, data=b"x" * 700, type=EntryType.CONFIGURATION),
    ]
    store.append(entries)
    store.sync()
    assert store.last_index == 3
    assert [store.entry(i) for i in range(1, 4)] == entries
    assert store.entries(1, 4) == entries
    assert list(store.iter_entries(2, 4)) == entries[1:]
    assert [store.term(i) for i in range(1, 4)] == [1, 1, 2]
    store = harness.reopen(store)
    assert store.entries(1, 4) == entries
    store.close()


def test_many_entries_roll_over_files_and_survive_reopen(harness: StoreHarness) -> None:
    store = harness.open()
    entries = make_entries(1, 300, size=50)
    for start in range(0, 300, 17):
        store.append(entries[start : start + 17])
        store.sync()
    store = harness.reopen(store)
    assert store.first_index == 1
    assert store.last_index == 300
    assert store.entries(1, 301) == entries
    store.close()


def test_non_contiguous_append_raises_and_changes_nothing(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 3))
    with pytest.raises(NonContiguousAppendError):
        store.append(make_entries(5, 1))
    with pytest.raises(NonContiguousAppendError):
        store.append([LogEntry(index=4, term=1), LogEntry(index=6, term=1)])
    assert store.last_index == 3
    store.append(make_entries(4, 1))
    assert store.last_index == 4
    store.close()


def test_oversized_entry_raises_and_changes_nothing(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 2))
    with pytest.raises(EntryTooLargeError):
        store.append([LogEntry(index=3, term=1, data=b"z" * (ENTRY_BYTES_MAX + 1))])
    assert store.last_index == 2
    store.append([LogEntry(index=3, term=1, data=b"z" * ENTRY_BYTES_MAX)])
    assert store.entry(3).data == b"z" * ENTRY_BYTES_MAX
    store.close()


def test_reads_out_of_range_raise(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 5))
    for bad in (0, 6, -1):
        with pytest.raises(LogIndexError):
            store.entry(bad)
    with pytest.raises(LogIndexError):
        store.entries(3, 7)
    with pytest.raises(LogIndexError):
        store.term(6)
    store.close()


def test_truncate_suffix_then_append_new_terms(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 100, term=1))
    store.sync()
    store.truncate_suffix(40)
    assert store.last_index == 40
    replacement = make_entries(41, 10, term=2, size=33)
    store.append(replacement)
    store.sync()
    store = harness.reopen(store)
    assert store.last_index == 50
    assert store.entries(41, 51) == replacement
    assert store.entries(1, 41) == make_entries(1, 40, term=1)
    store.truncate_suffix(0)
    assert store.last_index == 0
    store = harness.reopen(store)
    assert store.last_index == 0
    store.close()


def test_truncate_prefix_keeps_the_rest(harness: StoreHarness) -> None:
    store = harness.open()
    entries = make_entries(1, 200, size=40)
    store.append(entries)
    store.sync()
    store.truncate_prefix(120)
    assert store.first_index == 120
    with pytest.raises(LogIndexError):
        store.entry(119)
    store = harness.reopen(store)
    assert store.first_index == 120
    assert store.last_index == 200
    assert store.entries(120, 201) == entries[119:]
    with pytest.raises(InvalidTruncateError):
        store.truncate_prefix(100)
    store.close()


def test_truncate_prefix_to_end_then_append(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 10))
    store.truncate_prefix(11)
    assert (store.first_index, store.last_index) == (11, 10)
    store.append(make_entries(11, 2))
    store = harness.reopen(store)
    assert (store.first_index, store.last_index) == (11, 12)
    store.close()


def test_reset_moves_an_empty_log_forward(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 30))
    store.sync()
    store.reset(1000)
    assert (store.first_index, store.last_index) == (1000, 999)
    store.append(make_entries(1000, 3, term=7))
    store.sync()
    store = harness.reopen(store)
    assert (store.first_index, store.last_index) == (1000, 1002)
    assert store.term(1001) == 7
    store.close()


def test_truncate_suffix_below_first_index_raises(harness: StoreHarness) -> None:
    store = harness.open()
    store.append(make_entries(1, 10))
    store.truncate_prefix(5)
    with pytest.raises(InvalidTruncateError):
        store.truncate_suffix(2)
    assert (store.first_index, store.last_index) == (5, 10)
    store.close()

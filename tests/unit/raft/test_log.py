"""The core's view of the log: stable entries from the store, an unstable tail in memory."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.raft.log import RaftLog
from quorumlog.storage import LogEntry, MemoryLogStore


class CountingStore(MemoryLogStore):
    """Counts the entries the core reads from the store."""

    def __init__(self) -> None:
        super().__init__()
        self.entries_read = 0

    def entries(self, low: int, high: int) -> list[LogEntry]:
        self.entries_read += high - low
        return super().entries(low, high)


def test_a_byte_budget_stops_reading_the_store_early() -> None:
    store = CountingStore()
    store.append([LogEntry(index=i, term=1, data=b"x" * 1000) for i in range(1, 1001)])
    log = RaftLog(store, None)
    sent = log.entries(1, 1001, bytes_max=2500)
    assert [entry.index for entry in sent] == [1, 2]
    assert store.entries_read < 100  # not the whole thousand


def test_one_entry_larger_than_the_budget_still_moves() -> None:
    store = CountingStore()
    store.append([LogEntry(index=1, term=1, data=b"x" * 5000)])
    log = RaftLog(store, None)
    assert [entry.index for entry in log.entries(1, 2, bytes_max=100)] == [1]


def test_stable_and_unstable_entries_join_in_order() -> None:
    store = MemoryLogStore()
    store.append([LogEntry(index=i, term=1, data=b"s") for i in range(1, 41)])
    log = RaftLog(store, None)
    log.append([LogEntry(index=i, term=2, data=b"u") for i in range(41, 81)])
    for budget in (None, 10, 10**6):
        got = log.entries(30, 60, bytes_max=budget)
        expected_count = 30 if budget is None or budget >= 30 else budget
        assert [e.index for e in got] == list(range(30, 30 + expected_count))
        assert all(e.term == (1 if e.index <= 40 else 2) for e in got)


# --- stable entries kept in memory until applied (RaftLog.recent) ---------------------------


class ReadCountingStore(MemoryLogStore):
    """Counts store reads (entries and terms)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def entries(self, low: int, high: int) -> list[LogEntry]:
        self.reads += 1
        return super().entries(low, high)


def entry(index: int, term: int, size: int = 10) -> LogEntry:
    return LogEntry(index=index, term=term, data=bytes([index % 251]) * size)


def test_committed_entries_come_from_memory_until_released() -> None:
    store = ReadCountingStore()
    log = RaftLog(store, None)
    written = [entry(i, 1) for i in range(1, 11)]
    log.append(written)
    store.append(written)  # what the runtime does with the Ready's entries
    log.persisted(10, 1)
    assert log.entries(1, 11) == written
    assert store.reads == 0
    log.release_through(6)
    assert log.entries(1, 11) == written  # the released part is read from the store again
    assert store.reads == 1
    assert log.recent_offset == 7


def test_an_entry_applied_before_its_own_write_returned_is_not_kept() -> None:
    store = MemoryLogStore()
    log = RaftLog(store, None)
    written = [entry(i, 1) for i in range(1, 4)]
    log.append(written)
    log.release_through(3)  # a leader may commit and apply before its own write returns
    store.append(written)
    log.persisted(3, 1)
    assert log.recent == []
    assert log.entries(1, 4) == written


def test_the_bounds_keep_only_the_newest_entries() -> None:
    from quorumlog.raft.log import RECENT_BYTES_MAX

    store = MemoryLogStore()
    log = RaftLog(store, None)
    size = RECENT_BYTES_MAX // 4
    written = [entry(i, 1, size) for i in range(1, 11)]
    log.append(written)
    store.append(written)
    log.persisted(10, 1)
    assert log.recent_bytes <= RECENT_BYTES_MAX
    assert [e.index for e in log.recent] == [7, 8, 9, 10]
    assert log.entries(1, 11) == written


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("apwrt"), st.integers(0, 12)), max_size=60))
def test_reads_agree_with_the_store_and_the_tail_whatever_was_kept(
    operations: list[tuple[str, int]],
) -> None:
    """Appends, writes (the runtime's Ready), `persisted`, releases and truncations in any
    order: every read answers what the log holds, as if nothing were kept in memory."""
    store = MemoryLogStore()
    log = RaftLog(store, None)
    truth: list[LogEntry] = []  # the log as the core sees it: truth[i] has index i + 1
    written = 0  # entries the runtime wrote (the store's last index)
    term = 1
    for operation, amount in operations:
        if operation == "a" and amount:
            new = [entry(len(truth) + 1 + k, term, amount) for k in range(amount)]
            log.append(new)
            truth.extend(new)
        elif operation == "w" and written < len(truth):
            # The runtime writes the handed-out entries (after any truncation), then says so.
            truncate, entries = log.take_unsent()
            if truncate is not None and truncate < store.last_index:
                store.truncate_suffix(truncate)
            store.append(entries)
            written = store.last_index
            if written:
                log.persisted(written, truth[written - 1].term)
        elif operation == "r":
            log.release_through(min(amount, log.persisted_index))
        elif operation == "t" and truth:
            keep = max(len(truth) - 1 - amount, 0)  # a conflict: the tail after `keep` goes
            if keep < log.released_index:
                continue  # applied entries are committed: never truncated
            log.truncate_after(keep)
            del truth[keep:]
            written = min(written, keep)
            term += 1
        elif operation == "p":
            term += 1
        assert log.last_index == len(truth)
        for low in range(1, len(truth) + 1):
            assert log.term(low) == truth[low - 1].term
        if truth:
            assert log.entries(1, len(truth) + 1) == truth
            middle = (len(truth) + 1) // 2
            assert (
                log.entries(middle, len(truth) + 1, bytes_max=3 * 12)
                == truth[middle - 1 : middle - 1 + len(log.entries(middle, len(truth) + 1, 3 * 12))]
            )
        assert log.recent_bytes == sum(len(e.data) for e in log.recent)
        assert log.recent_offset + len(log.recent) == log.unstable_offset

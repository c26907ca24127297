"""The core's view of the log: stable entries from the store, an unstable tail in memory."""

from __future__ import annotations

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

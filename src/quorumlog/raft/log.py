"""The Raft log as the core sees it: durable entries in a store, and an unstable tail.

The core never writes the store. New entries (proposals, or entries pushed by a leader)
go to the unstable tail and out through `Ready.entries`; the runtime writes them and calls
back with `persisted`, which moves the boundary. The core reads the store only below
`unstable_offset`, where no pending write or truncation can change what it reads.

Layout, low to high:  [snapshot] [stable entries from the store] [unstable entries in memory]

The newest stable entries also stay in memory (`recent`) until they are handed to the state
machine: a commit comes after the write that made an entry stable, so without them every
applied entry was read back from the store (a read, a decode and two checksums per entry:
a tenth of a busy node's CPU with 1,000 partitions). They are the very entries the store
holds (written from this memory), dropped on a truncation or a snapshot as the store's are,
and bounded per group by `RECENT_ENTRIES_MAX` and `RECENT_BYTES_MAX`; past the bound, or once
released, entries are read from the store as before.
"""

from __future__ import annotations

from typing import Protocol

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.storage.entry import LogEntry

ENTRIES_PER_READ = 32
"""Entries read from the store at a time when a byte budget may stop the read early."""
RECENT_ENTRIES_MAX = 1024
"""Stable entries a group keeps in memory at most, waiting to be applied."""
RECENT_BYTES_MAX = 1024 * 1024
"""Their data at most, per group: a thousand busy groups keep at most about a GiB."""


class LogReader(Protocol):
    """The read side of a log store (every `LogStore` is one)."""

    @property
    def first_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    def term(self, index: int) -> int: ...

    def entries(self, low: int, high: int) -> list[LogEntry]: ...


class RaftLog:
    def __init__(self, stable: LogReader, snapshot: SnapshotMeta | None) -> None:
        self.stable = stable
        self.snapshot_index = snapshot.index if snapshot else 0
        self.snapshot_term = snapshot.term if snapshot else 0
        # After a snapshot is installed the store is reset by the runtime, later; until
        # then nothing at or below the snapshot index may be read from it.
        self.first_index_floor = self.snapshot_index + 1 if snapshot else 1
        self.unstable: list[LogEntry] = []
        self.unstable_offset = max(stable.last_index + 1, self.first_index_floor)
        self.recent: list[LogEntry] = []
        """The newest stable entries, still in memory: indexes [recent_offset,
        unstable_offset). Kept until released (handed to apply) or over the bounds."""
        self.recent_offset = self.unstable_offset
        self.recent_bytes = 0
        self.released_index = 0
        """The highest index handed to the state machine (`release_through`): an entry at
        or below it that becomes durable later (the leader may commit, and apply, an entry
        before its own write of it returns) is not kept."""
        self.last_index = self.unstable_offset - 1
        """The index of the last entry (stable or unstable). Kept, not computed: the core
        reads it on every step; every method that changes the tail updates it."""
        # Unstable entries already handed out in a Ready (written or being written).
        self.handed_out_index = self.unstable_offset - 1
        self.pending_truncate_after: int | None = None

    # --- bounds ----------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        stable_first = self.stable.first_index
        floor = self.first_index_floor
        return stable_first if stable_first > floor else floor  # max(), minus a call

    @property
    def persisted_index(self) -> int:
        """Entries through this index are durable here."""
        return self.unstable_offset - 1

    def last_term(self) -> int:
        term = self.term(self.last_index)
        return term if term is not None else self.snapshot_term

    # --- reads -----------------------------------------------------------------------

    def term(self, index: int) -> int | None:
        """The term of the entry at `index`; None if it is compacted away or missing."""
        if index == 0:
            return 0
        if index >= self.unstable_offset:
            offset = index - self.unstable_offset
            return self.unstable[offset].term if offset < len(self.unstable) else None
        if index >= self.recent_offset and index > self.snapshot_index:
            return self.recent[index - self.recent_offset].term
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.first_index_floor or index < self.stable.first_index:
            return None  # below `first_index` (written out: this runs for every term asked)
        return self.stable.term(index)

    def entries(self, low: int, high: int, bytes_max: int | None = None) -> list[LogEntry]:
        """Entries in [low, high), stopping early once `bytes_max` of data is gathered
        (but always at least one entry, so one large entry still moves)."""
        if low < self.first_index or high > self.last_index + 1:
            raise IndexError(f"log range [{low}, {high}) outside [{self.first_index}, ...]")
        if bytes_max is None:
            result: list[LogEntry] = []
            if low < self.unstable_offset:
                result = self.stable_entries(low, min(high, self.unstable_offset))
            if high > self.unstable_offset:
                start = max(low, self.unstable_offset) - self.unstable_offset
                result.extend(self.unstable[start : high - self.unstable_offset])
            return result
        # With a byte budget, read the store a few entries at a time: reading the whole
        # range and dropping what is over budget would read far more than is sent.
        gathered: list[LogEntry] = []
        total = 0
        index = low
        while index < high:
            if index < self.unstable_offset:
                chunk_high = min(high, self.unstable_offset, index + ENTRIES_PER_READ)
                chunk = self.stable_entries(index, chunk_high)
            else:
                start = index - self.unstable_offset
                chunk = self.unstable[start : start + min(high - index, ENTRIES_PER_READ)]
            for entry in chunk:
                total += len(entry.data)
                if total > bytes_max and gathered:
                    return gathered
                gathered.append(entry)
            index += len(chunk)
        return gathered

    def stable_entries(self, low: int, high: int) -> list[LogEntry]:
        """Entries in [low, high) below `unstable_offset`: from memory where `recent` has
        them, the rest from the store."""
        recent_offset = self.recent_offset
        if low >= recent_offset:
            return self.recent[low - recent_offset : high - recent_offset]
        if high <= recent_offset:
            return self.stable.entries(low, high)
        result = self.stable.entries(low, recent_offset)
        result.extend(self.recent[: high - recent_offset])
        return result

    def first_index_of_term(self, term: int, at_or_below: int) -> int:
        """Walk back from `at_or_below` to the first entry of `term` (fast backup, §5.3)."""
        index = at_or_below
        while index - 1 >= self.first_index and self.term(index - 1) == term:
            index -= 1
        return index

    def last_index_of_term(self, term: int) -> int | None:
        """The last index holding `term`, or None if the log has no entry of that term."""
        index = self.last_index
        while index >= self.first_index - 1 and index > 0:
            entry_term = self.term(index)
            if entry_term is None or entry_term < term:
                return None
            if entry_term == term:
                return index
            index -= 1
        return None

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Is a log ending at (last_index, last_term) at least as up to date as ours? (§5.4.1)"""
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index)

    # --- writes (to memory; the runtime makes them durable) ---------------------------

    def append(self, entries: list[LogEntry]) -> None:
        if entries and entries[0].index != self.last_index + 1:
            raise ValueError(f"append at {entries[0].index}, expected {self.last_index + 1}")
        self.unstable.extend(entries)
        self.last_index = self.unstable_offset + len(self.unstable) - 1

    def truncate_after(self, index: int) -> None:
        """Drop entries after `index` (which must be at or above the snapshot index)."""
        if index >= self.last_index:
            return
        if index >= self.unstable_offset - 1:
            del self.unstable[index - self.unstable_offset + 1 :]
        else:
            self.unstable = []
            self.unstable_offset = index + 1
            if index < self.recent_offset:
                self.forget_recent(index + 1)
            else:
                del self.recent[index + 1 - self.recent_offset :]
                self.recent_bytes = sum(len(entry.data) for entry in self.recent)
        self.last_index = index
        if self.handed_out_index > index:
            self.handed_out_index = index
            self.pending_truncate_after = (
                index
                if self.pending_truncate_after is None
                else min(self.pending_truncate_after, index)
            )

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        self.snapshot_index = meta.index
        self.snapshot_term = meta.term
        self.first_index_floor = meta.index + 1
        self.unstable = []
        self.unstable_offset = meta.index + 1
        self.forget_recent(meta.index + 1)
        self.last_index = meta.index
        self.handed_out_index = meta.index
        self.pending_truncate_after = None

    def snapshot_taken(self, meta: SnapshotMeta) -> None:
        """The runtime made a snapshot; it may now compact the store up to meta.index + 1."""
        if meta.index > self.snapshot_index:
            self.snapshot_index = meta.index
            self.snapshot_term = meta.term

    # --- hand-off to the runtime -----------------------------------------------------

    def take_unsent(self) -> tuple[int | None, list[LogEntry]]:
        """The truncation and entries not yet handed out; marks them handed out."""
        truncate = self.pending_truncate_after
        self.pending_truncate_after = None
        start = self.handed_out_index + 1 - self.unstable_offset
        entries = self.unstable[start:] if start < len(self.unstable) else []
        self.handed_out_index = self.last_index
        return truncate, entries

    def persisted(self, index: int, term: int) -> bool:
        """Entries through (index, term) are durable; forget them from memory.

        Ignored (returns False) if that entry has since been replaced or was never ours.
        """
        if index < self.unstable_offset or index > self.last_index:
            return False
        if self.term(index) != term:
            return False
        count = index - self.unstable_offset + 1
        durable = self.unstable[:count]
        del self.unstable[:count]
        self.unstable_offset = index + 1
        self.keep_recent(durable)
        return True

    def keep_recent(self, durable: list[LogEntry]) -> None:
        """Entries just made durable (they end at `unstable_offset - 1`) join `recent`;
        the oldest go while the bounds are exceeded."""
        recent = self.recent
        recent.extend(durable)
        self.recent_bytes += sum(len(entry.data) for entry in durable)
        self.recent_offset = self.unstable_offset - len(recent)
        if self.released_index >= self.recent_offset:
            self.release_through(self.released_index)
        if len(recent) > RECENT_ENTRIES_MAX or self.recent_bytes > RECENT_BYTES_MAX:
            drop = max(len(recent) - RECENT_ENTRIES_MAX, 0)
            bytes_left = self.recent_bytes - sum(len(entry.data) for entry in recent[:drop])
            while drop < len(recent) and bytes_left > RECENT_BYTES_MAX:
                bytes_left -= len(recent[drop].data)
                drop += 1
            del recent[:drop]
            self.recent_bytes = bytes_left
            self.recent_offset += drop

    def release_through(self, index: int) -> None:
        """Entries through `index` were handed to the state machine: memory need not keep
        them (a lagging follower's read goes to the store)."""
        self.released_index = max(self.released_index, index)
        if index < self.recent_offset:
            return
        count = min(index + 1, self.unstable_offset) - self.recent_offset
        released = self.recent[:count]
        del self.recent[:count]
        self.recent_bytes -= sum(len(entry.data) for entry in released)
        self.recent_offset += count

    def forget_recent(self, offset: int) -> None:
        """`recent` empty, next to begin at `offset` (the new `unstable_offset`)."""
        self.recent = []
        self.recent_bytes = 0
        self.recent_offset = offset

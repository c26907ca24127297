"""The writer's entry buffer: what it appended and must keep until acknowledged.

A writer keeps every entry after its LAC: an ensemble change resends the new bookie's share
of them. The buffer assigns entry ids (contiguous), keeps the ledger length through each
entry (the LAC's length rides on every add, and a close or an ensemble change stores it),
bounds what is pending, and cuts frames by count and bytes. Appends run once per entry, so
they do as little as they can; acknowledged entries leave the front in bulk.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import NoReturn

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.errors import EntryTooLargeError, LedgerError, LedgerPendingFullError
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from quorumlog.raft.invariants import require

_COMPACT_ENTRIES_MIN = 4096
"""Acknowledged entries dropped from the front in one go (amortised)."""


class EntryBuffer:
    def __init__(
        self, ledger_id: int, first_entry_id: int, length_before: int, config: LedgerProtocolConfig
    ) -> None:
        """A buffer whose next entry is `first_entry_id`, the ledger being `length_before`
        bytes long before it."""
        self.ledger_id = ledger_id
        self.entries: list[LedgerEntryData] = []
        self.first_entry_id = first_entry_id
        """The id of entries[0]."""
        self.cumulative_lengths: list[int] = []
        """cumulative_lengths[i]: the ledger's length through entries[i]."""
        self.length_before = length_before
        """The ledger's length before entries[0]."""
        self.next_entry_id = first_entry_id
        self.length_appended = length_before
        self.acknowledged_through = first_entry_id - 1
        self.length_acknowledged = length_before
        self.refusal: LedgerError | None = None
        """Set when the writer takes no more entries (failed or closing): appends raise it."""
        self.entry_bytes_max = config.entry_bytes_max
        self.pending_entries_max = config.pending_entries_max
        self.pending_bytes_max = config.pending_bytes_max

    @property
    def pending_entries(self) -> int:
        return self.next_entry_id - 1 - self.acknowledged_through

    def append(self, data: bytes) -> int:
        """Keep one entry; returns its id. Every check is folded into one test."""
        entry_id = self.next_entry_id
        size = len(data)
        length_total = self.length_appended + size
        if (
            self.refusal is not None
            or size > self.entry_bytes_max
            or entry_id - self.acknowledged_through > self.pending_entries_max
            or length_total - self.length_acknowledged > self.pending_bytes_max
        ):
            self.refuse(size)
        self.entries.append(LedgerEntryData(entry_id, data))
        self.cumulative_lengths.append(length_total)
        self.length_appended = length_total
        self.next_entry_id = entry_id + 1
        return entry_id

    def append_many(self, datas: Sequence[bytes]) -> int:
        """Keep entries in order (all or none); returns the first id."""
        first = self.next_entry_id
        count = len(datas)
        sizes = list(map(len, datas))
        largest = max(sizes, default=0)
        length_total = self.length_appended + sum(sizes)
        if (
            self.refusal is not None
            or largest > self.entry_bytes_max
            or first + count - 1 - self.acknowledged_through > self.pending_entries_max
            or length_total - self.length_acknowledged > self.pending_bytes_max
        ):
            self.refuse(largest, count)
        self.entries.extend(map(LedgerEntryData, range(first, first + count), datas))
        running = itertools.accumulate(sizes, initial=self.length_appended)
        self.cumulative_lengths.extend(itertools.islice(running, 1, None))
        self.length_appended = length_total
        self.next_entry_id = first + count
        return first

    def refuse(self, size: int, count: int = 1) -> NoReturn:
        """Raise why `count` more entries (the largest of `size` bytes) are not taken."""
        if self.refusal is not None:
            raise self.refusal
        if size > self.entry_bytes_max:
            raise EntryTooLargeError(f"{size} bytes > entry_bytes_max")
        raise LedgerPendingFullError(
            f"ledger {self.ledger_id}: {self.pending_entries} entries pending, "
            f"{count} more do not fit"
        )

    def acknowledge(self, through_entry_id: int) -> None:
        """Entries through `through_entry_id` are acknowledged: they are never sent again."""
        require(
            self.acknowledged_through <= through_entry_id < self.next_entry_id,
            "acknowledged entries must be appended ones, in order",
        )
        self.length_acknowledged = self.length_through(through_entry_id)
        self.acknowledged_through = through_entry_id
        dropped = through_entry_id + 1 - self.first_entry_id
        if dropped < _COMPACT_ENTRIES_MIN or dropped * 2 < len(self.entries):
            return
        self.length_before = self.cumulative_lengths[dropped - 1]
        del self.entries[:dropped]
        del self.cumulative_lengths[:dropped]
        self.first_entry_id += dropped

    def length_through(self, entry_id: int) -> int:
        offset = entry_id - self.first_entry_id
        return self.cumulative_lengths[offset] if offset >= 0 else self.length_before

    def frame_end(self, first: int, last: int, entries_max: int, bytes_max: int) -> int:
        """The last entry of a frame that starts at `first` and may reach `last`, within
        `entries_max` entries and `bytes_max` data bytes (one larger entry goes alone)."""
        offset = first - self.first_entry_id
        last_offset = min(last - self.first_entry_id, offset + entries_max - 1)
        before = self.cumulative_lengths[offset - 1] if offset > 0 else self.length_before
        limit = bisect.bisect_right(
            self.cumulative_lengths, before + bytes_max, offset, last_offset + 1
        )
        return self.first_entry_id + max(limit - 1, offset)

    def slice(self, first: int, last: int) -> list[LedgerEntryData]:
        start = first - self.first_entry_id
        batch = self.entries[start : start + last - first + 1]
        require(batch[0].entry_id == first and batch[-1].entry_id == last, "buffer misaligned")
        return batch

"""Which entry of a managed ledger's ledger holds an offset (entry format 2 holds a batch per
entry, so offset - first_offset is no longer the entry id).

An `EntryIndex` keeps points (entry id, the offset of its first record), sorted, always
with the ledger's start (entry 0 at its first offset) and its end (one past its last entry,
at one past its last offset) as known so far:

- the open ledger's index is whole: the owner adds every entry it appends (`append`), so
  every lookup is exact and costs no read;
- at a takeover the last ledger is read back whole anyway (to rebuild the producer table),
  so its index starts whole too; a closed ledger's index is thinned to a bounded number of
  evenly spread points (`thinned`), so memory does not follow the batch sizes;
- an older closed ledger starts with its two ends only (from the ManagedLedgerRecord:
  first offset, last entry, record count) and learns where each run of entries a read
  brings back starts and ends (`learn_point`: two points per read, so what readers teach
  stays small). An offset between two known points is found by probing: read the entry
  the interpolation between them points at, learn it, look again (`probe`). Entries hold
  batches of similar size, so interpolation mostly lands on the first probe; every other
  probe takes the midpoint instead, so a skewed ledger still costs O(log entries) probes.
  A consumer reading forward asks next for the offset one past its last read entry, which
  that read taught: sequential reads probe once per ledger at most.

Why not an index in the metadata: the record is rewritten by compare-and-set at every
change, and a per-entry index would grow it by the ledger's size; nor a full index of
every closed ledger built at open: that reads every retained entry before the first
fetch. Format-1 ledgers need no probe: their ends say one record per entry, which
`bracket` turns into the exact entry.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable

from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.ledger.managed_format import ManagedLedgerInfo
from quorumlog.raft.invariants import require

CLOSED_INDEXES_MAX = 64
"""Closed ledgers whose entry index (what reads learned of it) is kept, least recently
read dropped first; the open ledger's is always kept."""
CLOSED_INDEX_POINTS_MAX = 1024
"""Points a closed ledger's index keeps (thinned evenly beyond twice this): with
CLOSED_INDEXES_MAX, about 2 MB per partition at most, whatever the batch sizes."""


class EntryIndex:
    __slots__ = ("entry_ids", "offsets")

    def __init__(self, first_offset: int) -> None:
        # Arrays of 8-byte ints, not lists of int objects: a whole index holds a point per
        # entry (up to a ledger's rollover bound), and several are kept.
        self.entry_ids = array("q", [0])
        """Known entry ids, ascending; the last is one past the last known entry (the end)."""
        self.offsets = array("q", [first_offset])
        """The offset of each known entry's first record (of the end: one past the last)."""

    @classmethod
    def closed(cls, first_offset: int, entry_count: int, end_offset: int) -> EntryIndex:
        """A closed ledger known by its ends only."""
        index = cls(first_offset)
        if entry_count > 0:
            index.entry_ids.append(entry_count)
            index.offsets.append(end_offset)
        return index

    @property
    def first_offset(self) -> int:
        return self.offsets[0]

    @property
    def entry_count(self) -> int:
        """One past the last entry known to exist."""
        return self.entry_ids[-1]

    @property
    def end_offset(self) -> int:
        return self.offsets[-1]

    @property
    def point_count(self) -> int:
        return len(self.entry_ids)

    def thinned(self, points_max: int) -> EntryIndex:
        """This index with at most `points_max` points, evenly spread, the ends kept: what
        a closed ledger's index keeps, so memory stays bounded whatever its batch sizes
        (an offset between two kept points costs a few probes; reads learn again)."""
        require(points_max >= 2, "an index keeps its two ends")
        count = len(self.entry_ids)
        if count <= points_max:
            return self
        stride = -(-(count - 1) // (points_max - 1))
        kept = [*range(0, count - 1, stride), count - 1]
        index = EntryIndex(self.offsets[0])
        index.entry_ids = array("q", [self.entry_ids[position] for position in kept])
        index.offsets = array("q", [self.offsets[position] for position in kept])
        return index

    def append(self, counts: Iterable[int]) -> None:
        """The next entries of the open ledger, holding `counts` records each."""
        entry_ids, offsets = self.entry_ids, self.offsets
        entry_id, offset = entry_ids[-1], offsets[-1]
        for count in counts:
            require(count > 0, "an entry holds no record")
            entry_id += 1
            offset += count
            entry_ids.append(entry_id)
            offsets.append(offset)

    def truncate(self, entry_count: int) -> None:
        """Forget the entries from `entry_count` on (a tail recovery found only part of)."""
        position = bisect_right(self.entry_ids, entry_count)
        require(self.entry_ids[position - 1] == entry_count, "truncated at an unknown entry")
        del self.entry_ids[position:]
        del self.offsets[position:]

    def learn_point(self, entry_id: int, offset: int) -> None:
        """Entry `entry_id` starts at `offset` (a read found it; `entry_count` for one past
        the last). LedgerMetadataFormatError if that contradicts what is known: the entry
        is not where the ledger's record and the entries read before put it, so its bytes
        are not trusted."""
        entry_ids, offsets = self.entry_ids, self.offsets
        position = bisect_left(entry_ids, entry_id)
        if position < len(entry_ids) and entry_ids[position] == entry_id:
            if offsets[position] != offset:
                raise LedgerMetadataFormatError(
                    f"entry {entry_id} starts at offset {offset}, not {offsets[position]}"
                )
            return
        # Between two known points: offsets must rise by at least one per entry.
        if position == 0 or position == len(entry_ids):
            raise LedgerMetadataFormatError(f"entry {entry_id} is outside the ledger")
        below_entry, below_offset = entry_ids[position - 1], offsets[position - 1]
        above_entry, above_offset = entry_ids[position], offsets[position]
        if not (
            offset - below_offset >= entry_id - below_entry
            and above_offset - offset >= above_entry - entry_id
        ):
            raise LedgerMetadataFormatError(f"entry {entry_id} at offset {offset} is out of place")
        entry_ids.insert(position, entry_id)
        offsets.insert(position, offset)

    def bracket(self, offset: int) -> tuple[int, int]:
        """The first and last entry that can hold `offset` (equal: it is known), from the
        known points around it and one record at least per entry."""
        offsets = self.offsets
        require(offsets[0] <= offset < offsets[-1], "an offset outside the indexed entries")
        position = bisect_right(offsets, offset) - 1
        below_entry, below_offset = self.entry_ids[position], offsets[position]
        above_entry, above_offset = self.entry_ids[position + 1], offsets[position + 1]
        low = max(below_entry, above_entry - (above_offset - offset))
        high = min(above_entry - 1, below_entry + (offset - below_offset))
        return low, high

    def entry_of(self, offset: int) -> int | None:
        """The entry holding `offset`, if the known points say; None: probe first."""
        low, high = self.bracket(offset)
        return low if low == high else None

    def probe(self, offset: int, by_midpoint: bool) -> int:
        """An entry to read to learn where `offset` is: by interpolation between the known
        points around it, or the midpoint of what it can be."""
        low, high = self.bracket(offset)
        if by_midpoint:
            return (low + high) // 2
        position = bisect_right(self.offsets, offset) - 1
        below_entry, below_offset = self.entry_ids[position], self.offsets[position]
        above_entry, above_offset = self.entry_ids[position + 1], self.offsets[position + 1]
        guess = below_entry + (offset - below_offset) * (above_entry - below_entry) // (
            above_offset - below_offset
        )
        return min(max(guess, low), high)

    def last_entry_for(self, offset: int) -> int:
        """An entry to read up to so as to reach `offset`: the one holding it if known,
        else the interpolation's guess (a read that falls short goes on from where it
        stopped, which it then knows)."""
        return self.probe(offset, by_midpoint=False)


class ClosedIndexes:
    """Closed ledgers' entry indexes, least recently read first: at most
    CLOSED_INDEXES_MAX of them, each thinned to CLOSED_INDEX_POINTS_MAX points (again once
    reads have grown it to twice that)."""

    def __init__(self) -> None:
        self.indexes: OrderedDict[int, EntryIndex] = OrderedDict()

    def __len__(self) -> int:
        return len(self.indexes)

    def of(self, ledger: ManagedLedgerInfo) -> EntryIndex:
        """The index of a closed ledger (known by its ends, if nothing more is known)."""
        index = self.indexes.get(ledger.ledger_id)
        if index is None:
            index = EntryIndex.closed(ledger.first_offset, ledger.entry_count, ledger.end_offset)
        elif index.point_count <= 2 * CLOSED_INDEX_POINTS_MAX:
            self.indexes.move_to_end(ledger.ledger_id)
            return index
        self.remember(ledger.ledger_id, index)  # new, or grown by reads: thinned
        return self.indexes[ledger.ledger_id]

    def remember(self, ledger_id: int, index: EntryIndex) -> None:
        self.indexes[ledger_id] = index.thinned(CLOSED_INDEX_POINTS_MAX)
        self.indexes.move_to_end(ledger_id)
        while len(self.indexes) > CLOSED_INDEXES_MAX:
            self.indexes.popitem(last=False)

    def drop(self, ledger_id: int) -> None:
        self.indexes.pop(ledger_id, None)

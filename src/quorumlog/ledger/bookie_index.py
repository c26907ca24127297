"""Where each stored entry of one ledger is: (ledger, entry id) -> (file, offset, length).

The index lives in memory and is rebuilt from the log files at open. What it costs: entries
are kept in chunks of 256 consecutive ids, each chunk two arrays (8 bytes of location and 4
of length per id), so a densely filled chunk costs about 13 bytes per id. A bookie holds
only the entries whose write set includes it (Qw of every E when striping), so with E=3,
Qw=2 it is about 20 bytes per entry stored; a million entries, 20 MB. Ids far apart cost a
chunk each (about 3 KiB), which only a client breaking the protocol would send. A dict of
tuples would cost about 150 bytes per entry.

Location 0 means "not stored here": offset 0 of every file is its file header, never an entry.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence

CHUNK_BITS = 8
CHUNK_ENTRIES = 1 << CHUNK_BITS
_SLOT_MASK = CHUNK_ENTRIES - 1
_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_EMPTY_LOCATIONS = array("Q", bytes(8 * CHUNK_ENTRIES))
_EMPTY_LENGTHS = array("I", bytes(4 * CHUNK_ENTRIES))


class StoredEntry:
    """Where one entry is: file number, offset of its entry header, length of its data."""

    __slots__ = ("entry_id", "file_number", "length", "offset")

    def __init__(self, entry_id: int, file_number: int, offset: int, length: int) -> None:
        self.entry_id = entry_id
        self.file_number = file_number
        self.offset = offset
        self.length = length


class LedgerEntryIndex:
    """The stored entries of one ledger on this bookie."""

    __slots__ = ("chunk_numbers", "chunks", "entry_count", "last_entry_id")

    def __init__(self) -> None:
        self.chunks: dict[int, tuple[array[int], array[int]]] = {}
        """Chunk number (entry id >> CHUNK_BITS) -> (locations, lengths)."""
        self.chunk_numbers: list[int] = []
        """The keys of `chunks`, sorted, for range scans."""
        self.entry_count = 0
        self.last_entry_id = -1

    def put_many(
        self,
        entry_ids: Sequence[int],
        file_number: int,
        base_offset: int,
        offsets: Sequence[int],
        lengths: Sequence[int],
    ) -> None:
        """Record entries stored in file `file_number` at base_offset + offsets[i] (a later
        put of the same id wins: a bookie takes overwrites, as recovery re-writes entries)."""
        file_bits = (file_number << _OFFSET_BITS) + base_offset
        chunks = self.chunks
        added = 0
        for entry_id, offset, length in zip(entry_ids, offsets, lengths, strict=True):
            chunk = chunks.get(entry_id >> CHUNK_BITS)
            if chunk is None:
                chunk = self._new_chunk(entry_id >> CHUNK_BITS)
            slot = entry_id & _SLOT_MASK
            locations = chunk[0]
            if locations[slot] == 0:
                added += 1
            locations[slot] = file_bits + offset
            chunk[1][slot] = length
        self.entry_count += added
        if entry_ids:
            self.last_entry_id = max(self.last_entry_id, max(entry_ids))

    def get(self, entry_id: int) -> StoredEntry | None:
        chunk = self.chunks.get(entry_id >> CHUNK_BITS)
        if chunk is None:
            return None
        slot = entry_id & _SLOT_MASK
        location = chunk[0][slot]
        if location == 0:
            return None
        return StoredEntry(
            entry_id, location >> _OFFSET_BITS, location & _OFFSET_MASK, chunk[1][slot]
        )

    def scan(self, first_entry_id: int, last_entry_id: int) -> Iterator[StoredEntry]:
        """The stored entries with ids in first..last, in id order (absent ids skipped).
        Costs in proportion to the chunks of stored entries in the range, not to its width."""
        last_entry_id = min(last_entry_id, self.last_entry_id)
        numbers = self.chunk_numbers
        position = bisect_left(numbers, first_entry_id >> CHUNK_BITS)
        while position < len(numbers) and numbers[position] <= last_entry_id >> CHUNK_BITS:
            number = numbers[position]
            locations, lengths = self.chunks[number]
            base = number << CHUNK_BITS
            start = max(first_entry_id - base, 0)
            end = min(last_entry_id - base, _SLOT_MASK)
            for slot in range(start, end + 1):
                location = locations[slot]
                if location:
                    yield StoredEntry(
                        base + slot,
                        location >> _OFFSET_BITS,
                        location & _OFFSET_MASK,
                        lengths[slot],
                    )
            position += 1

    def _new_chunk(self, number: int) -> tuple[array[int], array[int]]:
        chunk = (array("Q", _EMPTY_LOCATIONS), array("I", _EMPTY_LENGTHS))
        self.chunks[number] = chunk
        if not self.chunk_numbers or number > self.chunk_numbers[-1]:
            self.chunk_numbers.append(number)  # the usual case: ids arrive in order
        else:
            insort(self.chunk_numbers, number)
        return chunk

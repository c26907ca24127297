"""One segment file of the segment log store and its slice of the in-memory index."""

from __future__ import annotations

from array import array
from pathlib import Path

from quorumlog.raft.invariants import InvariantViolation
from quorumlog.storage.filesystem import FileHandle
from quorumlog.storage.segment_format import closed_segment_name, open_segment_name


class SegmentFile:
    """A run of consecutive entries in one file, with their offsets and terms.

    The index is two packed arrays of unsigned 64-bit integers (8 bytes per entry each, 16 in
    all) instead of a Python object per entry, which would cost ten times as much memory.
    `offsets[k]` is where entry first_index + k starts; it ends where the next one starts,
    or at `end_bytes` for the last one.
    """

    __slots__ = (
        "directory",
        "end_bytes",
        "first_index",
        "handle",
        "is_open",
        "offsets",
        "terms",
    )

    def __init__(
        self,
        directory: Path,
        first_index: int,
        is_open: bool,
        offsets: array[int] | None = None,
        terms: array[int] | None = None,
        end_bytes: int = 0,
    ) -> None:
        self.directory = directory
        self.first_index = first_index
        self.is_open = is_open
        self.offsets: array[int] = offsets if offsets is not None else array("Q")
        self.terms: array[int] = terms if terms is not None else array("Q")
        self.end_bytes = end_bytes
        self.handle: FileHandle | None = None
        """The open file, or None. The open segment keeps one for writing."""

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last_index(self) -> int:
        """Index of the last entry; first_index - 1 when the segment is empty."""
        return self.first_index + len(self.offsets) - 1

    @property
    def name(self) -> str:
        if self.is_open:
            return open_segment_name(self.first_index)
        return closed_segment_name(self.first_index, self.last_index)

    @property
    def path(self) -> Path:
        return self.directory / self.name

    def entry_span(self, index: int) -> tuple[int, int]:
        """(start, end) byte offsets of entry `index`, which must be in this segment."""
        position = index - self.first_index
        start = self.offsets[position]
        if position + 1 < len(self.offsets):
            return start, self.offsets[position + 1]
        return start, self.end_bytes

    def writable_handle(self) -> FileHandle:
        """The open file of the open segment, which always holds one while the store is open."""
        handle = self.handle
        if handle is None:
            # What require(...) raises, spelled out so the type checker sees the narrowing.
            raise InvariantViolation(f"the open segment {self.path} has no open file")
        return handle

    def close_handle(self) -> None:
        if self.handle is not None:
            handle = self.handle
            self.handle = None
            handle.close()

    def __repr__(self) -> str:
        return f"SegmentFile({self.name}, entries={self.count}, bytes={self.end_bytes})"

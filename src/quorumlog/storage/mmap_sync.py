"""A sync of the mmap store that runs off the event loop: a captured range, synced by a thread.

The rule this module and `MmapLogStore.begin_sync` / `finish_sync` keep:

    a position is reported durable only after a sync that covered it returned.

`begin_sync` runs on the store's thread. It captures what is written and not yet synced,
[low, end) of the data stream (and of the index, when enough slots wait), and forgets only
what it captured: an append made while the sync runs lands at or past `end`, so it stays
dirty and the next sync covers it. `CapturedSync.run` does the msyncs, on any thread, and
touches no state of the store. `finish_sync`, back on the store's thread, moves the durable
position to the captured end, and only then.

Why the job flushes through descriptors and mappings of its own, opened at capture: the
store may truncate, delete files or close while the job runs (a slave's handshake, a role
change, a node stopping). Its own mappings keep the files alive for the job and can never be
unmapped under it; an msync of pages that a truncation zeroed meanwhile is harmless, and the
truncation makes everything it keeps durable itself (see `MmapLogStore.truncate_suffix`).

msync through a fresh mapping writes what any write left dirty in that range of the file:
on Linux, msync(MS_SYNC) of a shared file mapping syncs the file's range (pages dirtied by
pwrite included), then commits the journal as fdatasync does.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from quorumlog.storage.files import disk_errors, fsync_directory
from quorumlog.storage.mmap_files import MappedFileList

_PAGE_BYTES = mmap.PAGESIZE


class FlushPiece:
    """One file's part of a captured range: msync [offset, offset + length) of it."""

    __slots__ = ("descriptor", "length", "offset", "path")

    def __init__(self, path: Path, descriptor: int, offset: int, length: int) -> None:
        self.path = path
        self.descriptor = descriptor
        self.offset = offset
        """Page-aligned (a mapping must start on a page)."""
        self.length = length


def flush_file_range(descriptor: int, offset: int, length: int) -> None:
    """msync [offset, offset + length) of the file through a mapping of its own."""
    mapping = mmap.mmap(descriptor, length, mmap.MAP_SHARED, offset=offset)
    try:
        mapping.flush()
    finally:
        mapping.close()


def capture_pieces(files: MappedFileList, low: int, high: int) -> list[FlushPiece]:
    """The pieces of [low, high) of the stream, each with a descriptor of its own (the
    caller's `CapturedSync` closes them). Runs on the store's thread."""
    pieces: list[FlushPiece] = []
    try:
        for mapped in files.files:
            first = max(low, mapped.start)
            last = min(high, mapped.start + files.file_bytes)
            if first < last:
                offset = (first - mapped.start) // _PAGE_BYTES * _PAGE_BYTES
                with disk_errors(mapped.path):
                    descriptor = os.open(mapped.path, os.O_RDWR)
                pieces.append(
                    FlushPiece(mapped.path, descriptor, offset, last - mapped.start - offset)
                )
    except BaseException:
        close_pieces(pieces)
        raise
    return pieces


def close_pieces(pieces: list[FlushPiece]) -> None:
    for piece in pieces:
        if piece.descriptor >= 0:
            os.close(piece.descriptor)
            piece.descriptor = -1


class CapturedSync:
    """What one background sync covers; `run` it on any thread, once, then hand it to the
    store's `finish_sync` on the store's thread."""

    def __init__(
        self,
        *,
        data_low: int,
        data_end: int,
        pieces: list[FlushPiece],
        directories: list[Path],
        generation: int,
    ) -> None:
        self.data_low = data_low
        self.data_end = data_end
        """Every data byte below this is durable once `run` returned."""
        self.pieces = pieces
        self.directories = directories
        """Directories whose entries changed (files created) since the last sync."""
        self.generation = generation
        """The store's truncation count at capture: a truncation since then made the range
        durable itself, and may have cut below `data_end`, so the finish claims nothing."""
        self.ran = False

    @property
    def empty(self) -> bool:
        """Nothing to flush: the capture is durable already (or the policy syncs nothing)."""
        return not self.pieces and not self.directories

    def run(self) -> None:
        """The msyncs and directory fsyncs. Off the store's thread; touches no store state."""
        try:
            for piece in self.pieces:
                with disk_errors(piece.path):
                    flush_file_range(piece.descriptor, piece.offset, piece.length)
            for directory in self.directories:
                with disk_errors(directory):
                    fsync_directory(directory)
            self.ran = True
        finally:
            close_pieces(self.pieces)

    def discard(self) -> None:
        """Give up without running (the descriptors are closed; nothing is claimed)."""
        close_pieces(self.pieces)


__all__ = ["CapturedSync", "FlushPiece", "capture_pieces", "close_pieces", "flush_file_range"]

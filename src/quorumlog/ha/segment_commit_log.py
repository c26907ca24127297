"""A broker's commit log with byte offsets on the braft-style `SegmentLogStore`.

The same `CommitLog` contract as `MmapCommitLog`, on a store that runs on any `FileSystem`
(the simulator's disk included: `MmapLogStore` needs real files). One message is one
store entry, and the offsets follow one rule, the "dense" layout:

    a message's offset = the sum over the messages before it of
                         (ENTRY_HEADER_BYTES + its data length)

i.e. the position of its entry in the concatenation of the segment files (which have no
file header and no padding). Segment rollover does not move offsets, so the layout does not
depend on the segment size; two brokers holding the same messages have the same offsets.
`data_file_bytes`, the layout parameter the handshake compares, is `DENSE_LAYOUT` (0): an
mmap log (whose blanks pad each data file) never agrees with a dense one, and the handshake
refuses to pair them.

The end offset of every message is kept in memory (rebuilt at open from the entries'
lengths), so lookups are a bisect. The log always starts at offset 0: like the mmap log it
does not support a log whose head was dropped (the handshake refuses such a master).

The entry's term is the MasterEpoch under which its message was written, so a read never
mixes epochs (reference 003: transfer batches never cross an epoch boundary).

Syncs: `begin_sync` captures the max offset and its `run` syncs the whole store, so it is
for one-thread worlds only (the simulator runs background jobs on its one thread, later):
`SegmentLogStore` is not safe to append to while another thread syncs it. What `run` syncs
past the capture is not claimed; the next sync claims it.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from quorumlog.ha.commit_log import (
    CommitLogBatch,
    CommitLogSync,
    message_entries,
    read_one_epoch,
)
from quorumlog.raft.invariants import require
from quorumlog.storage.base import SyncPolicy
from quorumlog.storage.filesystem import OS_FILE_SYSTEM, FileSystem
from quorumlog.storage.segment import SEGMENT_BYTES_MAX_DEFAULT, SegmentLogStore
from quorumlog.storage.segment_format import ENTRY_HEADER_BYTES

DENSE_LAYOUT: Final = 0
"""`data_file_bytes` of a dense log: no data file size shapes its offsets."""


@dataclass
class SegmentSync:
    """A captured sync of a `SegmentCommitLog` (one-thread worlds only; see the module)."""

    store: SegmentLogStore
    end_offset: int
    truncations: int
    ran: bool = False

    def run(self) -> None:
        self.store.sync()
        self.ran = True


class SegmentCommitLog:
    """`CommitLog` on a `SegmentLogStore` (see the module docs for the offsets)."""

    def __init__(self, store: SegmentLogStore) -> None:
        """Use `SegmentCommitLog.open`."""
        require(store.first_index == 1, f"a commit log starts at entry 1, not {store.first_index}")
        self._store = store
        self._ends: list[int] = []
        """_ends[k]: the end offset of the message at entry index k + 1."""
        end = 0
        for entry in store.iter_entries(1, store.last_index + 1):
            end += ENTRY_HEADER_BYTES + len(entry.data)
            self._ends.append(end)
        self._durable_offset = end
        """What open found counts as durable, as the Raft host counts it (the store's
        recovery keeps only what was written whole)."""
        self._in_flight: SegmentSync | None = None
        self._truncations = 0

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        segment_bytes_max: int = SEGMENT_BYTES_MAX_DEFAULT,
        sync_policy: SyncPolicy = SyncPolicy.EXPLICIT,
        file_system: FileSystem = OS_FILE_SYSTEM,
    ) -> SegmentCommitLog:
        store = SegmentLogStore.open(
            path,
            segment_bytes_max=segment_bytes_max,
            sync_policy=sync_policy,
            file_system=file_system,
        )
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    @property
    def store(self) -> SegmentLogStore:
        return self._store

    @property
    def data_file_bytes(self) -> int:
        return DENSE_LAYOUT

    @property
    def min_offset(self) -> int:
        return 0

    @property
    def max_offset(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def last_epoch(self) -> int | None:
        store = self._store
        return store.term(store.last_index) if store.last_index >= 1 else None

    def append(self, messages: Sequence[bytes], epoch: int) -> int:
        store = self._store
        store.append(message_entries(messages, epoch, store.last_index + 1))
        end = self.max_offset
        ends = self._ends
        for message in messages:  # only once the store took them: an append is all or nothing
            end += ENTRY_HEADER_BYTES + len(message)
            ends.append(end)
        return end

    def sync(self) -> None:
        self._store.sync()
        self._durable_offset = self.max_offset

    @property
    def durable_offset(self) -> int:
        return self._durable_offset

    def begin_sync(self) -> SegmentSync:
        require(self._in_flight is None, "a background sync is already in flight")
        self._in_flight = SegmentSync(self._store, self.max_offset, self._truncations)
        return self._in_flight

    def finish_sync(self, sync: CommitLogSync, error: BaseException | None) -> int:
        require(sync is self._in_flight, "finish_sync of a sync not in flight")
        assert isinstance(sync, SegmentSync)  # for mypy; `require` above checked it
        self._in_flight = None
        if error is None and sync.ran and sync.truncations == self._truncations:
            self._durable_offset = max(self._durable_offset, sync.end_offset)
        return self._durable_offset

    def read_batch(self, offset: int, bytes_max: int) -> CommitLogBatch | None:
        store = self._store
        index = self._index_at(offset)
        if index > store.last_index:
            return None
        messages, epoch, last_read = read_one_epoch(store, index, bytes_max)
        return CommitLogBatch(offset, self._ends[last_read - 1], epoch, messages)

    def truncate(self, offset: int) -> None:
        if offset == self.max_offset:
            return
        index = self._index_at(offset)
        self._store.truncate_suffix(index - 1)
        del self._ends[index - 1 :]
        self._durable_offset = min(self._durable_offset, offset)
        self._truncations += 1
        require(self.max_offset == offset, f"truncated to {offset}, ends at {self.max_offset}")

    def truncate_to_last_whole_message(self) -> int:
        """The log always ends at a whole message (the store cuts a torn tail at open)."""
        return self.max_offset

    def close(self) -> None:
        self._store.close()

    def _index_at(self, offset: int) -> int:
        """The entry index of the message starting at boundary `offset` (last + 1 at the
        end). Raises InvariantViolation if `offset` is not a boundary of this log."""
        if offset == 0:
            return 1
        position = bisect_left(self._ends, offset)
        require(
            position < len(self._ends) and self._ends[position] == offset,
            f"offset {offset} is not a message boundary of the commit log [0, {self.max_offset}]",
        )
        return position + 2


__all__ = ["DENSE_LAYOUT", "SegmentCommitLog", "SegmentSync"]

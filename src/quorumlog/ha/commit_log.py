"""A broker's commit log with byte offsets, on the DLedger-style `MmapLogStore`.

Reference 003 addresses the commit log by physical offset. Here one message is one store
entry, and a message's offset is the entry's position in the store's data stream (header,
body and alignment padding included, and the blank record that fills the end of a data file
when the next entry does not fit). `max_offset` is the stream position just past the last
entry. Offsets that matter (epoch starts, batch starts and ends, acks, confirmOffset) are
always such ends: message boundaries.

Why this works across brokers: the store's layout is a pure function of the data file size,
the first position and the entries' sizes, so two brokers holding the same messages with the
same `data_file_bytes` have the same offsets. The handshake checks the data file sizes agree
and a slave checks every batch ends where the master says it does. The entry's term is the
MasterEpoch under which its message was written, so a read never mixes epochs: a transfer
batch stops where the term changes (reference 003: batches never cross an epoch boundary).

What this is not (yet): a broker that starts empty replicates from offset 0; a master whose
log no longer starts at 0 (the store's `truncate_prefix`) cannot seed such a slave, because
`MmapLogStore.reset` cannot place an empty log at an arbitrary position (RocketMQ's
isSyncFromLastFile). The handshake refuses that case with a typed error.

"Truncate to the last whole message" (what a broker does at every role change in 003) holds
by construction: a slave appends whole messages, never a byte stream, and the store cuts a
torn tail at open. `truncate_to_last_whole_message` says so and returns the offset.
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import msgspec

from quorumlog.raft.invariants import require
from quorumlog.storage.base import LogStore, SyncPolicy
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.storage.mmap_store import (
    DATA_FILE_BYTES_DEFAULT,
    INDEX_FILE_BYTES_DEFAULT,
    MmapLogStore,
)
from quorumlog.storage.mmap_sync import CapturedSync

OFFSET_CACHE_ENTRIES_MAX = 64
"""Offsets (batch ends) remembered with the entry that follows them: each slave's transfer
reads on from where the last batch ended, so the lookup is a dictionary hit, not a search."""
RECENT_MESSAGES_BYTES_MAX = 2 * 1024 * 1024
"""Message bytes of the latest appends kept in memory as they were appended: a master's
transfers to its slaves, and a slave's indexing, read what was just written, and reading
it back from the data files cost a copy and a checksum of every byte, per slave. Two
produce batches of the largest size: every slave's next transfer, in steady state. Per
commit log, so a node hosting many HA partitions holds this much for each."""


class CommitLogBatch(msgspec.Struct, frozen=True):
    """Consecutive messages of one epoch: [start_offset, end_offset) of the log."""

    start_offset: int
    end_offset: int
    epoch: int
    messages: list[bytes]


class RecentMessage(NamedTuple):
    """A message as appended: where it ends in the log, its epoch, its bytes."""

    end: int
    epoch: int
    data: bytes


class CommitLogSync(Protocol):
    """A sync captured by `CommitLog.begin_sync`: `run` it once, off the broker's thread
    if the log allows (see `CommitLog.begin_sync`), then hand it to `finish_sync`."""

    def run(self) -> None: ...


class CommitLog(Protocol):
    """What the HA cores need of a broker's commit log.

    Durability: a position is reported durable (`durable_offset`) only after a sync that
    covered it returned. `sync` is one on this thread; `begin_sync`, `run`, `finish_sync`
    one whose `run` may go to another thread while appends go on (they are left for the
    next sync)."""

    @property
    def data_file_bytes(self) -> int:
        """The layout parameter two brokers must share for their offsets to agree."""
        ...

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the last message (None for an empty log)."""
        ...

    def append(self, messages: Sequence[bytes], epoch: int) -> int:
        """Append whole messages written under `epoch`; returns the new max offset. Readable
        at once, durable only after `sync`."""
        ...

    def sync(self) -> None:
        """Make everything appended durable, on this thread (covers a sync in flight)."""
        ...

    @property
    def durable_offset(self) -> int:
        """Every message below this was covered by a sync that returned."""
        ...

    def begin_sync(self) -> CommitLogSync:
        """Capture what is appended and not yet durable (one capture in flight at a time)."""
        ...

    def finish_sync(self, sync: CommitLogSync, error: BaseException | None) -> int:
        """`sync` ran (`error`: what it raised); returns the durable offset, moved to the
        captured end if it succeeded and no truncation came between."""
        ...

    def read_batch(self, offset: int, bytes_max: int) -> CommitLogBatch | None:
        """Messages from `offset` (a message boundary), all of the first one's epoch, about
        `bytes_max` of message data (at least one message); None at the end of the log."""
        ...

    def truncate(self, offset: int) -> None:
        """Drop every message at or after `offset` (a message boundary); durable on return."""
        ...

    def truncate_to_last_whole_message(self) -> int: ...

    def close(self) -> None: ...


class MmapCommitLog:
    """`CommitLog` on an `MmapLogStore` (see the module docs for the offsets)."""

    def __init__(self, store: MmapLogStore, data_file_bytes: int) -> None:
        """Use `MmapCommitLog.open`."""
        self._store = store
        self._data_file_bytes = data_file_bytes
        self._next_index_by_offset: OrderedDict[int, int] = OrderedDict()
        self._recent: dict[int, RecentMessage] = {}
        """Start offset -> the message appended there (the latest appends only)."""
        self._recent_starts: deque[int] = deque()
        self._recent_bytes = 0

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        data_file_bytes: int = DATA_FILE_BYTES_DEFAULT,
        index_file_bytes: int = INDEX_FILE_BYTES_DEFAULT,
        sync_policy: SyncPolicy = SyncPolicy.EXPLICIT,
    ) -> MmapCommitLog:
        store = MmapLogStore.open(
            path,
            data_file_bytes=data_file_bytes,
            index_file_bytes=index_file_bytes,
            sync_policy=sync_policy,
        )
        return cls(store, data_file_bytes)

    @property
    def store(self) -> MmapLogStore:
        return self._store

    @property
    def data_file_bytes(self) -> int:
        return self._data_file_bytes

    @property
    def min_offset(self) -> int:
        return self._store.first_data_position

    @property
    def max_offset(self) -> int:
        return self._store.data_end

    @property
    def last_epoch(self) -> int | None:
        store = self._store
        return store.term(store.last_index) if store.last_index >= store.first_index else None

    def append(self, messages: Sequence[bytes], epoch: int) -> int:
        store = self._store
        start, first_index = store.data_end, store.last_index + 1
        store.append(message_entries(messages, epoch, first_index))
        for index, message in enumerate(messages, start=first_index):
            if index == store.last_index:
                end = store.data_end
            else:
                position, size = store.entry_span(index)
                end = position + size
            self._keep_recent(start, RecentMessage(end, epoch, message))
            start = end
        return store.data_end

    def sync(self) -> None:
        self._store.sync()

    @property
    def durable_offset(self) -> int:
        return self._store.durable_data_end

    def begin_sync(self) -> CapturedSync:
        """The store's captured sync: its `run` is safe on any thread (mmap_sync)."""
        return self._store.begin_sync()

    def finish_sync(self, sync: CommitLogSync, error: BaseException | None) -> int:
        require(isinstance(sync, CapturedSync), f"not a sync of this log: {sync!r}")
        assert isinstance(sync, CapturedSync)  # for mypy; `require` above checked it
        return self._store.finish_sync(sync, error)

    def read_batch(self, offset: int, bytes_max: int) -> CommitLogBatch | None:
        recent = self._read_recent(offset, bytes_max)
        if recent is not None:
            return recent
        store = self._store
        index = self._index_at(offset)
        if index > store.last_index:
            return None
        messages, epoch, last_read = read_one_epoch(store, index, bytes_max)
        position, size = store.entry_span(last_read)
        end_offset = position + size
        self._remember(end_offset, last_read + 1)
        return CommitLogBatch(offset, end_offset, epoch, messages)

    def truncate(self, offset: int) -> None:
        if offset == self.max_offset:
            return
        index = self._index_at(offset)
        self._next_index_by_offset.clear()
        self._forget_recent()
        self._store.truncate_suffix(index - 1)
        require(
            self._store.data_end == offset,
            f"commit log truncated to {offset} ends at {self._store.data_end}",
        )

    def truncate_to_last_whole_message(self) -> int:
        """The log always ends at a whole message (see the module docs): nothing to cut."""
        return self.max_offset

    def close(self) -> None:
        self._store.close()

    # --- offset -> entry -------------------------------------------------------------

    def _index_at(self, offset: int) -> int:
        """The index of the message starting at message boundary `offset` (last + 1 at the
        end). Raises InvariantViolation if `offset` is not a boundary of this log."""
        store = self._store
        if offset == store.data_end:
            return store.last_index + 1
        cached = self._next_index_by_offset.get(offset)
        if cached is not None:
            return cached
        require(
            self.min_offset <= offset < store.data_end,
            f"offset {offset} is outside the commit log [{self.min_offset}, {store.data_end}]",
        )
        low, high = store.first_index, store.last_index + 1
        while low < high:  # the first entry positioned at or after `offset`
            middle = (low + high) // 2
            if store.entry_span(middle)[0] < offset:
                low = middle + 1
            else:
                high = middle
        if low > store.first_index:
            position, size = store.entry_span(low - 1)
            boundary = position + size == offset
        else:
            boundary = offset == self.min_offset
        require(boundary, f"offset {offset} is not a message boundary of the commit log")
        self._remember(offset, low)
        return low

    # --- the latest appends, in memory -----------------------------------------------

    def _keep_recent(self, start: int, message: RecentMessage) -> None:
        self._recent[start] = message
        self._recent_starts.append(start)
        self._recent_bytes += len(message.data)
        while self._recent_bytes > RECENT_MESSAGES_BYTES_MAX and len(self._recent_starts) > 1:
            dropped = self._recent.pop(self._recent_starts.popleft())
            self._recent_bytes -= len(dropped.data)

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_starts.clear()
        self._recent_bytes = 0

    def _read_recent(self, offset: int, bytes_max: int) -> CommitLogBatch | None:
        """`read_batch` from the latest appends (None if the message at `offset` is not
        among them); the same messages a read of the store gives, or a prefix of them."""
        recent = self._recent.get(offset)
        if recent is None:
            return None
        epoch = recent.epoch
        messages: list[bytes] = []
        data_bytes = 0
        end = offset
        while recent is not None and (
            not messages or (recent.epoch == epoch and data_bytes + len(recent.data) <= bytes_max)
        ):
            messages.append(recent.data)
            data_bytes += len(recent.data)
            end = recent.end
            recent = self._recent.get(end)
        return CommitLogBatch(offset, end, epoch, messages)

    def _remember(self, offset: int, next_index: int) -> None:
        cache = self._next_index_by_offset
        cache[offset] = next_index
        cache.move_to_end(offset)
        if len(cache) > OFFSET_CACHE_ENTRIES_MAX:
            cache.popitem(last=False)


__all__ = ["CommitLog", "CommitLogBatch", "CommitLogSync", "MmapCommitLog"]


# --- shared by every CommitLog on a LogStore -----------------------------------------------


def message_entries(messages: Sequence[bytes], epoch: int, first_index: int) -> list[LogEntry]:
    """One store entry per message; the entry's term is the message's MasterEpoch."""
    return [
        LogEntry(index=index, term=epoch, data=message, type=EntryType.DATA)
        for index, message in enumerate(messages, start=first_index)
    ]


def read_one_epoch(store: LogStore, index: int, bytes_max: int) -> tuple[list[bytes], int, int]:
    """Messages from entry `index` on, all of one epoch and at most `bytes_max` data bytes
    (at least one): (messages, their epoch, the last entry read)."""
    messages: list[bytes] = []
    data_bytes = 0
    epoch = -1
    last_read = index
    for entry in store.iter_entries(index, store.last_index + 1):
        if messages and (entry.term != epoch or data_bytes + len(entry.data) > bytes_max):
            break
        epoch = entry.term
        messages.append(entry.data)
        data_bytes += len(entry.data)
        last_read = entry.index
    return messages, epoch, last_read

"""The log store interface that every store implements, and what they share.

A log store holds a contiguous run of entries [first_index, last_index]. An empty store has
last_index == first_index - 1. The contract, which the shared conformance suite checks for
every implementation:

- `append(entries)` takes entries whose indexes run on from last_index + 1 with no gap. Bad
  arguments raise and change nothing.
- Entries appended are readable at once; they are durable only once `sync()` returns (or at
  once, under `SyncPolicy.EVERY_APPEND`).
- `truncate_suffix(last_kept)` drops every entry after last_kept; `truncate_prefix(first_kept)`
  drops every entry before first_kept; `reset(next_index)` drops everything and makes the
  store empty with first_index == next_index (used when a snapshot replaces the log).
  Truncations are durable when they return.
- A store never returns data that fails its checksum: at open, damage to the tail of the last
  file (a torn write) is cut off and reported in `recovery`; damage anywhere else raises
  `CorruptLogError`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from quorumlog.errors import (
    EntryTooLargeError,
    InvalidTruncateError,
    LogIndexError,
    NonContiguousAppendError,
)
from quorumlog.storage.entry import LogEntry

ENTRY_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
"""Largest entry data a store accepts unless told otherwise."""


class SyncPolicy(enum.Enum):
    """When appended entries reach stable storage."""

    EXPLICIT = "explicit"
    """Only when `sync()` is called: the caller syncs once per batch (group commit)."""
    EVERY_APPEND = "every_append"
    """Each `append` call syncs before it returns."""
    NEVER = "never"
    """`sync()` does nothing. For benchmarks and tests that measure without fsync only."""


class RecoveryReport(msgspec.Struct, frozen=True):
    """What `open` found and repaired."""

    entries_found: int = 0
    torn_bytes_dropped: int = 0
    """Bytes cut off the end of the last file because they held an incomplete entry."""
    torn_file: str | None = None


@runtime_checkable
class LogStore(Protocol):
    """The interface of every log store (segment files, mmap files, memory)."""

    @property
    def first_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    @property
    def recovery(self) -> RecoveryReport: ...

    def append(self, entries: Sequence[LogEntry]) -> None: ...

    def sync(self) -> None: ...

    def entry(self, index: int) -> LogEntry: ...

    def entries(self, low: int, high: int) -> list[LogEntry]:
        """Entries with low <= index < high (half-open, as Python ranges)."""
        ...

    def iter_entries(self, low: int, high: int) -> Iterator[LogEntry]: ...

    def term(self, index: int) -> int: ...

    def truncate_suffix(self, last_kept: int) -> None: ...

    def truncate_prefix(self, first_kept: int) -> None: ...

    def reset(self, next_index: int) -> None: ...

    def close(self) -> None: ...


# --- argument checks every store shares -----------------------------------------------


def check_append(entries: Sequence[LogEntry], last_index: int, entry_bytes_max: int) -> None:
    """Raise unless `entries` run on from last_index + 1 and each fits the size bound."""
    if not entries:
        return
    first = last_index + 1
    if len(entries) == 1:
        # One entry: most appends of a node with many busy groups (a leader's proposal, a
        # follower's push of one record batch); the generic path costs several times this.
        entry = entries[0]
        if entry.index == first and len(entry.data) <= entry_bytes_max and entry.term >= 0:
            return
    # Fast path: whole-batch checks in C; the loop below runs only to name the culprit.
    if (
        [entry.index for entry in entries] == list(range(first, first + len(entries)))
        and max(len(entry.data) for entry in entries) <= entry_bytes_max
        and min(entry.term for entry in entries) >= 0
    ):
        return
    expected = last_index + 1
    for entry in entries:
        if entry.index != expected:
            raise NonContiguousAppendError(f"append expected index {expected}, got {entry.index}")
        if len(entry.data) > entry_bytes_max:
            raise EntryTooLargeError(
                f"entry {entry.index} has {len(entry.data)} bytes of data, "
                f"over entry_bytes_max={entry_bytes_max}"
            )
        if entry.term < 0:
            raise ValueError(f"entry {entry.index} has negative term {entry.term}")
        expected += 1


def check_index(index: int, first_index: int, last_index: int) -> None:
    if not first_index <= index <= last_index:
        raise LogIndexError(f"index {index} is outside the log [{first_index}, {last_index}]")


def check_range(low: int, high: int, first_index: int, last_index: int) -> None:
    """A half-open range [low, high) must lie inside the log; an empty one may sit at its ends."""
    if low > high:
        raise LogIndexError(f"range [{low}, {high}) has low > high")
    if low < first_index or high > last_index + 1:
        raise LogIndexError(
            f"range [{low}, {high}) is outside the log [{first_index}, {last_index}]"
        )


def check_truncate_suffix(last_kept: int, first_index: int, last_index: int) -> None:
    if last_kept < first_index - 1:
        raise InvalidTruncateError(
            f"truncate_suffix({last_kept}) is below first_index - 1 = {first_index - 1}"
        )


def check_truncate_prefix(first_kept: int, first_index: int, last_index: int) -> None:
    if first_kept < first_index:
        raise InvalidTruncateError(
            f"truncate_prefix({first_kept}) is below first_index = {first_index}"
        )
    if first_kept > last_index + 1:
        raise InvalidTruncateError(
            f"truncate_prefix({first_kept}) is past last_index + 1 = {last_index + 1}; "
            "use reset() to move an empty log forward"
        )


def check_reset(next_index: int) -> None:
    if next_index < 1:
        raise InvalidTruncateError(f"reset({next_index}): indexes start at 1")

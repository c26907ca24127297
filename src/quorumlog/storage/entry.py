"""The log entry every store holds: an index, a term, a type and opaque data."""

from __future__ import annotations

import enum

import msgspec


class EntryType(enum.IntEnum):
    """What an entry carries. Stored in one byte on disk, so values stay below 256."""

    DATA = 1
    """Application data (a batch of commands or records)."""
    NO_OP = 2
    """Appended by a new leader to commit entries of earlier terms (Raft §5.4.2)."""
    CONFIGURATION = 3
    """A membership change."""


class LogEntry(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One entry of a replicated log.

    `index` counts from 1 with no gaps; `term` is the leader term that created it.
    """

    index: int
    term: int
    data: bytes = b""
    type: EntryType = EntryType.DATA

"""What the simulated disk holds: files and directories, each with current and durable
state and the unsynced changes in between, and what a power loss makes of them.

See quorumlog.testing.sim.filesystem for the model as a whole.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Write:
    offset: int
    data: bytes


@dataclass(slots=True, frozen=True)
class Truncate:
    size: int


FileChange = Write | Truncate


class SimFile:
    """One file (an inode): its current and durable contents and the writes in between."""

    __slots__ = ("current", "durable", "unsynced")

    def __init__(self) -> None:
        self.current = bytearray()
        self.durable = bytearray()
        self.unsynced: list[FileChange] = []

    def change(self, change: FileChange) -> None:
        apply_change(self.current, change)
        self.unsynced.append(change)

    def sync(self) -> None:
        for change in self.unsynced:
            apply_change(self.durable, change)
        self.unsynced = []


@dataclass(slots=True, frozen=True)
class Link:
    name: str
    node: SimFile | SimDirectory


@dataclass(slots=True, frozen=True)
class Unlink:
    name: str


@dataclass(slots=True, frozen=True)
class Rename:
    source: str
    target: str


DirectoryChange = Link | Unlink | Rename


class SimDirectory:
    """One directory: its current and durable names and the changes in between."""

    __slots__ = ("durable_entries", "entries", "unsynced")

    def __init__(self) -> None:
        self.entries: dict[str, SimFile | SimDirectory] = {}
        self.durable_entries: dict[str, SimFile | SimDirectory] = {}
        self.unsynced: list[DirectoryChange] = []

    def change(self, change: DirectoryChange) -> None:
        apply_directory_change(self.entries, change)
        self.unsynced.append(change)

    def sync(self) -> None:
        self.durable_entries = dict(self.entries)
        self.unsynced = []


def apply_change(contents: bytearray, change: FileChange) -> None:
    if isinstance(change, Write):
        if change.offset > len(contents):
            contents.extend(bytes(change.offset - len(contents)))
        contents[change.offset : change.offset + len(change.data)] = change.data
    elif change.size < len(contents):
        del contents[change.size :]
    else:
        contents.extend(bytes(change.size - len(contents)))


def apply_directory_change(
    entries: dict[str, SimFile | SimDirectory], change: DirectoryChange
) -> None:
    if isinstance(change, Link):
        entries[change.name] = change.node
    elif isinstance(change, Unlink):
        entries.pop(change.name, None)
    else:
        node = entries.pop(change.source, None)
        if node is not None:
            entries[change.target] = node


# --- a power loss ------------------------------------------------------------------------


@dataclass(slots=True)
class CrashCounts:
    """What a power loss took, counted while it is worked out (see DiskCrashReport)."""

    file_changes_lost: int = 0
    writes_torn: int = 0
    directory_changes_lost: int = 0


def settle_file(node: SimFile, rng: random.Random, keep: bool, counts: CrashCounts) -> None:
    """Make the file what a power loss leaves: its durable contents plus a seeded prefix of
    its unsynced changes, the last kept write possibly torn."""
    changes = node.unsynced
    kept = rng.randint(0, len(changes)) if keep and changes else 0
    counts.file_changes_lost += len(changes) - kept
    durable = node.durable
    for change in changes[: kept - 1] if kept else ():
        apply_change(durable, change)
    if kept:
        last = changes[kept - 1]
        if isinstance(last, Write):
            tear_write(durable, last, rng, counts)
        else:
            apply_change(durable, last)
    node.unsynced = []
    node.current = bytearray(durable)


def tear_write(durable: bytearray, write: Write, rng: random.Random, counts: CrashCounts) -> None:
    """Keep the first `cut` bytes of a write; past the old end, the rest may read as zeros."""
    cut = rng.randint(0, len(write.data))
    zero_filled = cut < len(write.data) and rng.random() < 0.5
    apply_change(durable, Write(write.offset, write.data[:cut]))
    if cut < len(write.data):
        counts.writes_torn += 1
    if zero_filled and write.offset + len(write.data) > len(durable):
        durable.extend(bytes(write.offset + len(write.data) - len(durable)))


def settle_directory(
    directory: SimDirectory, rng: random.Random, keep: bool, counts: CrashCounts
) -> None:
    """Make the directory what a power loss leaves: its durable names plus a seeded prefix of
    its unsynced changes; then the same for every directory and file it still names."""
    kept = rng.randint(0, len(directory.unsynced)) if keep and directory.unsynced else 0
    entries = dict(directory.durable_entries)
    for change in directory.unsynced[:kept]:
        apply_directory_change(entries, change)
    counts.directory_changes_lost += len(directory.unsynced) - kept
    directory.entries = entries
    directory.sync()
    for name in sorted(entries):
        node = entries[name]
        if isinstance(node, SimDirectory):
            settle_directory(node, rng, keep, counts)
        else:
            settle_file(node, rng, keep, counts)

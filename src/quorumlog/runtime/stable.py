"""Durable state beside the log: the hard state file and the snapshot files.

Both are small files replaced atomically (temp file, fsync, rename, fsync directory) and
carry a CRC32C, so a crash leaves the old or the new version and damage is detected. Every
file operation goes through the `FileSystem` given (the operating system's by default; the
simulator gives its byte-level disk).

Only term and vote must be durable before a node answers (a vote is a promise). The commit
index is saved along when term or vote change, and otherwise not: after a restart the
commit index restarts from the last saved value or the snapshot, a lower bound that is
still correct, and the leader tells the rest.
"""

from __future__ import annotations

import struct
from pathlib import Path

import google_crc32c
import msgspec

from quorumlog.errors import CorruptLogError
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.storage.filesystem import (
    OS_FILE_SYSTEM,
    FileSystem,
    atomic_write,
    ensure_directory,
)

CHECKSUM = struct.Struct(">I")
HARD_STATE_FILE = "hard_state"
SNAPSHOT_PREFIX = "snapshot_"


def seal(payload: bytes) -> bytes:
    return CHECKSUM.pack(google_crc32c.value(payload)) + payload


def unseal(path: Path, data: bytes) -> bytes:
    if len(data) < CHECKSUM.size:
        raise CorruptLogError(str(path), 0, "file shorter than its checksum")
    (expected,) = CHECKSUM.unpack_from(data)
    payload = data[CHECKSUM.size :]
    if google_crc32c.value(payload) != expected:
        raise CorruptLogError(str(path), 0, "checksum mismatch")
    return payload


class HardStateFile:
    """The node's term, vote and commit index in `<directory>/hard_state`."""

    def __init__(self, directory: Path, file_system: FileSystem = OS_FILE_SYSTEM) -> None:
        self.path = directory / HARD_STATE_FILE
        self.file_system = file_system
        ensure_directory(file_system, directory)
        self.saved = self.load()

    def load(self) -> HardState:
        if not self.file_system.exists(self.path):
            return HardState()
        sealed = self.file_system.read_file(self.path)
        return msgspec.msgpack.decode(unseal(self.path, sealed), type=HardState)

    def needs_save(self, state: HardState) -> bool:
        return (state.term, state.vote) != (self.saved.term, self.saved.vote)

    def save(self, state: HardState) -> None:
        atomic_write(self.path, seal(msgspec.msgpack.encode(state)), self.file_system)
        self.saved = state


class SnapshotFile(msgspec.Struct, frozen=True, array_like=True):
    meta: SnapshotMeta
    data: bytes


class SnapshotStore:
    """Keeps the newest snapshots as `snapshot_<index>_<term>` files; older ones go."""

    def __init__(
        self, directory: Path, keep: int = 2, file_system: FileSystem = OS_FILE_SYSTEM
    ) -> None:
        self.directory = directory
        self.keep = keep
        self.file_system = file_system
        ensure_directory(file_system, directory)
        for name in file_system.list_directory(directory):
            if name.endswith(".tmp"):
                # A write that crashed before its rename: never visible. Its name need not
                # go durably (a crash may bring it back, and the next start removes it again).
                file_system.unlink(directory / name)

    def paths(self) -> list[tuple[int, Path]]:
        return [(index, self.directory / name) for index, name in self.names()]

    def names(self) -> list[tuple[int, str]]:
        """(index, file name) of each snapshot, oldest first: `paths` without building a path
        for every file (a save lists them all and needs a path only for those it drops)."""
        found = []
        for name in self.file_system.list_directory(self.directory):
            if not name.startswith(SNAPSHOT_PREFIX) or name.endswith(".tmp"):
                continue
            parts = name[len(SNAPSHOT_PREFIX) :].split("_")
            if len(parts) == 2 and all(part.isdigit() for part in parts):
                found.append((int(parts[0]), name))
        return sorted(found)

    def latest(self) -> SnapshotFile | None:
        names = self.names()
        if not names:
            return None
        path = self.directory / names[-1][1]
        sealed = self.file_system.read_file(path)
        return msgspec.msgpack.decode(unseal(path, sealed), type=SnapshotFile)

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        name = f"{SNAPSHOT_PREFIX}{meta.index:020d}_{meta.term:020d}"
        sealed = seal(msgspec.msgpack.encode(SnapshotFile(meta, data)))
        atomic_write(self.directory / name, sealed, self.file_system)
        names = self.names()
        for _, old in names[: -self.keep]:
            self.file_system.unlink(self.directory / old)
        if len(names) > self.keep:
            self.file_system.sync_directory(self.directory)

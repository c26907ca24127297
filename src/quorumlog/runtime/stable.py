"""Durable state beside the log: the hard state file and the snapshot files.

Both are small files replaced atomically (temp file, fsync, rename, fsync directory) and
carry a CRC32C, so a crash leaves the old or the new version and damage is detected.

Only term and vote must be durable before a node answers (a vote is a promise). The commit
index is saved along when term or vote change, and otherwise not: after a restart the
commit index restarts from the last saved value or the snapshot, a lower bound that is
still correct, and the leader tells the rest.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import google_crc32c
import msgspec

from quorumlog.errors import CorruptLogError
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.storage.files import atomic_write, disk_errors, fsync_directory

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
    def __init__(self, directory: Path) -> None:
        self.path = directory / HARD_STATE_FILE
        self.saved = self.load()

    def load(self) -> HardState:
        if not self.path.exists():
            return HardState()
        return msgspec.msgpack.decode(unseal(self.path, self.path.read_bytes()), type=HardState)

    def needs_save(self, state: HardState) -> bool:
        return (state.term, state.vote) != (self.saved.term, self.saved.vote)

    def save(self, state: HardState) -> None:
        atomic_write(self.path, seal(msgspec.msgpack.encode(state)))
        self.saved = state


class SnapshotFile(msgspec.Struct, frozen=True, array_like=True):
    meta: SnapshotMeta
    data: bytes


class SnapshotStore:
    """Keeps the newest snapshots as `snapshot_<index>_<term>` files; older ones go."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = directory
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.tmp"):
            leftover.unlink()  # a write that crashed before its rename: never visible

    def paths(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.glob(SNAPSHOT_PREFIX + "*"):
            parts = path.name[len(SNAPSHOT_PREFIX) :].split("_")
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                found.append((int(parts[0]), path))
        return sorted(found)

    def latest(self) -> SnapshotFile | None:
        paths = self.paths()
        if not paths:
            return None
        path = paths[-1][1]
        return msgspec.msgpack.decode(unseal(path, path.read_bytes()), type=SnapshotFile)

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        name = f"{SNAPSHOT_PREFIX}{meta.index:020d}_{meta.term:020d}"
        atomic_write(self.directory / name, seal(msgspec.msgpack.encode(SnapshotFile(meta, data))))
        paths = self.paths()
        with disk_errors(self.directory):
            for _, old in paths[: -self.keep]:
                os.unlink(old)
            if len(paths) > self.keep:
                fsync_directory(self.directory)

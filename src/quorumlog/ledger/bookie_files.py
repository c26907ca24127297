"""The file operations bookie storage does: the shared `FileSystem` of storage/filesystem.py.

Bookie storage does every file operation through a `FileSystem` it is handed, so the
simulator can give it a simulated disk (`SimFileSystem`); the real one is `OS_FILE_SYSTEM`.

The durability contract the storage relies on (and the simulated disk enforces):

- A write is readable at once and durable only once that file's `sync_data` (or `sync`)
  returns; a crash may keep any prefix of the unsynced writes, the last one torn.
- Creating, renaming or unlinking a name is durable only once `sync_directory` of its
  directory returns.

Every method raises `DiskFullError` when the disk has no room and `StorageError` for any
other failure, naming the path; never a bare `OSError`.
"""

from __future__ import annotations

from pathlib import Path

from quorumlog.storage.filesystem import (
    OS_FILE_SYSTEM,
    DirectoryLock,
    FileHandle,
    FileSystem,
    ensure_directory,
)

BookieFileHandle = FileHandle
BookieDirectoryLock = DirectoryLock
BookieFileSystem = FileSystem
OS_BOOKIE_FILE_SYSTEM: FileSystem = OS_FILE_SYSTEM
"""The real disk: the same file system the log stores use."""


def atomic_write(file_system: FileSystem, path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a crash leaves the old or the new content, never a mix.
    (Like storage.filesystem's, but it needs of a handle only `sync_data`.)"""
    temporary = path.with_name(path.name + ".tmp")
    handle = file_system.create_file(temporary, exclusive=False)
    try:
        handle.write_at(data, 0)
        handle.sync_data()
    finally:
        handle.close()
    file_system.rename(temporary, path)
    file_system.sync_directory(path.parent)


__all__ = [
    "OS_BOOKIE_FILE_SYSTEM",
    "BookieDirectoryLock",
    "BookieFileHandle",
    "BookieFileSystem",
    "atomic_write",
    "ensure_directory",
]

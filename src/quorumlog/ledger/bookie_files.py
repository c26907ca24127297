"""The file operations bookie storage does, behind one small interface, and the OS version.

Every OS call of bookie storage is here, so the simulator can hand the storage a simulated
disk instead. The interface is, method for method, a subset of `FileSystem` / `FileHandle`
in `quorumlog.storage.filesystem` (the injected file system the log stores are moving to):
that module's `OS_FILE_SYSTEM` and the simulator's `SimFileSystem` satisfy it as they are,
and `OS_BOOKIE_FILE_SYSTEM` is that `OS_FILE_SYSTEM`.

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
from typing import Protocol

from quorumlog.storage.filesystem import OS_FILE_SYSTEM


class BookieFileHandle(Protocol):
    """An open file. Offsets and sizes are in bytes."""

    @property
    def path(self) -> Path: ...

    def read_at(self, size: int, offset: int) -> bytes:
        """Up to `size` bytes from `offset` (fewer only where the file ends)."""
        ...

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset` (a short write is finished or raises)."""
        ...

    def size(self) -> int: ...

    def truncate(self, size: int) -> None: ...

    def sync_data(self) -> None:
        """fdatasync: the contents (and the size) become durable."""
        ...

    def close(self) -> None: ...


class BookieDirectoryLock(Protocol):
    def release(self) -> None: ...


class BookieFileSystem(Protocol):
    def open_file(self, path: Path, *, writable: bool = False) -> BookieFileHandle: ...

    def create_file(self, path: Path, *, exclusive: bool = True) -> BookieFileHandle:
        """Create and open for reading and writing; if it exists, raise when `exclusive`,
        otherwise empty it."""
        ...

    def read_file(self, path: Path) -> bytes: ...

    def list_directory(self, path: Path) -> list[str]:
        """The names in a directory, sorted."""
        ...

    def exists(self, path: Path) -> bool: ...

    def make_directory(self, path: Path) -> None: ...

    def rename(self, source: Path, target: Path) -> None: ...

    def unlink(self, path: Path) -> None: ...

    def sync_directory(self, path: Path) -> None: ...

    def lock_directory(self, path: Path) -> BookieDirectoryLock:
        """The directory's exclusive lock; DirectoryInUseError if another holder has it."""
        ...


# --- the operating system's files ----------------------------------------------------------


OS_BOOKIE_FILE_SYSTEM: BookieFileSystem = OS_FILE_SYSTEM
"""The real disk: the same file system the log stores use."""


def ensure_directory(file_system: BookieFileSystem, path: Path) -> None:
    """Create `path` and its missing parents, each made durable in its parent."""
    missing: list[Path] = []
    while not file_system.exists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        file_system.make_directory(directory)
        file_system.sync_directory(directory.parent)


def atomic_write(file_system: BookieFileSystem, path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a crash leaves the old or the new content, never a mix."""
    temporary = path.with_name(path.name + ".tmp")
    handle = file_system.create_file(temporary, exclusive=False)
    try:
        handle.write_at(data, 0)
        handle.sync_data()
    finally:
        handle.close()
    file_system.rename(temporary, path)
    file_system.sync_directory(path.parent)

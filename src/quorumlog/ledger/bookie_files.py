"""The file operations bookie storage does, behind one small interface, and the OS version.

Every OS call of bookie storage is here, so the simulator can hand the storage a simulated
disk instead. The interface is, method for method, a subset of `FileSystem` / `FileHandle`
in `quorumlog.storage.filesystem` (the injected file system the log stores are moving to):
that module's `OS_FILE_SYSTEM` and the simulator's `SimFileSystem` satisfy it as they are,
and `OsBookieFileSystem` below can give way to `OS_FILE_SYSTEM` once both are on one branch.

The durability contract the storage relies on (and the simulated disk enforces):

- A write is readable at once and durable only once that file's `sync_data` (or `sync`)
  returns; a crash may keep any prefix of the unsynced writes, the last one torn.
- Creating, renaming or unlinking a name is durable only once `sync_directory` of its
  directory returns.

Every method raises `DiskFullError` when the disk has no room and `StorageError` for any
other failure, naming the path; never a bare `OSError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from quorumlog.storage.files import disk_errors, fsync_directory, lock_directory


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


class OsBookieFileHandle:
    __slots__ = ("_descriptor", "_path")

    def __init__(self, path: Path, descriptor: int) -> None:
        self._path = path
        self._descriptor = descriptor

    @property
    def path(self) -> Path:
        return self._path

    def read_at(self, size: int, offset: int) -> bytes:
        with disk_errors(self._path):
            return os.pread(self._descriptor, size, offset)

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        with disk_errors(self._path), memoryview(data) as view:
            written = 0
            # A short write is legal (and what a disk filling up looks like): finish it.
            while written < len(view):
                written += os.pwrite(self._descriptor, view[written:], offset + written)

    def size(self) -> int:
        with disk_errors(self._path):
            return os.fstat(self._descriptor).st_size

    def truncate(self, size: int) -> None:
        with disk_errors(self._path):
            os.ftruncate(self._descriptor, size)

    def sync_data(self) -> None:
        with disk_errors(self._path):
            os.fdatasync(self._descriptor)

    def close(self) -> None:
        if self._descriptor < 0:
            return
        descriptor, self._descriptor = self._descriptor, -1
        with disk_errors(self._path):
            os.close(descriptor)


class OsBookieDirectoryLock:
    __slots__ = ("_descriptor",)

    def __init__(self, descriptor: int) -> None:
        self._descriptor = descriptor

    def release(self) -> None:
        if self._descriptor >= 0:
            descriptor, self._descriptor = self._descriptor, -1
            os.close(descriptor)


class OsBookieFileSystem:
    def open_file(self, path: Path, *, writable: bool = False) -> BookieFileHandle:
        with disk_errors(path):
            return OsBookieFileHandle(path, os.open(path, os.O_RDWR if writable else os.O_RDONLY))

    def create_file(self, path: Path, *, exclusive: bool = True) -> BookieFileHandle:
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        with disk_errors(path):
            return OsBookieFileHandle(path, os.open(path, flags, 0o644))

    def read_file(self, path: Path) -> bytes:
        with disk_errors(path):
            return path.read_bytes()

    def list_directory(self, path: Path) -> list[str]:
        with disk_errors(path):
            return sorted(os.listdir(path))

    def exists(self, path: Path) -> bool:
        return os.path.exists(path)

    def make_directory(self, path: Path) -> None:
        with disk_errors(path):
            os.mkdir(path)

    def rename(self, source: Path, target: Path) -> None:
        with disk_errors(source):
            os.rename(source, target)

    def unlink(self, path: Path) -> None:
        with disk_errors(path):
            os.unlink(path)

    def sync_directory(self, path: Path) -> None:
        with disk_errors(path):
            fsync_directory(path)

    def lock_directory(self, path: Path) -> BookieDirectoryLock:
        return OsBookieDirectoryLock(lock_directory(path))


OS_BOOKIE_FILE_SYSTEM: BookieFileSystem = OsBookieFileSystem()


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

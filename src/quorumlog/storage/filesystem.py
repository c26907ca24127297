"""The file system the file stores run on: a narrow interface, and the OS implementation.

`SegmentLogStore` and the runtime's small durable files (`HardStateFile`, `SnapshotStore`)
do every file operation through a `FileSystem` handed to them; by default `OS_FILE_SYSTEM`,
which calls `os.*`. The simulator hands them `quorumlog.testing.sim.filesystem.SimFileSystem`
instead, a byte-level disk that loses unsynced bytes at a crash, so the code that ships is the
code whose crash behaviour is tested. (`MmapLogStore` stays on real files: memory mappings
cannot be simulated cheaply. The simulator runs the segment store.)

The durability contract, which the simulated disk enforces to the letter:

- A write (`FileHandle.write_at`, `truncate`) is readable at once and durable only once that
  file's `sync` or `sync_data` returns. A crash before that may keep none, some or all of the
  writes since the last sync, in order, the last kept one possibly torn at any byte.
- A change to a directory's names (`create_file`, `make_directory`, `rename`, `unlink`) is
  durable only once `sync_directory` of that directory returns. A crash before that may undo
  it: a created file vanishes, a rename reverts, an unlinked file comes back.
- Syncing a file does not make its name durable, and syncing a directory does not make its
  files' contents durable: a new file needs both.

Errors: every method raises `DiskFullError` when the disk has no room (ENOSPC, EDQUOT) and
`StorageError` for any other failure, naming the path; never a bare `OSError`.

An optional ability is its own interface: `MappableFileHandle`, a file that can be read
through a memory mapping (the OS handles can; readers fall back to `read_at` otherwise).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol, runtime_checkable

from quorumlog.errors import StorageError
from quorumlog.storage.files import disk_errors, fsync_directory, lock_directory, storage_error


class FileHandle(Protocol):
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

    def sync(self) -> None:
        """fsync: the contents and the file's metadata become durable."""
        ...

    def sync_data(self) -> None:
        """fdatasync: the contents (and the size) become durable; cheaper than `sync`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class MappableFileHandle(FileHandle, Protocol):
    """A file that can also be read through a memory mapping (an optional ability).

    Opening a log reads every segment whole; a mapping saves copying it into memory first.
    Readers check for this ability and read with `read_at` where it is missing.
    """

    def map_for_reading(self) -> AbstractContextManager[mmap.mmap]:
        """A read-only mapping of the whole file, which must not be empty."""
        ...


class DirectoryLock(Protocol):
    """An exclusive lock on a store directory, held until released or the process dies."""

    def release(self) -> None: ...


class FileSystem(Protocol):
    """The file operations the file stores need, and nothing more (see the module docs)."""

    def open_file(self, path: Path, *, writable: bool = False) -> FileHandle:
        """Open an existing file."""
        ...

    def create_file(self, path: Path, *, exclusive: bool = True) -> FileHandle:
        """Create a file and open it for reading and writing. If it exists: raise when
        `exclusive`, otherwise empty it."""
        ...

    def read_file(self, path: Path) -> bytes:
        """The whole contents of a (small) file."""
        ...

    def list_directory(self, path: Path) -> list[str]:
        """The names in a directory, sorted."""
        ...

    def exists(self, path: Path) -> bool: ...

    def make_directory(self, path: Path) -> None:
        """Create one directory; its parent must exist. See `ensure_directory`."""
        ...

    def rename(self, source: Path, target: Path) -> None:
        """Rename atomically within one directory, replacing `target` if it exists."""
        ...

    def unlink(self, path: Path) -> None: ...

    def sync_directory(self, path: Path) -> None:
        """Make the creations, renames and unlinks in directory `path` durable."""
        ...

    def lock_directory(self, path: Path) -> DirectoryLock:
        """Take the directory's exclusive lock; DirectoryInUseError if it is held."""
        ...


# --- the operating system's file system --------------------------------------------------


class OsFileHandle:
    """A file descriptor. Calls `os.*` at call time (tests replace them to inject faults)."""

    __slots__ = ("_descriptor", "_path")

    def __init__(self, path: Path, descriptor: int) -> None:
        self._path = path
        self._descriptor = descriptor

    @property
    def path(self) -> Path:
        return self._path

    def read_at(self, size: int, offset: int) -> bytes:
        try:
            return os.pread(self._descriptor, size, offset)
        except OSError as error:
            raise storage_error(self._path, error) from error

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        try:
            written = os.pwrite(self._descriptor, data, offset)
            if written == len(data):
                return
            # A short write is legal (and what a disk filling up looks like): finish it.
            with memoryview(data) as view:
                while written < len(view):
                    written += os.pwrite(self._descriptor, view[written:], offset + written)
        except OSError as error:
            raise storage_error(self._path, error) from error

    def size(self) -> int:
        try:
            return os.fstat(self._descriptor).st_size
        except OSError as error:
            raise storage_error(self._path, error) from error

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self._descriptor, size)
        except OSError as error:
            raise storage_error(self._path, error) from error

    def sync(self) -> None:
        try:
            os.fsync(self._descriptor)
        except OSError as error:
            raise storage_error(self._path, error) from error

    def sync_data(self) -> None:
        try:
            os.fdatasync(self._descriptor)
        except OSError as error:
            raise storage_error(self._path, error) from error

    @contextmanager
    def map_for_reading(self) -> Iterator[mmap.mmap]:
        with disk_errors(self._path):
            view = mmap.mmap(self._descriptor, 0, access=mmap.ACCESS_READ)
        with view:
            yield view

    def close(self) -> None:
        if self._descriptor < 0:
            return
        descriptor = self._descriptor
        self._descriptor = -1
        try:
            os.close(descriptor)
        except OSError as error:
            raise storage_error(self._path, error) from error

    def __repr__(self) -> str:
        return f"OsFileHandle({str(self._path)!r}, descriptor={self._descriptor})"


class OsDirectoryLock:
    """The flock of a store directory's LOCK file (see `files.lock_directory`)."""

    __slots__ = ("_descriptor",)

    def __init__(self, descriptor: int) -> None:
        self._descriptor = descriptor

    def release(self) -> None:
        if self._descriptor >= 0:
            descriptor = self._descriptor
            self._descriptor = -1
            os.close(descriptor)


class OsFileSystem:
    """The `FileSystem` of the operating system: `os.*` calls, errors mapped to typed ones."""

    def open_file(self, path: Path, *, writable: bool = False) -> FileHandle:
        flags = os.O_RDWR if writable else os.O_RDONLY
        with disk_errors(path):
            return OsFileHandle(path, os.open(path, flags))

    def create_file(self, path: Path, *, exclusive: bool = True) -> FileHandle:
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        with disk_errors(path):
            return OsFileHandle(path, os.open(path, flags, 0o644))

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

    def lock_directory(self, path: Path) -> DirectoryLock:
        return OsDirectoryLock(lock_directory(path))

    def __repr__(self) -> str:
        return "OsFileSystem()"


OS_FILE_SYSTEM: FileSystem = OsFileSystem()
"""The default of every store: the operating system's files."""


# --- what the stores build from the operations ------------------------------------------


def ensure_directory(file_system: FileSystem, path: Path) -> None:
    """Create `path` and any missing parents, each made durable in its parent directory."""
    if file_system.exists(path):
        return
    missing: list[Path] = []
    while not file_system.exists(path):
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            file_system.make_directory(directory)
        except StorageError:
            if not file_system.exists(directory):
                raise  # not a concurrent creation of the same directory
        file_system.sync_directory(directory.parent)


def atomic_write(path: Path, data: bytes, file_system: FileSystem = OS_FILE_SYSTEM) -> None:
    """Replace `path` with `data` so a crash leaves either the old or the new content.

    Write a temporary file beside it, sync it, rename it over `path`, sync the directory.
    """
    temporary = path.with_name(path.name + ".tmp")
    handle = file_system.create_file(temporary, exclusive=False)
    try:
        handle.write_at(data, 0)
        handle.sync()
    finally:
        handle.close()
    file_system.rename(temporary, path)
    file_system.sync_directory(path.parent)

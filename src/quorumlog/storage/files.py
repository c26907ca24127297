"""OS-level file helpers: the directory lock, directory fsync, OS errors to typed errors.

`filesystem.OsFileSystem` is built on these; `MmapLogStore` (which stays on real files) uses
them directly. Why a directory fsync: a rename or unlink is durable only once the directory
that holds the name is synced; without it a crash can bring back the old name (POSIX leaves
it open).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quorumlog.errors import DirectoryInUseError, DiskFullError, StorageError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

LOCK_FILE_NAME = "LOCK"


def lock_directory(directory: str | os.PathLike[str]) -> int:
    """Take the exclusive lock of a store directory; returns the descriptor holding it
    (closing it releases the lock). Raises DirectoryInUseError if another open store holds
    it. An flock dies with its process, SIGKILL included, so a crash leaves no stale lock.
    """
    path = Path(directory) / LOCK_FILE_NAME
    with disk_errors(path):
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
        os.close(descriptor)
        raise DirectoryInUseError(
            f"{os.fspath(directory)} is in use by another open store (lock {path})"
        ) from error
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def storage_error(path: str | os.PathLike[str], error: OSError) -> StorageError:
    """The typed error for an OS error on `path`: ENOSPC/EDQUOT become `DiskFullError`."""
    if error.errno in DISK_FULL_ERRNOS:
        return DiskFullError(f"disk full while writing {os.fspath(path)}: {error}")
    return StorageError(f"I/O error on {os.fspath(path)}: {error}")


@contextmanager
def disk_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn OS errors into typed storage errors (see `storage_error`)."""
    try:
        yield
    except OSError as error:
        raise storage_error(path, error) from error


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make renames, creations and unlinks in `directory` durable."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

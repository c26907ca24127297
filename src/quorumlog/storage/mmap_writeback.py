"""Starting the write-back of a file range without waiting for it (Linux `sync_file_range`).

The mmap store writes zeros ahead of its appends (see `MappedFileList.zero_ahead`) and wants
them on disk soon, but not on the path of a sync, and apart from the appended data: its
zeroing thread writes a chunk back on its own (`write_back`) before its fdatasync, which then
finds only the few pages appended meanwhile. The kernel's own flusher would start only after
about 30 seconds. Python's `os` has
no `sync_file_range`, so it is called through ctypes. Where the call is missing (not Linux,
a libc without it, or a file system that refuses it) `writeback_available` says so and the
store writes no zeros ahead: left to the kernel's flusher they would cost disk writes and
save nothing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable

SYNC_FILE_RANGE_WAIT_BEFORE = 1
"""Wait for write-out of the range already under way before starting more."""
SYNC_FILE_RANGE_WRITE = 2
"""Start write-out of the dirty pages in the range that are not under write-out yet."""
SYNC_FILE_RANGE_WAIT_AFTER = 4
"""Wait for the write-out of the range to finish."""

UNSUPPORTED_ERRNOS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE, errno.EINVAL})
"""Errors that say the call cannot work here (not that the disk failed): after one, the
call is not made again in this process."""

_SyncFileRange = Callable[[int, int, int, int], int]


def _load_sync_file_range() -> _SyncFileRange | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    loaded: _SyncFileRange = function
    return loaded


_sync_file_range = _load_sync_file_range()


def writeback_available() -> bool:
    return _sync_file_range is not None


def start_writeback(descriptor: int, offset: int, length: int) -> bool:
    """Start writing [offset, offset + length) of the file to disk and return at once.

    Returns False where this cannot be done (nothing happened; see UNSUPPORTED_ERRNOS).
    Raises OSError for other errors (EIO from an earlier failed write-back of the file,
    EBADF).
    """
    return _call(descriptor, offset, length, SYNC_FILE_RANGE_WRITE)


def write_back(descriptor: int, offset: int, length: int) -> bool:
    """Write [offset, offset + length) of the file to disk and wait for it: the range's
    data only, not the file's metadata and not through the disk's cache (that takes an
    fdatasync). Returns and raises as `start_writeback`."""
    flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
    return _call(descriptor, offset, length, flags)


def _call(descriptor: int, offset: int, length: int, flags: int) -> bool:
    global _sync_file_range
    if _sync_file_range is None:
        return False
    if _sync_file_range(descriptor, offset, length, flags) != 0:
        number = ctypes.get_errno()
        if number in UNSUPPORTED_ERRNOS:
            _sync_file_range = None
            return False
        raise OSError(number, os.strerror(number))
    return True


__all__ = ["start_writeback", "write_back", "writeback_available"]

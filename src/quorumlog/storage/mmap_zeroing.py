"""Writing zeros ahead of the mmap store's appends from a thread (see `MappedFileList.zero_ahead`).

Zeros past the end of a stream turn the file's fallocated "unwritten" blocks into written
ones, so that syncs of later appends overwrite written blocks and commit no journal. Written
on the appending thread, a chunk of zeros cost that thread the write of the chunk, and the
next sync waited for the chunk's block conversion to be committed (2-4 ms once per 1 MiB on
the bench VM). Here one daemon thread, shared by every stream of the process, writes and syncs
each chunk (`write_zeros`), which commits the conversion; the appending thread only queues
the chunk.

Rules that keep the zeros off the entries:
- a chunk lies wholly past the end of its stream when it is queued;
- before writing into a stream the appending thread waits for every queued chunk that
  begins below the end of what it writes (`ZeroQueue.wait_below`); with the lead that
  `zero_ahead` keeps, the chunk is done long before and nothing waits;
- before anything that moves a stream's end back or removes, truncates or closes its files,
  the stream waits for all its chunks (`ZeroQueue.drain`): a chunk is never written into a
  file whose contents changed since it was queued;
- each chunk carries a descriptor of its own (a duplicate, closed by the thread), so it
  writes the file it was queued for, even if that file was unlinked meanwhile.

A chunk that fails (EIO; ENOSPC on a file system that does not honour fallocate) fails its
stream's zeros: the error is raised once, by the next `wait_below` of that stream, whose
caller has not written anything yet; the stream then writes no more zeros ahead.
Why zero bytes and not a fallocate (session 10, kernel 6.18, ext4 on virtio-blk): the zeros
are not what makes the bytes past the end read as zero after a crash (the preallocated
"unwritten" extents already do); they make the extents written. fallocate mode 0 and
FALLOC_FL_ZERO_RANGE both leave the range unwritten (`filefrag -v` shows the flag), so every
sync would commit the conversion again; FALLOC_FL_WRITE_ZEROES, which allocates written
extents without writing zero bytes, needs a disk that zeroes on unmap and fails with
EOPNOTSUPP on the bench VM (its `write_zeroes_max_bytes` is 0).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Final

from quorumlog.raft.invariants import require
from quorumlog.storage.mmap_writeback import UNSUPPORTED_ERRNOS, write_back

ZERO_CHUNK_BYTES_MAX: Final = 4 * 1024 * 1024
_ZEROS = bytes(ZERO_CHUNK_BYTES_MAX)
_RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)
_dsync_writes = _RWF_DSYNC != 0 and hasattr(os, "pwritev")
"""Whether pwritev takes RWF_DSYNC here; cleared after the first refusal."""


class ZeroChunk:
    """Zeros to write at `offset` of the file behind `descriptor`, which is stream positions
    [low, high) of the queue's stream."""

    __slots__ = ("descriptor", "high", "low", "offset", "queue")

    def __init__(self, queue: ZeroQueue, descriptor: int, offset: int, low: int, high: int) -> None:
        self.queue = queue
        self.descriptor = descriptor
        self.offset = offset
        self.low = low
        self.high = high


class ZeroQueue:
    """The chunks of zeros queued for one stream (one `MappedFileList`)."""

    def __init__(self) -> None:
        self.pending: deque[ZeroChunk] = deque()
        """Queued or being written, lowest first; changed only under `_condition`."""
        self.failure: Exception | None = None
        """The error of a failed chunk, until the stream's thread raises it."""
        self.failed = False
        """A chunk failed: queue no more (the stream writes no zeros ahead any more)."""
        self.waits = 0
        """Times the stream's thread had to wait for a chunk (`wait_below`, `drain`): a
        count to watch, since appends should outrun the zeros rarely."""

    def submit(self, descriptor: int, offset: int, low: int, high: int) -> None:
        """Queue zeros for stream positions [low, high), at `offset` of the file behind
        `descriptor`, which this call takes over (the thread closes it)."""
        require(0 < high - low <= ZERO_CHUNK_BYTES_MAX, "zero chunk [%d, %d) too large", low, high)
        chunk = ZeroChunk(self, descriptor, offset, low, high)
        with _condition:
            self.pending.append(chunk)
            _chunks.append(chunk)
            _start_worker()
            _condition.notify_all()

    def wait_below(self, position: int) -> None:
        """Return once no queued chunk begins below `position`; raise a chunk's failure."""
        if not self.pending and self.failure is None:
            return  # the usual case; a deque's length is read atomically
        with _condition:
            if self.pending and self.pending[0].low < position:
                self.waits += 1
                while self.pending and self.pending[0].low < position:
                    _condition.wait()
            self._raise_failure()

    def drain(self) -> None:
        """Return once every queued chunk is done. A failure stays for `wait_below` to
        raise: this runs in cleanups and closes, where it must not hide another error."""
        if not self.pending:
            return
        with _condition:
            if self.pending:
                self.waits += 1
                while self.pending:
                    _condition.wait()

    def _raise_failure(self) -> None:
        failure = self.failure
        if failure is not None:
            self.failure = None
            raise failure


_condition = threading.Condition()
_chunks: deque[ZeroChunk] = deque()
"""Chunks of every queue, in the order queued; the worker takes them from the left."""
_worker: threading.Thread | None = None


def _start_worker() -> None:
    global _worker
    if _worker is None or not _worker.is_alive():
        _worker = threading.Thread(target=_work, name="quorumlog-zeros", daemon=True)
        _worker.start()


def _work() -> None:
    while True:
        with _condition:
            while not _chunks:
                _condition.wait()
            chunk = _chunks[0]
        error: Exception | None = None
        try:
            if not chunk.queue.failed:
                write_zeros(chunk.descriptor, chunk.offset, chunk.high - chunk.low)
        except Exception as raised:  # any failure is the stream's, raised on its own thread
            error = raised
        finally:
            os.close(chunk.descriptor)
        with _condition:
            _chunks.popleft()
            queue = chunk.queue
            queue.pending.popleft()
            if error is not None and not queue.failed:
                queue.failed = True
                queue.failure = error
            _condition.notify_all()


def _forget_after_fork() -> None:
    """In a forked child: the parent's thread writes the parent's chunks; the child has no
    thread, and `_condition` may have been held by it at the fork."""
    global _condition, _worker
    for chunk in _chunks:
        chunk.queue.pending.clear()
        os.close(chunk.descriptor)
    _chunks.clear()
    _condition = threading.Condition()
    _worker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def write_zeros(descriptor: int, offset: int, length: int) -> None:
    """Write `length` zeros at `offset` and sync them, which also commits the block
    conversion they cause, so that no sync of the appending thread has to.

    One pwritev with RWF_DSYNC where the system has it: a single call, so the thread needs
    the GIL once per chunk (it gets it only when the appending thread blocks in a system
    call), and a sync of this range only, where an fdatasync would also take the pages
    appended meanwhile and make the appending thread's own sync of them wait behind the
    chunk. Elsewhere: the chunk's write-back first, then an fdatasync.
    """
    zeros = memoryview(_ZEROS)[:length]
    if _dsync_writes:
        try:
            written = os.pwritev(descriptor, [zeros], offset, _RWF_DSYNC)
        except OSError as error:
            if error.errno not in UNSUPPORTED_ERRNOS:
                raise
            _stop_dsync_writes()  # and write this chunk the plain way
        else:
            if written == length:
                return
            zeros = zeros[written:]  # a short write: the rest the plain way
            offset += written
            length -= written
    done = 0
    while done < length:
        done += os.pwrite(descriptor, zeros[done:], offset + done)
    write_back(descriptor, offset, length)
    os.fdatasync(descriptor)


def _stop_dsync_writes() -> None:
    global _dsync_writes
    _dsync_writes = False


__all__ = ["ZERO_CHUNK_BYTES_MAX", "ZeroQueue", "write_zeros"]

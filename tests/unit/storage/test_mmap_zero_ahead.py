"""The mmap store writes zeros past the end of its streams ahead of its appends (see
`MappedFileList.zero_ahead`): they must never touch an entry, a failure there must leave the
store as it was, and the write-back helper must report what it could not do."""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quorumlog.storage import (
    LogEntry,
    MmapLogStore,
    StorageError,
    SyncPolicy,
    mmap_files,
    mmap_store,
    mmap_writeback,
    mmap_zeroing,
)
from quorumlog.storage.mmap_files import MappedFileList
from quorumlog.storage.mmap_zeroing import ZeroQueue, write_zeros

DATA_FILE_BYTES = 16 * 1024
INDEX_FILE_BYTES = 32 * 512
PAGE_BYTES = mmap_files._PAGE_BYTES


def open_store(path: Path) -> MmapLogStore:
    return MmapLogStore.open(
        path,
        data_file_bytes=DATA_FILE_BYTES,
        index_file_bytes=INDEX_FILE_BYTES,
        entry_bytes_max=2048,
    )


def make_entries(first: int, sizes: list[int], term: int = 1) -> list[LogEntry]:
    # Bodies hold no zero byte, so zeros written over one would show.
    return [
        LogEntry(index=first + number, term=term, data=bytes([1 + (first + number) % 250]) * size)
        for number, size in enumerate(sizes)
    ]


def files_of(path: Path) -> tuple[list[str], list[str]]:
    return sorted(os.listdir(path / "data")), sorted(os.listdir(path / "index"))


class ZeroRecorder:
    """Stands in for `mmap_zeroing.write_zeros` (on the zeroing thread): records each chunk
    for a file under `directory`, fails the call numbered `failing_call` among those
    (counting from 1), and passes every chunk on. (The thread is shared: chunks of stores
    other tests left open may still come by.)"""

    def __init__(self, directory: Path, failing_call: int = 0) -> None:
        self.directory = f"{directory}/"
        self.ranges: list[tuple[str, int, int]] = []
        self.failing_call = failing_call

    def __call__(self, descriptor: int, offset: int, length: int) -> None:
        name = os.readlink(f"/proc/self/fd/{descriptor}")
        if not name.startswith(self.directory):
            write_zeros(descriptor, offset, length)
            return
        self.ranges.append((name, offset, length))
        if len(self.ranges) == self.failing_call:
            raise OSError(errno.EIO, "injected write-back error")
        write_zeros(descriptor, offset, length)


class SubmitCounter:
    """Counts the chunks of zeros queued (on the appending thread, so counts are exact)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real_submit = ZeroQueue.submit

        def counting(queue: ZeroQueue, descriptor: int, offset: int, low: int, high: int) -> None:
            self.count += 1
            real_submit(queue, descriptor, offset, low, high)

        monkeypatch.setattr(ZeroQueue, "submit", counting)


@pytest.fixture
def small_zero_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero ahead in single pages with a two-page lead, so that a few small appends cross
    many zero-ahead steps and file ends."""
    monkeypatch.setattr(mmap_files, "ZERO_AHEAD_BYTES", PAGE_BYTES)
    monkeypatch.setattr(mmap_files, "ZERO_AHEAD_LEAD_BYTES", 2 * PAGE_BYTES)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name files")
def test_zeros_start_at_the_page_after_the_end_and_go_to_disk_for_the_data_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index gets none: its slots are msynced rarely, so its blocks' conversion is
    committed rarely, and zeros would double its bytes written."""
    recorder = ZeroRecorder(tmp_path)
    monkeypatch.setattr(mmap_zeroing, "write_zeros", recorder)
    path = tmp_path / "log"
    store = open_store(path)
    entries = make_entries(1, [100] * 10)
    store.append(entries)
    data_end = store.entry_span(10)[0] + store.entry_span(10)[1]
    data_file = str(path / "data" / mmap_files.file_name(0))
    first_zero = -(-data_end // PAGE_BYTES) * PAGE_BYTES
    store.sync()
    store.close()  # waits for the zeroing thread
    assert recorder.ranges == [(data_file, first_zero, DATA_FILE_BYTES - first_zero)]
    assert Path(data_file).read_bytes()[data_end:] == bytes(DATA_FILE_BYTES - data_end)
    store = open_store(path)
    assert store.entries(1, 11) == entries
    store.close()


@pytest.mark.usefixtures("small_zero_ahead")
def test_zeros_ahead_never_touch_an_entry(tmp_path: Path) -> None:
    """Appends of random sizes across many file ends, a cut and appends after it: every
    entry reads back, before and after reopening. The zeros are written before each batch, so
    only zeros below the batch's start can hurt: small batches that start inside a page
    holding earlier entries, after large ones outran the zeros or after a reopen, test
    exactly that."""
    chooser = random.Random(13)
    path = tmp_path / "log"
    store = open_store(path)
    entries: list[LogEntry] = []
    for _ in range(60):
        # Large batches outrun the zeros; small ones then land inside one page.
        sizes = [chooser.choice([chooser.randint(1, 40), chooser.randint(500, 1500)])]
        batch = make_entries(len(entries) + 1, sizes * chooser.randint(1, 4))
        store.append(batch)
        entries.extend(batch)
        if chooser.random() < 0.5:
            store.sync()
    assert store.entries(1, len(entries) + 1) == entries
    store.truncate_suffix(70)
    del entries[70:]
    batch = make_entries(71, [chooser.randint(1, 1500) for _ in range(40)], term=2)
    store.append(batch)
    entries.extend(batch)
    store.sync()
    assert store.entries(1, len(entries) + 1) == entries
    store.close()
    store = open_store(path)
    assert store.recovery.torn_bytes_dropped == 0
    assert store.entries(1, store.last_index + 1) == entries
    # A reopened store has zeroed nothing yet: its first zeros start right after a small
    # batch that shares a page with the entries before it.
    batch = make_entries(len(entries) + 1, [10])
    store.append(batch)
    entries.extend(batch)
    store.sync()
    assert store.entries(1, len(entries) + 1) == entries
    store.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name files")
@pytest.mark.usefixtures("small_zero_ahead")
def test_a_failed_chunk_of_zeros_fails_the_next_append_cleanly_and_appends_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk fails on the zeroing thread; the next append raises its error before it
    makes or writes anything, and the store goes on without a reopen (and without zeros
    ahead in that stream)."""
    recorder = ZeroRecorder(tmp_path, failing_call=1)
    monkeypatch.setattr(mmap_zeroing, "write_zeros", recorder)
    path = tmp_path / "log"
    store = open_store(path)
    entries = make_entries(1, [100] * 5)
    store.append(entries)
    store.sync()
    store._data.zeros.drain()
    files_before = files_of(path)
    more = make_entries(6, [1500] * 12)  # needs a second data file
    with pytest.raises(StorageError, match="injected write-back error"):
        store.append(more)
    assert store.last_index == 5
    assert files_of(path) == files_before
    assert store._data.zeros.failed
    chunks_before = len(recorder.ranges)
    store.append(more)
    store.append(make_entries(18, [1500] * 12))
    store.sync()
    entries += more + make_entries(18, [1500] * 12)
    assert store.entries(1, 30) == entries
    store.close()
    assert not [name for name, _, _ in recorder.ranges[chunks_before:] if "/data/" in name]
    store = open_store(path)
    assert store.entries(1, store.last_index + 1) == entries
    store.close()


def test_the_zeroed_mark_drops_with_the_files_removed(tmp_path: Path) -> None:
    """A file made again where one was removed has unwritten blocks: it is zeroed again."""
    directory = tmp_path / "stream"
    directory.mkdir()
    files = MappedFileList(directory, DATA_FILE_BYTES)
    files.ensure(0, 2 * DATA_FILE_BYTES)
    files.zero_ahead(DATA_FILE_BYTES + 10)
    assert files.zeroed_end == 2 * DATA_FILE_BYTES
    files.remove_above(100)
    assert files.zeroed_end == DATA_FILE_BYTES
    files.remove_all()
    assert files.zeroed_end == 0
    files.close()


def test_start_writeback_reports_errors_and_where_it_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    descriptor = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, b"x" * 5000)
        if mmap_writeback.writeback_available():
            assert mmap_writeback.start_writeback(descriptor, 0, 5000)
            closed = os.dup(descriptor)
            os.close(closed)
            with pytest.raises(OSError) as raised:
                mmap_writeback.start_writeback(closed, 0, 10)
            assert raised.value.errno == errno.EBADF
            assert mmap_writeback.writeback_available()

        def refusing(descriptor: int, offset: int, length: int, flags: int) -> int:
            ctypes.set_errno(errno.ENOSYS)
            return -1

        monkeypatch.setattr(mmap_writeback, "_sync_file_range", refusing)
        assert not mmap_writeback.start_writeback(descriptor, 0, 5000)
        assert not mmap_writeback.writeback_available()
    finally:
        os.close(descriptor)


def test_without_early_write_back_no_zeros_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zeros left to the kernel's flusher would cost disk writes and save nothing."""
    monkeypatch.setattr(mmap_writeback, "_sync_file_range", None)
    writes: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(descriptor: int, data: bytes, offset: int) -> int:
        writes.append(len(data))
        return real_pwrite(descriptor, data, offset)

    path = tmp_path / "log"
    store = open_store(path)
    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    entries = make_entries(1, [100] * 10)
    store.append(entries)
    store.sync()
    assert writes == [10 * 32]  # the index slots only; the data goes by pwritev
    store.close()
    store = open_store(path)
    assert store.entries(1, 11) == entries
    store.close()


@pytest.mark.usefixtures("small_zero_ahead")
def test_zeros_are_written_ahead_only_while_syncs_are_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    submits = SubmitCounter(monkeypatch)
    monkeypatch.setattr(mmap_store, "ZERO_AHEAD_SYNC_BYTES_MAX", 1024)
    store = MmapLogStore.open(
        tmp_path / "log", data_file_bytes=1024 * 1024, index_file_bytes=INDEX_FILE_BYTES
    )
    next_index = 1

    def append_and_sync(sizes: list[int]) -> int:
        """How many chunks of zeros the append queued."""
        nonlocal next_index
        before = submits.count
        store.append(make_entries(next_index, sizes))
        store.sync()
        next_index += len(sizes)
        return submits.count - before

    assert [append_and_sync([100] * 2) for _ in range(8)].count(0) < 8
    # Syncs of 18 KB push the average past 1 KiB within two syncs; from then on, no zeros.
    assert [append_and_sync([1500] * 12) for _ in range(8)][2:] == [0] * 6
    # Small syncs bring the average down again, and the zeros back.
    assert sum(append_and_sync([100] * 2) for _ in range(40)) > 0
    store.close()


def test_no_zeros_ahead_for_a_store_that_never_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    submits = SubmitCounter(monkeypatch)
    store = MmapLogStore.open(tmp_path / "log", sync_policy=SyncPolicy.NEVER)
    store.append(make_entries(1, [100] * 10))
    store.sync()
    store.append(make_entries(11, [100] * 10))
    assert submits.count == 0
    store.close()


WAIT_SECONDS_MAX = 30.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS_MAX
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


class HeldZeros:
    """Stands in for `mmap_zeroing.write_zeros`: each chunk waits on the zeroing thread
    until the test lets it go, then is written for real and logged."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.log: list[str] = []

    def __call__(self, descriptor: int, offset: int, length: int) -> None:
        self.started.set()
        if not self.release.wait(WAIT_SECONDS_MAX):
            raise AssertionError("the test never released the zeros")
        write_zeros(descriptor, offset, length)
        self.log.append(f"zeros {offset}+{length}")


@pytest.fixture
def held_zeros(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldZeros]:
    held = HeldZeros()
    monkeypatch.setattr(mmap_zeroing, "write_zeros", held)
    yield held
    held.release.set()  # never leave the shared zeroing thread stuck for the next test


def run_while_zeros_are_held(
    held: HeldZeros, queue: ZeroQueue, operation: Callable[[], None], name: str
) -> None:
    """Run `operation` on a thread while a chunk of `queue` is held; let the chunk go once
    the operation waits for it (or, where it wrongly does not wait, once it is done), so a
    missing wait shows as zeros written after the operation."""
    waits_before = queue.waits
    failures: list[BaseException] = []

    def run() -> None:
        try:
            operation()
            held.log.append(name)
        except BaseException as error:  # reported on the test's thread
            failures.append(error)

    wait_until(held.started.is_set, "the zeroing thread holds a chunk")
    worker = threading.Thread(target=run)
    worker.start()
    wait_until(lambda: queue.waits > waits_before or not worker.is_alive(), f"{name} waits or ends")
    held.release.set()
    worker.join(WAIT_SECONDS_MAX)
    assert not worker.is_alive()
    assert not failures, failures
    wait_until(lambda: len(held.log) > 1, "the held chunk is written")
    # The held chunk went first; the operation ended after it (it may queue more itself).
    assert held.log[0].startswith("zeros") and name in held.log, held.log


@pytest.mark.usefixtures("small_zero_ahead")
def test_an_append_that_reaches_zeros_still_queued_waits_for_them(
    tmp_path: Path, held_zeros: HeldZeros
) -> None:
    """Without the wait, the held zeros would land on the second batch after it is written."""
    path = tmp_path / "log"
    store = open_store(path)
    first = make_entries(1, [100] * 4)
    store.append(first)  # queues zeros from the next page on; the thread holds them
    second = make_entries(5, [1500] * 6)  # runs over those pages
    run_while_zeros_are_held(
        held_zeros,
        store._data.zeros,
        lambda: store.append(second),
        "append",
    )
    store.sync()
    assert store.entries(1, 11) == first + second
    store.close()
    store = open_store(path)
    assert store.entries(1, 11) == first + second
    store.close()


TRUNCATIONS: dict[str, Callable[[MmapLogStore], None]] = {
    "close": MmapLogStore.close,
    "truncate_suffix": lambda store: store.truncate_suffix(2),
    "reset": lambda store: store.reset(100),
}


@pytest.mark.usefixtures("small_zero_ahead")
@pytest.mark.parametrize("operation", sorted(TRUNCATIONS))
def test_closes_and_truncations_wait_for_the_zeros_queued(
    tmp_path: Path, held_zeros: HeldZeros, operation: str
) -> None:
    """A chunk must not land after its stream was cut, reset or closed: the appends that
    follow (here through a reopened store, which knows nothing of the chunk) would lose
    their entries to it."""
    path = tmp_path / "log"
    store = open_store(path)
    store.append(make_entries(1, [100] * 4))
    store.sync()
    run_while_zeros_are_held(
        held_zeros,
        store._data.zeros,
        lambda: TRUNCATIONS[operation](store),
        operation,
    )
    store.close()
    store = open_store(path)
    first = store.last_index + 1
    entries = make_entries(first, [1500] * 6)
    store.append(entries)
    store.sync()
    store.close()
    store = open_store(path)
    assert store.entries(first, first + 6) == entries
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.usefixtures("small_zero_ahead")
def test_a_forked_child_does_not_wait_for_the_parents_zeros(
    tmp_path: Path, held_zeros: HeldZeros
) -> None:
    """The child has no zeroing thread: a chunk the parent had queued must not hang it."""
    store = open_store(tmp_path / "log")
    store.append(make_entries(1, [100] * 4))
    wait_until(held_zeros.started.is_set, "the zeroing thread holds a chunk")
    child = os.fork()
    if child == 0:  # the child: drain, queue and write zeros of its own, then leave at once
        code = 1
        try:
            signal.alarm(10)  # a child that hangs dies of SIGALRM, and the test fails
            queue = store._data.zeros
            queue.drain()
            held_zeros.release.set()  # the child's own chunk goes through
            queue.submit(os.open(tmp_path / "child", os.O_RDWR | os.O_CREAT), 0, 0, PAGE_BYTES)
            queue.drain()
            code = 0 if (tmp_path / "child").stat().st_size == PAGE_BYTES else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    held_zeros.release.set()
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()


@pytest.mark.parametrize("dsync", [True, False], ids=["pwritev-dsync", "refused"])
def test_write_zeros_writes_them_with_or_without_dsync_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsync: bool
) -> None:
    if dsync and not mmap_zeroing._dsync_writes:
        pytest.skip("pwritev takes no RWF_DSYNC here")
    if not dsync:
        monkeypatch.setattr(mmap_zeroing, "_dsync_writes", True)

        def refusing(*arguments: object) -> int:
            raise OSError(errno.EOPNOTSUPP, "no RWF_DSYNC here")

        monkeypatch.setattr(os, "pwritev", refusing)
    path = tmp_path / "file"
    path.write_bytes(b"\1" * 3 * PAGE_BYTES)
    descriptor = os.open(path, os.O_WRONLY)
    try:
        write_zeros(descriptor, PAGE_BYTES, PAGE_BYTES)
    finally:
        os.close(descriptor)
    assert path.read_bytes() == b"\1" * PAGE_BYTES + bytes(PAGE_BYTES) + b"\1" * PAGE_BYTES
    assert mmap_zeroing._dsync_writes is dsync

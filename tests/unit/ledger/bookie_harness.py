"""Test doubles for bookie tests: a disk that can lose what was not synced, a background
worker and a scheduler that run only when the test says, and a bookie built on them.

`CrashableFileSystem` runs on real files (under tmp_path) through the OS implementation and
remembers, per file, how many bytes the last `sync_data` made durable and which new names
no directory sync has covered yet. `crash(rng)` is a power loss: each file keeps its durable
bytes and a seeded number of the unsynced ones after them (the last kept bytes possibly
zeroed, as when the size reached the disk before the data); unsynced names vanish. Our
storage only ever appends to a file or cuts it back, so "durable prefix plus some of the
rest" is exactly what a real disk may leave. It can also run out of room (`bytes_free`)
and fail the next sync (`fail_next_sync`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from pathlib import Path

from quorumlog.codec import wire
from quorumlog.errors import DiskFullError, StorageError
from quorumlog.ledger.bookie import Bookie, BookieRequest, BookieResponse, BookieSettings
from quorumlog.ledger.bookie_files import (
    BookieDirectoryLock,
    BookieFileHandle,
    BookieFileSystem,
)
from quorumlog.ledger.bookie_storage import BookieStorage, BookieStorageSettings
from quorumlog.storage.filesystem import OS_FILE_SYSTEM


class CrashableFileHandle:
    def __init__(self, disk: CrashableFileSystem, inner: BookieFileHandle) -> None:
        self.disk = disk
        self.inner = inner

    @property
    def path(self) -> Path:
        return self.inner.path

    def read_at(self, size: int, offset: int) -> bytes:
        return self.inner.read_at(size, offset)

    def write_at(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        growth = max(0, offset + len(data) - self.inner.size())
        if self.disk.bytes_free is not None and growth > self.disk.bytes_free:
            fits = len(data) - growth + self.disk.bytes_free
            if fits > 0:
                self.inner.write_at(bytes(data[:fits]), offset)  # partial, as a disk does
            self.disk.bytes_free = 0
            raise DiskFullError(f"disk full while writing {self.path}")
        self.inner.write_at(data, offset)
        if self.disk.bytes_free is not None:
            self.disk.bytes_free -= growth

    def size(self) -> int:
        return self.inner.size()

    def truncate(self, size: int) -> None:
        before = self.inner.size()
        self.inner.truncate(size)
        if self.disk.bytes_free is not None and size < before:
            self.disk.bytes_free += before - size
        self.disk.synced_sizes[self.path] = min(self.disk.synced_sizes.get(self.path, 0), size)

    def sync_data(self) -> None:
        if self.disk.fail_next_sync:
            self.disk.fail_next_sync = False
            raise StorageError(f"I/O error on {self.path}: fsync failed (injected)")
        self.inner.sync_data()
        self.disk.syncs += 1
        self.disk.synced_sizes[self.path] = self.inner.size()

    def close(self) -> None:
        self.inner.close()


class CrashableFileSystem:
    def __init__(self) -> None:
        self.os = OS_FILE_SYSTEM
        self.synced_sizes: dict[Path, int] = {}
        self.unsynced_names: set[Path] = set()
        self.bytes_free: int | None = None
        self.fail_next_sync = False
        self.syncs = 0

    def open_file(self, path: Path, *, writable: bool = False) -> BookieFileHandle:
        inner = self.os.open_file(path, writable=writable)
        self.synced_sizes.setdefault(path, inner.size())
        return CrashableFileHandle(self, inner)

    def create_file(self, path: Path, *, exclusive: bool = True) -> BookieFileHandle:
        inner = self.os.create_file(path, exclusive=exclusive)
        self.synced_sizes[path] = 0
        self.unsynced_names.add(path)
        return CrashableFileHandle(self, inner)

    def read_file(self, path: Path) -> bytes:
        return self.os.read_file(path)

    def list_directory(self, path: Path) -> list[str]:
        return self.os.list_directory(path)

    def exists(self, path: Path) -> bool:
        return self.os.exists(path)

    def make_directory(self, path: Path) -> None:
        self.os.make_directory(path)

    def rename(self, source: Path, target: Path) -> None:
        self.os.rename(source, target)
        self.synced_sizes[target] = self.synced_sizes.pop(source, 0)
        self.unsynced_names.discard(source)
        self.unsynced_names.add(target)

    def unlink(self, path: Path) -> None:
        self.os.unlink(path)
        self.synced_sizes.pop(path, None)
        self.unsynced_names.discard(path)

    def sync_directory(self, path: Path) -> None:
        self.os.sync_directory(path)
        self.unsynced_names = {name for name in self.unsynced_names if name.parent != path}

    def lock_directory(self, path: Path) -> BookieDirectoryLock:
        return self.os.lock_directory(path)

    def crash(self, rng: random.Random) -> None:
        """A power loss (call after closing the storage object, which is then dead)."""
        for path in sorted(self.unsynced_names):
            if self.os.exists(path):
                self.os.unlink(path)
        self.unsynced_names.clear()
        for path, durable in sorted(self.synced_sizes.items()):
            if not self.os.exists(path):
                continue
            handle = self.os.open_file(path, writable=True)
            size = handle.size()
            keep = durable + rng.randint(0, max(size - durable, 0)) if size > durable else size
            handle.truncate(keep)
            if keep > durable and rng.random() < 0.5:
                torn_from = rng.randint(durable, keep)
                handle.write_at(bytes(keep - torn_from), torn_from)
            handle.close()
            self.synced_sizes[path] = keep


def open_storage(
    directory: Path,
    disk: BookieFileSystem | None = None,
    settings: BookieStorageSettings | None = None,
) -> BookieStorage:
    return BookieStorage.open(
        directory, file_system=disk or CrashableFileSystem(), settings=settings
    )


class ManualBackground:
    """`Background` whose jobs run when the test says (`run_all`), or never (a crash)."""

    def __init__(self) -> None:
        self.jobs: deque[tuple[Callable[[], None], Callable[[BaseException | None], None]]] = (
            deque()
        )

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        self.jobs.append((job, done))

    def run_one(self) -> None:
        job, done = self.jobs.popleft()
        try:
            job()
        except StorageError as error:
            done(error)
            return
        done(None)


class BookieRig:
    """A Bookie on a storage, with its scheduler and background run by hand."""

    def __init__(
        self,
        directory: Path,
        disk: CrashableFileSystem | None = None,
        storage_settings: BookieStorageSettings | None = None,
        settings: BookieSettings | None = None,
    ) -> None:
        self.directory = directory
        self.disk = disk or CrashableFileSystem()
        self.storage_settings = storage_settings
        self.settings = settings
        self.soon: deque[Callable[[], None]] = deque()
        self.background = ManualBackground()
        self.storage = open_storage(directory, self.disk, storage_settings)
        self.bookie = Bookie(self.storage, self.background, self.soon.append, settings)

    def send(self, request: BookieRequest) -> list[BookieResponse]:
        """Handle a request; returns the list its response lands in (now or later)."""
        responses: list[BookieResponse] = []
        self.bookie.handle(request, responses.append)
        return responses

    def run_turn(self) -> None:
        """Run what is scheduled soon (starting a sync), but no background job."""
        while self.soon:
            self.soon.popleft()()

    def settle(self) -> None:
        """Run everything until idle: scheduled callbacks and every sync job."""
        while self.soon or self.background.jobs:
            self.run_turn()
            if self.background.jobs:
                self.background.run_one()

    def call(self, request: BookieRequest) -> BookieResponse:
        """Send a request, settle, and return its one response."""
        responses = self.send(request)
        self.settle()
        assert len(responses) == 1, responses
        return responses[0]

    def restart(self, rng: random.Random | None = None) -> None:
        """Stop the process (unsynced jobs never report); with `rng`, lose power too."""
        self.storage.close()
        if rng is not None:
            self.disk.crash(rng)
        self.soon.clear()
        self.background.jobs.clear()
        self.storage = open_storage(self.directory, self.disk, self.storage_settings)
        self.bookie = Bookie(self.storage, self.background, self.soon.append, self.settings)


def entries(first: int, count: int, prefix: bytes = b"entry") -> list[wire.LedgerEntryData]:
    return [
        wire.LedgerEntryData(entry_id, prefix + b"-%d" % entry_id)
        for entry_id in range(first, first + count)
    ]


def add(
    ledger_id: int,
    first: int,
    count: int,
    *,
    key: bytes = b"key",
    lac: int = -1,
    recovery: bool = False,
    request_id: int = 1,
    prefix: bytes = b"entry",
    length: int = -1,
) -> wire.AddEntries:
    return wire.AddEntries(
        request_id,
        ledger_id,
        key,
        lac,
        entries(first, count, prefix),
        recovery=recovery,
        length=length,
    )


def stored_data(storage: BookieStorage, ledger_id: int) -> dict[int, bytes]:
    """Every entry of a ledger this storage holds, by id."""
    return {
        entry.entry_id: entry.data
        for entry in storage.read_entries(ledger_id, 0, 2**62, 2**40, 2**40)
    }

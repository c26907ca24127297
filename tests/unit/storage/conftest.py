"""Store factories shared by the conformance suite: each can open, close and reopen a store."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from quorumlog.storage import LogStore, MemoryLogStore, MmapLogStore, SegmentLogStore
from quorumlog.testing.sim.filesystem import SimFileSystem

STORE_KINDS = ["memory", "segment", "mmap", "segment-sim"]
"""`segment-sim` is the segment store on the simulated byte-level disk (SimFileSystem)."""

# Small files so a few dozen entries already roll over to new segments / data files.
SMALL_SEGMENT_BYTES = 4096
SMALL_DATA_FILE_BYTES = 4096
SMALL_INDEX_FILE_BYTES = 32 * 64
ENTRY_BYTES_MAX = 1024


class StoreHarness:
    """Opens a store of one kind at one place, and reopens it the way a restart would."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.memory_store: MemoryLogStore | None = None
        self.sim_disk = SimFileSystem(random.Random(0)) if kind == "segment-sim" else None

    def open(self) -> LogStore:
        if self.kind == "memory":
            # A memory store survives "reopen" only because nothing was closed: it is the
            # model of a store whose every append was synced.
            if self.memory_store is None:
                self.memory_store = MemoryLogStore(entry_bytes_max=ENTRY_BYTES_MAX)
            return self.memory_store
        if self.kind == "segment":
            return SegmentLogStore.open(
                self.path, segment_bytes_max=SMALL_SEGMENT_BYTES, entry_bytes_max=ENTRY_BYTES_MAX
            )
        if self.sim_disk is not None:
            return SegmentLogStore.open(
                self.path,
                segment_bytes_max=SMALL_SEGMENT_BYTES,
                entry_bytes_max=ENTRY_BYTES_MAX,
                file_system=self.sim_disk,
            )
        if self.kind == "mmap":
            return MmapLogStore.open(
                self.path,
                data_file_bytes=SMALL_DATA_FILE_BYTES,
                index_file_bytes=SMALL_INDEX_FILE_BYTES,
                entry_bytes_max=ENTRY_BYTES_MAX,
            )
        raise AssertionError(f"unknown store kind {self.kind}")

    def reopen(self, store: LogStore) -> LogStore:
        if self.kind == "memory":
            return store
        if self.sim_disk is not None:
            # The process dies without closing anything; the OS keeps every byte written.
            self.sim_disk.process_crash()
            return self.open()
        store.close()
        return self.open()

    @property
    def durable_across_reopen(self) -> bool:
        return True


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> StoreHarness:
    return StoreHarness(request.param, tmp_path / "log")


HarnessFactory = Callable[[str, Path], StoreHarness]

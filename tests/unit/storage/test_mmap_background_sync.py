"""The mmap store's sync off the loop (`begin_sync`, `CapturedSync.run`, `finish_sync`).

The invariant: a position is reported durable only after a sync that covered it returned.
Writes made while a sync is in flight stay dirty and the next sync covers them; a
truncation meanwhile makes the finishing sync claim nothing. The crash test keeps, as the
"disk", only the bytes the background msyncs wrote, and opens the store from that: every
entry below the reported durable end must be there.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from quorumlog.raft.invariants import InvariantViolation
from quorumlog.storage import LogEntry, MmapLogStore, StorageError, SyncPolicy, mmap_sync
from quorumlog.storage.mmap_sync import CapturedSync

DATA_FILE_BYTES = 16 * 1024
INDEX_FILE_BYTES = 32 * 512


def open_store(path: Path, sync_policy: SyncPolicy = SyncPolicy.EXPLICIT) -> MmapLogStore:
    return MmapLogStore.open(
        path,
        data_file_bytes=DATA_FILE_BYTES,
        index_file_bytes=INDEX_FILE_BYTES,
        entry_bytes_max=2048,
        sync_policy=sync_policy,
    )


def entries(first: int, sizes: list[int]) -> list[LogEntry]:
    return [
        LogEntry(index=first + number, term=1, data=bytes([1 + (first + number) % 250]) * size)
        for number, size in enumerate(sizes)
    ]


class DiskImage:
    """Stands in for `flush_file_range`: copies what each msync covers, as it is in the file
    at that moment, into an image of the disk, then does the real msync."""

    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}
        self.calls = 0

    def __call__(self, descriptor: int, offset: int, length: int) -> None:
        self.calls += 1
        path = os.readlink(f"/proc/self/fd/{descriptor}")
        size = os.fstat(descriptor).st_size
        image = self.files.setdefault(path, bytearray(size))
        image[offset : offset + length] = os.pread(descriptor, length, offset)
        real_flush_file_range(descriptor, offset, length)

    def write(self, store_path: Path, target: Path) -> None:
        """A store directory holding only what reached the image (and the meta)."""
        for sub in ("data", "index"):
            (target / sub).mkdir(parents=True)
            for name in os.listdir(store_path / sub):
                image = self.files.get(str(store_path / sub / name))
                if image is not None:
                    (target / sub / name).write_bytes(bytes(image))
        shutil.copy(store_path / "meta", target / "meta")


real_flush_file_range = mmap_sync.flush_file_range


@pytest.fixture
def disk_image(monkeypatch: pytest.MonkeyPatch) -> DiskImage:
    image = DiskImage()
    monkeypatch.setattr(mmap_sync, "flush_file_range", image)
    return image


def background_sync(store: MmapLogStore) -> int:
    captured = store.begin_sync()
    captured.run()
    return store.finish_sync(captured, None)


def test_durable_moves_only_when_the_finished_sync_is_handed_back(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100, 200]))
    captured = store.begin_sync()
    assert captured.data_end == store.data_end
    assert store.durable_data_end == 0  # captured, not yet run
    captured.run()
    assert store.durable_data_end == 0  # ran, not yet reported back
    assert store.finish_sync(captured, None) == store.data_end
    assert store.durable_data_end == store.data_end
    store.close()


def test_writes_during_a_sync_stay_dirty_and_the_next_sync_covers_them(
    tmp_path: Path, disk_image: DiskImage
) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100, 200]))
    first_end = store.data_end
    captured = store.begin_sync()
    store.append(entries(3, [300]))  # while the sync is in flight
    second_end = store.data_end
    captured.run()
    assert store.finish_sync(captured, None) == first_end  # not the append made meanwhile
    follow_up = store.begin_sync()
    assert (follow_up.data_low, follow_up.data_end) == (first_end, second_end)
    assert not follow_up.empty
    follow_up.run()
    assert store.finish_sync(follow_up, None) == second_end
    store.close()


def test_one_background_sync_at_a_time(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100]))
    captured = store.begin_sync()
    with pytest.raises(InvariantViolation):
        store.begin_sync()
    captured.run()
    store.finish_sync(captured, None)
    store.close()


def test_a_sync_on_the_store_thread_covers_the_range_in_flight(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100]))
    captured = store.begin_sync()
    store.append(entries(2, [100]))
    store.sync()  # flushes the captured range too: it is not durable until the job returns
    assert store.durable_data_end == store.data_end
    captured.run()
    assert store.finish_sync(captured, None) == store.data_end  # never goes back
    store.close()


def test_a_truncation_while_a_sync_runs_makes_it_claim_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100, 100, 100]))
    captured = store.begin_sync()
    store.truncate_suffix(1)  # durable on return, below the captured end
    kept_end = store.data_end
    assert store.durable_data_end == kept_end
    store.append(entries(2, [50]))
    captured.run()  # its own mappings: the truncation's zeros and removals do not hurt it
    assert store.finish_sync(captured, None) == kept_end
    assert background_sync(store) == store.data_end
    store.close()


def test_close_while_a_sync_runs(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100] * 300))  # several data files
    captured = store.begin_sync()
    store.close()
    captured.run()  # on descriptors of its own, still open
    store.finish_sync(captured, None)
    reopened = open_store(tmp_path / "store")
    assert reopened.last_index == 300
    reopened.close()


def test_a_failed_sync_fails_the_store_and_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    store.append(entries(1, [100]))

    def failing(descriptor: int, offset: int, length: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(mmap_sync, "flush_file_range", failing)
    captured = store.begin_sync()
    with pytest.raises(StorageError) as raised:
        captured.run()
    assert store.finish_sync(captured, raised.value) == 0
    with pytest.raises(StorageError, match="sync failed"):
        store.append(entries(2, [100]))
    store.close()


def test_never_policy_reports_appends_durable_without_flushing(
    tmp_path: Path, disk_image: DiskImage
) -> None:
    store = open_store(tmp_path / "store", SyncPolicy.NEVER)
    store.append(entries(1, [100]))
    captured = store.begin_sync()
    assert captured.empty
    assert background_sync_of(store, captured) == store.data_end
    assert disk_image.calls == 0
    store.close()


def background_sync_of(store: MmapLogStore, captured: CapturedSync) -> int:
    captured.run()
    return store.finish_sync(captured, None)


@pytest.mark.parametrize("seed", range(4))
def test_what_was_reported_durable_survives_a_crash(
    tmp_path: Path, disk_image: DiskImage, seed: int
) -> None:
    """Appends, background syncs and finishes interleave at random; at the end the disk is
    what the msyncs wrote (unsynced bytes lost, as at a power loss), and the store opened
    from it must hold every entry below the durable end reported last."""
    rng = random.Random(seed)
    store = open_store(tmp_path / "store")
    in_flight: CapturedSync | None = None
    ran = False
    durable_end = 0
    written: dict[int, bytes] = {}
    ends: dict[int, int] = {}
    for _ in range(200):
        step = rng.random()
        if step < 0.5:
            batch = entries(store.last_index + 1, [rng.randint(1, 1500)])
            store.append(batch)
            written[batch[0].index] = batch[0].data
            ends[batch[0].index] = store.data_end
        elif in_flight is None:
            in_flight, ran = store.begin_sync(), False
        elif not ran:
            in_flight.run()
            ran = True
        else:
            durable_end = store.finish_sync(in_flight, None)
            in_flight = None
    store.close()  # no sync: what was not synced by then is lost
    disk_image.write(tmp_path / "store", tmp_path / "crashed")
    survivor = open_store(tmp_path / "crashed")
    must_survive = [index for index, end in ends.items() if end <= durable_end]
    assert durable_end > 0 and must_survive
    assert survivor.last_index >= max(must_survive)
    for index in must_survive:
        assert survivor.entry(index).data == written[index]
    survivor.close()

"""`quorumlog bench storage`: append, open, random-read and index-memory figures per file store.

Cases, for each store (segment, mmap):

- `<store>-append-4096`, `<store>-append-100`: batches of 256 entries through the LogStore
  interface (`append` then `sync`, one sync per batch). Beside it, in the same run and
  alternating batch by batch, the same payload bytes are written to a plain file with one
  os.write and one fdatasync per batch (the sync call the segment store uses): what the disk
  gives a writer with no format at all. mb_per_s counts entry data only (not headers), so
  ratio_to_raw charges the store for its own format overhead.
- `segment-append-encoded-100`: the same through SegmentLogStore.append_encoded, the path for
  bytes that arrive already encoded (a follower's batches); no LogEntry objects are built.
- `<store>-open-1gib`: seconds to open a log of 1 GiB of 4 KiB entries and rebuild its
  index. The files were just written, so they are in the page cache: this measures the
  index rebuild, not the disk.
- `<store>-read-random`: latency of `entry(i)` at random indexes of that log.
- `<store>-index-memory`: bytes of Python heap per entry held after opening a log of one
  million entries, measured with tracemalloc around `open`.
- `mmap-vs-segment-append-100`: both stores take the same batches of append-100 in one loop,
  alternating batch by batch (the order flips every batch), so that they see the same disk
  weather; the cases above run each store at its own time, tens of seconds apart on a disk
  whose sync latency drifts. Reports each store's entries/s over all runs and their ratio,
  and where each store's time went: append (CPU: encode and the page-cache writes) and sync
  per batch, the median and mean sync, and the share of sync time spent above the median
  (`<store>_sync_slow_share`: the syncs that waited behind other writes to the disk, such
  as the mmap store's chunks of zeros ahead or its lagged index flush).

Each run and each store's failures are reported as lines with an "error" field; the run goes
on. Everything is written under one temporary directory that is removed at the end.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from quorumlog.storage.base import LogStore
from quorumlog.storage.entry import LogEntry
from quorumlog.storage.segment import SegmentLogStore
from quorumlog.storage.segment_format import encode_entries

BATCH_ENTRIES = 256
MEGABYTE = 1_000_000
Opener = Callable[[Path], LogStore]


class BenchSizes(msgspec.Struct, frozen=True):
    append_4096_bytes: int
    """Payload bytes per append-4096 run."""
    append_100_entries: int
    open_log_bytes: int
    """Payload bytes of the log that open-1gib opens."""
    random_reads: int
    memory_entries: int
    repeats: int
    """Runs of each append case; the run with the best store time is reported."""


FULL_SIZES = BenchSizes(
    append_4096_bytes=64 * 1024 * 1024,
    append_100_entries=256 * 800,
    open_log_bytes=1024 * 1024 * 1024,
    random_reads=20_000,
    memory_entries=1_000_000,
    repeats=3,
)
QUICK_SIZES = BenchSizes(
    append_4096_bytes=2 * 1024 * 1024,
    append_100_entries=256 * 20,
    open_log_bytes=8 * 1024 * 1024,
    random_reads=500,
    memory_entries=20_000,
    repeats=1,
)


def open_segment_store(path: Path) -> LogStore:
    return SegmentLogStore.open(path)


def open_mmap_store(path: Path) -> LogStore:
    from quorumlog.storage.mmap_store import MmapLogStore

    store: LogStore = MmapLogStore.open(path)
    return store


STORES: dict[str, Opener] = {"segment": open_segment_store, "mmap": open_mmap_store}


def run_storage_benchmark(as_json: bool, directory: str | None, quick: bool) -> None:
    """Run every case for every store and print one result per line."""
    sizes = QUICK_SIZES if quick else FULL_SIZES
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quorumlog-bench-", dir=directory) as root_name:
        root = Path(root_name)
        for store_name, opener in STORES.items():
            for result in store_cases(store_name, opener, root, sizes):
                emit(result, as_json)
        work = root / "side-by-side"
        try:
            emit(bench_side_by_side(work, 100, sizes.append_100_entries, sizes.repeats), as_json)
        except Exception as error:  # a benchmark reports failures instead of stopping
            emit({"case": SIDE_BY_SIDE_CASE, "error": f"{type(error).__name__}: {error}"}, as_json)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
        return
    fields = ", ".join(f"{key}={value}" for key, value in result.items() if key != "case")
    print(f"{result['case']}: {fields}", flush=True)


def store_cases(
    store_name: str, opener: Opener, root: Path, sizes: BenchSizes
) -> Iterator[dict[str, Any]]:
    work = root / store_name
    cases: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
        (
            f"{store_name}-append-4096",
            lambda: [
                bench_append(
                    f"{store_name}-append-4096",
                    opener,
                    work,
                    4096,
                    sizes.append_4096_bytes // 4096,
                    sizes.repeats,
                )
            ],
        ),
        (
            f"{store_name}-append-100",
            lambda: [
                bench_append(
                    f"{store_name}-append-100",
                    opener,
                    work,
                    100,
                    sizes.append_100_entries,
                    sizes.repeats,
                )
            ],
        ),
    ]
    if store_name == "segment":
        cases.append(
            (
                "segment-append-encoded-100",
                lambda: [bench_append_encoded(work, 100, sizes.append_100_entries, sizes.repeats)],
            )
        )
    cases.append(
        (
            f"{store_name}-open-1gib",
            lambda: bench_open_and_read(store_name, opener, work, sizes),
        )
    )
    cases.append(
        (
            f"{store_name}-index-memory",
            lambda: [bench_index_memory(store_name, opener, work, sizes.memory_entries)],
        )
    )
    for case_name, run in cases:
        try:
            yield from run()
        except Exception as error:  # a benchmark reports failures instead of stopping
            yield {"case": case_name, "error": f"{type(error).__name__}: {error}"}
        finally:
            shutil.rmtree(work, ignore_errors=True)


# --- append ------------------------------------------------------------------------------


def make_batches(first_index: int, entry_count: int, data_bytes: int) -> list[list[LogEntry]]:
    """Batches of BATCH_ENTRIES entries; each entry has its own data (distinct bytes)."""
    batches = []
    pattern = random.Random(data_bytes).randbytes(data_bytes + 256)
    for start in range(first_index, first_index + entry_count, BATCH_ENTRIES):
        stop = min(start + BATCH_ENTRIES, first_index + entry_count)
        batches.append(
            [
                LogEntry(index=i, term=1, data=pattern[i % 256 : i % 256 + data_bytes])
                for i in range(start, stop)
            ]
        )
    return batches


def interleaved_seconds(
    work: Path, payloads: list[bytes], store: LogStore, append_batch: Callable[[int], None]
) -> tuple[float, float]:
    """(store seconds, raw seconds) for writing every batch both ways, alternating per batch.

    Alternating batch by batch makes the store and the raw file see the same disk weather
    (this VM's fsync latency drifts by tens of percent over seconds).
    """
    raw_path = work / "raw"
    descriptor = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    clock = time.perf_counter
    store_seconds = 0.0
    raw_seconds = 0.0
    try:
        for position, payload in enumerate(payloads):
            started = clock()
            os.write(descriptor, payload)
            os.fdatasync(descriptor)
            middle = clock()
            append_batch(position)
            store.sync()
            ended = clock()
            raw_seconds += middle - started
            store_seconds += ended - middle
    finally:
        os.close(descriptor)
        raw_path.unlink()
    return store_seconds, raw_seconds


def append_result(
    case: str, entry_count: int, payload_bytes: int, timings: list[tuple[float, float]]
) -> dict[str, Any]:
    """Figures from the run whose store time was best, with that run's raw time beside it."""
    store_seconds, raw_seconds = min(timings)
    mb_per_s = payload_bytes / store_seconds / MEGABYTE
    raw_mb_per_s = payload_bytes / raw_seconds / MEGABYTE
    return {
        "case": case,
        "entries": entry_count,
        "batch_entries": BATCH_ENTRIES,
        "entries_per_s": round(entry_count / store_seconds),
        "mb_per_s": round(mb_per_s, 1),
        "raw_mb_per_s": round(raw_mb_per_s, 1),
        "ratio_to_raw": round(mb_per_s / raw_mb_per_s, 3),
        "bytes_counted": "entry data only",
        "raw": "os.write + os.fdatasync per batch, alternating with the store batch by batch",
        "runs": len(timings),
    }


def batch_writer(store: LogStore, batches: list[list[LogEntry]]) -> Callable[[int], None]:
    append = store.append

    def write(position: int) -> None:
        append(batches[position])

    return write


def encoded_writer(
    store: SegmentLogStore, encoded: list[tuple[int, bytes, int]]
) -> Callable[[int], None]:
    append_encoded = store.append_encoded

    def write(position: int) -> None:
        append_encoded(*encoded[position])

    return write


def bench_append(
    case: str, opener: Opener, work: Path, data_bytes: int, entry_count: int, repeats: int
) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    batches = make_batches(1, entry_count, data_bytes)
    payloads = [b"".join(entry.data for entry in batch) for batch in batches]
    timings: list[tuple[float, float]] = []
    gc.collect()
    for _ in range(repeats):
        store = opener(work / "log")
        try:
            timings.append(interleaved_seconds(work, payloads, store, batch_writer(store, batches)))
        finally:
            store.close()
            shutil.rmtree(work / "log", ignore_errors=True)
    return append_result(case, entry_count, data_bytes * entry_count, timings)


def bench_append_encoded(
    work: Path, data_bytes: int, entry_count: int, repeats: int
) -> dict[str, Any]:
    """SegmentLogStore.append_encoded with batches encoded beforehand, as a follower gets them."""
    work.mkdir(parents=True, exist_ok=True)
    batches = make_batches(1, entry_count, data_bytes)
    encoded = [(batch[0].index, encode_entries(batch)[0], len(batch)) for batch in batches]
    payloads = [b"".join(entry.data for entry in batch) for batch in batches]
    del batches
    timings: list[tuple[float, float]] = []
    gc.collect()
    for _ in range(repeats):
        store = SegmentLogStore.open(work / "log")
        try:
            timings.append(
                interleaved_seconds(work, payloads, store, encoded_writer(store, encoded))
            )
        finally:
            store.close()
            shutil.rmtree(work / "log", ignore_errors=True)
    result = append_result(
        "segment-append-encoded-100", entry_count, data_bytes * entry_count, timings
    )
    result["note"] = "batches encoded before timing; checksums verified in append_encoded"
    return result


SIDE_BY_SIDE_CASE = "mmap-vs-segment-append-100"


def bench_side_by_side(
    work: Path, data_bytes: int, entry_count: int, repeats: int
) -> dict[str, Any]:
    """Append and sync the same batches to a segment and an mmap store, alternating."""
    work.mkdir(parents=True, exist_ok=True)
    batches = make_batches(1, entry_count, data_bytes)
    append_seconds = dict.fromkeys(STORES, 0.0)
    sync_seconds: dict[str, list[float]] = {name: [] for name in STORES}
    clock = time.perf_counter
    gc.collect()
    for _ in range(repeats):
        stores = {name: opener(work / name) for name, opener in STORES.items()}
        try:
            order = list(stores.items())
            for batch in batches:
                for name, store in order:
                    started = clock()
                    store.append(batch)
                    appended = clock()
                    store.sync()
                    append_seconds[name] += appended - started
                    sync_seconds[name].append(clock() - appended)
                order.reverse()
        finally:
            for name, store in stores.items():
                store.close()
                shutil.rmtree(work / name, ignore_errors=True)
    seconds = {name: append_seconds[name] + sum(sync_seconds[name]) for name in STORES}
    rates = {name: round(entry_count * repeats / spent) for name, spent in seconds.items()}
    result: dict[str, Any] = {
        "case": SIDE_BY_SIDE_CASE,
        "entries": entry_count,
        "batch_entries": BATCH_ENTRIES,
        "runs": repeats,
        "segment_entries_per_s": rates["segment"],
        "mmap_entries_per_s": rates["mmap"],
        "mmap_to_segment": round(rates["mmap"] / rates["segment"], 3),
    }
    for name in STORES:
        result.update(time_split(name, append_seconds[name], sync_seconds[name]))
    return result


def time_split(store_name: str, append_seconds: float, syncs: list[float]) -> dict[str, Any]:
    """Where one store's side-by-side time went, per batch (see the module docstring)."""
    if not syncs:
        return {}
    median = statistics.median(syncs)
    total = sum(syncs)
    above_median = sum(spent - median for spent in syncs if spent > median)
    microseconds = 1e6
    return {
        f"{store_name}_append_us": round(append_seconds / len(syncs) * microseconds, 1),
        f"{store_name}_sync_us_median": round(median * microseconds, 1),
        f"{store_name}_sync_us_mean": round(total / len(syncs) * microseconds, 1),
        f"{store_name}_sync_slow_share": round(above_median / total, 3) if total else 0.0,
    }


# --- open, random reads ------------------------------------------------------------------


def fill_store(opener: Opener, path: Path, entry_count: int, data_bytes: int) -> None:
    """Write entry_count entries in large batches, syncing once at the end."""
    store = opener(path)
    try:
        data = random.Random(7).randbytes(data_bytes)
        batch_entries = max(BATCH_ENTRIES, (4 * 1024 * 1024) // (data_bytes + 24))
        for start in range(1, entry_count + 1, batch_entries):
            stop = min(start + batch_entries, entry_count + 1)
            store.append(
                [LogEntry(index=i, term=1 + i // 100_000, data=data) for i in range(start, stop)]
            )
        store.sync()
    finally:
        store.close()


def bench_open_and_read(
    store_name: str, opener: Opener, work: Path, sizes: BenchSizes
) -> list[dict[str, Any]]:
    entry_count = sizes.open_log_bytes // 4096
    path = work / "open"
    fill_store(opener, path, entry_count, 4096)
    disk_bytes = sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
    gc.collect()
    started = time.perf_counter()
    store = opener(path)
    open_seconds = time.perf_counter() - started
    results: list[dict[str, Any]] = []
    try:
        if store.last_index != entry_count:
            raise RuntimeError(f"reopened log has {store.last_index} entries, not {entry_count}")
        results.append(
            {
                "case": f"{store_name}-open-1gib",
                "seconds": round(open_seconds, 3),
                "entries": entry_count,
                "data_bytes": entry_count * 4096,
                "disk_bytes": disk_bytes,
                "page_cache": "warm (files just written)",
            }
        )
        try:
            results.append(bench_random_reads(store_name, store, sizes.random_reads))
        except Exception as error:
            results.append(
                {"case": f"{store_name}-read-random", "error": f"{type(error).__name__}: {error}"}
            )
    finally:
        store.close()
    return results


def bench_random_reads(store_name: str, store: LogStore, read_count: int) -> dict[str, Any]:
    chooser = random.Random(42)
    indexes = [chooser.randint(store.first_index, store.last_index) for _ in range(read_count)]
    latencies_ns: list[int] = []
    clock = time.perf_counter_ns
    read = store.entry
    for index in indexes[: min(1000, read_count)]:  # warm up the descriptors and caches
        read(index)
    for index in indexes:
        started = clock()
        read(index)
        latencies_ns.append(clock() - started)
    latencies_ns.sort()
    quantiles = statistics.quantiles(latencies_ns, n=100)
    return {
        "case": f"{store_name}-read-random",
        "reads": read_count,
        "entry_bytes": 4096,
        "p50_us": round(quantiles[49] / 1000, 1),
        "p99_us": round(quantiles[98] / 1000, 1),
        "max_us": round(latencies_ns[-1] / 1000, 1),
        "page_cache": "warm",
    }


# --- index memory ------------------------------------------------------------------------


def bench_index_memory(
    store_name: str, opener: Opener, work: Path, entry_count: int
) -> dict[str, Any]:
    path = work / "memory"
    fill_store(opener, path, entry_count, 16)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        store = opener(path)
        try:
            gc.collect()
            after, peak = tracemalloc.get_traced_memory()
            found = store.last_index - store.first_index + 1
        finally:
            store.close()
    finally:
        tracemalloc.stop()
    if found != entry_count:
        raise RuntimeError(f"reopened log has {found} entries, not {entry_count}")
    return {
        "case": f"{store_name}-index-memory",
        "entries": entry_count,
        "bytes_per_entry": round((after - before) / entry_count, 2),
        "peak_bytes_per_entry": round((peak - before) / entry_count, 2),
        "method": "tracemalloc: Python heap held after open, store still open "
        "(memory-mapped files are not counted)",
    }

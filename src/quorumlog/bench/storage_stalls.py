"""Where the mmap store's sync time goes on append-100: plain syncs against syncs that waited.

    python -m quorumlog.bench.storage_stalls [--batches 800] [--dir DIR]

Appends batches of 256 x 100 B to one `MmapLogStore` with a sync after each (the
`mmap-append-100` case without the raw file beside it) and times every append and sync. It
also times, through hooks on the store's own functions, each chunk of zeros the zeroing
thread writes (`mmap_zeroing.write_zeros`) and each write-back and flush of the lagged index.
A sync whose time overlaps one of those waited behind it for the disk (a virtual disk
serves one request at a time, and a sync's device flush must persist everything written
before it); the rest are plain. One JSON line: per batch, the append time, the plain syncs'
time and what each kind of wait added over a plain sync (`*_extra_us_per_batch`: its syncs'
time beyond the median plain sync, spread over all batches), and the counts behind them.

A diagnostic, not a figure to compare trees by (use `storage_ab` for that): the hooks are
installed by replacing `mmap_zeroing.write_zeros`, `MappedFileList.flush` and
`MappedFileList.write_back` for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorumlog.bench.storage import make_batches
from quorumlog.storage import mmap_zeroing
from quorumlog.storage.mmap_files import MappedFileList
from quorumlog.storage.mmap_meta import INDEX_DIRECTORY
from quorumlog.storage.mmap_store import MmapLogStore

BATCH_ENTRIES = 256
Span = tuple[float, float]


def timed(spans: list[Span], function: Callable[..., None]) -> Callable[..., None]:
    """`function`, recording the (start, end) of every call in `spans`."""

    def wrapper(*arguments: Any) -> None:
        started = time.perf_counter()
        try:
            function(*arguments)
        finally:
            spans.append((started, time.perf_counter()))

    return wrapper


def overlaps(span: Span, others: list[Span]) -> bool:
    return any(low < span[1] and span[0] < high for low, high in others)


def measure(directory: Path, batch_count: int) -> dict[str, Any]:
    batches = make_batches(1, batch_count * BATCH_ENTRIES, 100)
    zero_spans: list[Span] = []
    index_spans: list[Span] = []
    index_write_back_spans: list[Span] = []
    syncs: list[Span] = []
    appends_seconds = 0.0
    clock = time.perf_counter
    real_write_zeros = mmap_zeroing.write_zeros
    real_flush = MappedFileList.flush
    real_write_back = MappedFileList.write_back

    def flush(files: MappedFileList, low: int, high: int) -> None:
        if files.directory.name != INDEX_DIRECTORY:
            real_flush(files, low, high)
            return
        started = clock()
        try:
            real_flush(files, low, high)
        finally:
            index_spans.append((started, clock()))

    def write_back(files: MappedFileList, low: int, high: int) -> bool:
        if files.directory.name != INDEX_DIRECTORY:
            return real_write_back(files, low, high)
        started = clock()
        try:
            return real_write_back(files, low, high)
        finally:
            index_write_back_spans.append((started, clock()))

    mmap_zeroing.write_zeros = timed(zero_spans, real_write_zeros)
    MappedFileList.flush = flush  # type: ignore[method-assign,assignment]
    MappedFileList.write_back = write_back  # type: ignore[method-assign,assignment]
    try:
        store = MmapLogStore.open(directory / "log")
        index_spans.clear()  # open flushes what it found
        try:
            for batch in batches:
                started = clock()
                store.append(batch)
                appended = clock()
                store.sync()
                appends_seconds += appended - started
                syncs.append((appended, clock()))
        finally:
            store.close()
    finally:
        mmap_zeroing.write_zeros = real_write_zeros
        MappedFileList.flush = real_flush  # type: ignore[method-assign]
        MappedFileList.write_back = real_write_back  # type: ignore[method-assign]
    result = summarize(
        batch_count, appends_seconds, syncs, zero_spans, index_spans + index_write_back_spans
    )
    result["index_flushes"] = len(index_spans)
    result["index_write_backs"] = len(index_write_back_spans)
    return result


def summarize(
    batch_count: int,
    appends_seconds: float,
    syncs: list[Span],
    zero_spans: list[Span],
    index_spans: list[Span],
) -> dict[str, Any]:
    """`index_spans`: the index's write-backs and flushes, which the caller counts."""
    kinds: dict[str, list[float]] = {"plain": [], "zeros": [], "index": []}
    for span in syncs:
        kind = "index" if overlaps(span, index_spans) else "plain"
        if kind == "plain" and overlaps(span, zero_spans):
            kind = "zeros"
        kinds[kind].append(span[1] - span[0])
    plain_median = statistics.median(kinds["plain"]) if kinds["plain"] else 0.0
    microseconds = 1e6
    total = appends_seconds + sum(high - low for low, high in syncs)
    result: dict[str, Any] = {
        "case": "mmap-append-100-sync-stalls",
        "batches": batch_count,
        "batch_entries": BATCH_ENTRIES,
        "entries_per_s": round(batch_count * BATCH_ENTRIES / total),
        "append_us_per_batch": round(appends_seconds / batch_count * microseconds, 1),
        "plain_sync_us_median": round(plain_median * microseconds, 1),
        "plain_sync_us_per_batch": round(sum(kinds["plain"]) / batch_count * microseconds, 1),
        "zero_chunks": len(zero_spans),
        "zero_chunk_ms_median": round(
            statistics.median(high - low for low, high in zero_spans) * 1e3, 2
        )
        if zero_spans
        else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    result["plain_syncs"] = len(kinds["plain"])
    for kind in ("zeros", "index"):
        spent = kinds[kind]
        extra = sum(spent) - plain_median * len(spent)
        result[f"{kind}_syncs"] = len(spent)
        result[f"{kind}_extra_us_per_batch"] = round(extra / batch_count * microseconds, 1)
    return result


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=800, help="batches of 256 entries")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    options = parser.parse_args(arguments)
    with tempfile.TemporaryDirectory(prefix="quorumlog-stalls-", dir=options.dir) as root:
        print(json.dumps(measure(Path(root), options.batches)), flush=True)


if __name__ == "__main__":
    main()

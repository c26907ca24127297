"""Smoke run of `python -m quorumlog.bench.storage_stalls`: one JSON line that adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorumlog.bench import storage_stalls
from quorumlog.storage import mmap_zeroing
from quorumlog.storage.mmap_files import MappedFileList


@pytest.mark.timeout(60)
def test_the_sync_time_is_split_by_what_each_sync_waited_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooked = (mmap_zeroing.write_zeros, MappedFileList.flush, MappedFileList.write_back)
    storage_stalls.main(["--batches", "40", "--dir", str(tmp_path)])
    [result] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert result["case"] == "mmap-append-100-sync-stalls"
    assert result["plain_syncs"] + result["zeros_syncs"] + result["index_syncs"] == 40
    # 40 batches of slots pass the write-back lag once, and not the flush lag.
    assert (result["index_write_backs"], result["index_flushes"]) == (1, 0)
    assert result["entries_per_s"] > 0 and result["append_us_per_batch"] > 0
    # The hooks are gone and the run cleaned up after itself.
    assert (mmap_zeroing.write_zeros, MappedFileList.flush, MappedFileList.write_back) == hooked
    assert list(tmp_path.iterdir()) == []

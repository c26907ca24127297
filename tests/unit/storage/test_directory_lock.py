"""One open store per directory: a second open, in this process or another, is refused
with DirectoryInUseError while the first is open, and succeeds once it is closed or its
process is gone (a SIGKILLed process leaves no stale lock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quorumlog.errors import DirectoryInUseError
from quorumlog.storage import LogEntry, LogStore, MmapLogStore, SegmentLogStore


def open_store(kind: str, path: Path) -> LogStore:
    if kind == "segment":
        return SegmentLogStore.open(path)
    return MmapLogStore.open(path, data_file_bytes=1 << 16, index_file_bytes=32 * 64)


@pytest.mark.parametrize("kind", ["segment", "mmap"])
def test_a_second_open_is_refused_until_the_first_closes(kind: str, tmp_path: Path) -> None:
    first = open_store(kind, tmp_path / "log")
    first.append([LogEntry(index=1, term=1, data=b"a")])
    first.sync()
    with pytest.raises(DirectoryInUseError, match="in use"):
        open_store(kind, tmp_path / "log")
    # The refused open changed nothing: the first store still works.
    first.append([LogEntry(index=2, term=1, data=b"b")])
    first.sync()
    first.close()
    second = open_store(kind, tmp_path / "log")
    assert second.last_index == 2
    second.close()


@pytest.mark.parametrize("kind", ["segment", "mmap"])
def test_another_process_cannot_open_it_and_a_killed_holder_leaves_no_lock(
    kind: str, tmp_path: Path
) -> None:
    store = open_store(kind, tmp_path / "log")
    opener = (
        "import sys\n"
        "from quorumlog.errors import DirectoryInUseError\n"
        "from quorumlog.storage import MmapLogStore, SegmentLogStore\n"
        "try:\n"
        f"    SegmentLogStore.open(sys.argv[1]) if {kind!r} == 'segment' else "
        "MmapLogStore.open(sys.argv[1], data_file_bytes=1 << 16, index_file_bytes=32 * 64)\n"
        "except DirectoryInUseError:\n"
        "    sys.exit(3)\n"
    )
    refused = subprocess.run([sys.executable, "-c", opener, str(tmp_path / "log")], check=False)
    assert refused.returncode == 3
    store.close()

    with subprocess.Popen(
        [sys.executable, "-c", opener + "print('open', flush=True)\nsys.stdin.read()\n",
         str(tmp_path / "log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as holder:  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        holder.kill()
        holder.wait(timeout=30)
    reopened = open_store(kind, tmp_path / "log")
    reopened.close()

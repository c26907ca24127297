"""The fast paths of `MappedFileList`: which files a flush visits, one-call writes, `covers`."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from quorumlog.storage.mmap_files import MappedFileList

FILE_BYTES = 4 * mmap.PAGESIZE


class FlushSpy:
    """Stands in for a file's mapping and records what is flushed of it."""

    def __init__(self, mapping: mmap.mmap, start: int, flushed: list[tuple[int, int, int]]) -> None:
        self.mapping = mapping
        self.start = start
        self.flushed = flushed

    def flush(self, offset: int, length: int) -> None:
        self.flushed.append((self.start, offset, length))
        self.mapping.flush(offset, length)

    def close(self) -> None:
        self.mapping.close()


@pytest.fixture
def files(tmp_path: Path) -> MappedFileList:
    file_list = MappedFileList(tmp_path, FILE_BYTES)
    file_list.ensure(FILE_BYTES, 5 * FILE_BYTES)  # four files; the stream starts at file 1
    return file_list


def spy_on(file_list: MappedFileList) -> list[tuple[int, int, int]]:
    flushed: list[tuple[int, int, int]] = []
    for mapped in file_list.files:
        mapped.map = FlushSpy(mapped.map, mapped.start, flushed)  # type: ignore[assignment]
    return flushed


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        # Within one file, rounded down to a page at the start.
        (FILE_BYTES + 100, FILE_BYTES + 5000, [(FILE_BYTES, 0, 5000)]),
        # Across three files: the tail of the first, all of the second, the head of the third.
        (
            2 * FILE_BYTES - 10,
            4 * FILE_BYTES + 7,
            [
                (FILE_BYTES, FILE_BYTES - mmap.PAGESIZE, mmap.PAGESIZE),
                (2 * FILE_BYTES, 0, FILE_BYTES),
                (3 * FILE_BYTES, 0, FILE_BYTES),
                (4 * FILE_BYTES, 0, 7),
            ],
        ),
        # The last file only: the files below are not visited.
        (
            4 * FILE_BYTES + mmap.PAGESIZE,
            5 * FILE_BYTES,
            [(4 * FILE_BYTES, mmap.PAGESIZE, 3 * mmap.PAGESIZE)],
        ),
        # Clipped to the files that exist, on both sides.
        (0, FILE_BYTES + 1, [(FILE_BYTES, 0, 1)]),
        (
            5 * FILE_BYTES - 1,
            9 * FILE_BYTES,
            [(4 * FILE_BYTES, FILE_BYTES - mmap.PAGESIZE, mmap.PAGESIZE)],
        ),
        # Nothing to flush.
        (2 * FILE_BYTES, 2 * FILE_BYTES, []),
        (6 * FILE_BYTES, 7 * FILE_BYTES, []),
        (0, FILE_BYTES, []),
    ],
)
def test_a_flush_visits_exactly_the_files_its_range_touches(
    files: MappedFileList, low: int, high: int, expected: list[tuple[int, int, int]]
) -> None:
    flushed = spy_on(files)
    files.flush(low, high)
    assert flushed == expected
    files.close()


def test_covers_needs_every_position_in_a_file(files: MappedFileList) -> None:
    assert files.covers(FILE_BYTES, 5 * FILE_BYTES)
    assert files.covers(3 * FILE_BYTES + 5, 3 * FILE_BYTES + 6)
    assert not files.covers(FILE_BYTES - 1, 2 * FILE_BYTES)
    assert not files.covers(4 * FILE_BYTES, 5 * FILE_BYTES + 1)
    files.close()
    assert not files.covers(FILE_BYTES, 2 * FILE_BYTES)  # no files at all


def test_writes_within_a_file_and_across_files_land_in_place(files: MappedFileList) -> None:
    within = bytes(range(200))
    files.write(FILE_BYTES + 3, within)  # one pwrite
    across = bytes(range(256)) * 40  # 10240 bytes over three files
    files.write(2 * FILE_BYTES - 17, across)  # the loop, file by file
    files.write_vectors(4 * FILE_BYTES + 8, [b"ab", memoryview(b"cde"), bytearray(b"f")])
    stream = b"".join(bytes(mapped.map[:]) for mapped in files.files)
    assert stream[3 : 3 + len(within)] == within
    assert stream[FILE_BYTES - 17 : FILE_BYTES - 17 + len(across)] == across
    assert stream[3 * FILE_BYTES + 8 : 3 * FILE_BYTES + 14] == b"abcdef"
    files.close()

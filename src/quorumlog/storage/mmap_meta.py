"""The mmap store's options and its meta file: checks, defaults, creation and loading."""

from __future__ import annotations

import os
from pathlib import Path

from quorumlog.errors import CorruptLogError
from quorumlog.storage.files import disk_errors, fsync_directory
from quorumlog.storage.filesystem import atomic_write
from quorumlog.storage.mmap_format import (
    ENTRY_ALIGNMENT_BYTES,
    ENTRY_HEADER_BYTES,
    ENTRY_SIZE_MAX,
    INDEX_SLOT_BYTES,
    Meta,
    decode_meta,
    encode_meta,
    entry_size,
)

DATA_DIRECTORY = "data"
INDEX_DIRECTORY = "index"
META_FILE = "meta"


def check_options(data_file_bytes: int, index_file_bytes: int, entry_bytes_max: int) -> None:
    if entry_bytes_max < 0:
        raise ValueError(f"entry_bytes_max must be >= 0, got {entry_bytes_max}")
    if entry_size(entry_bytes_max) > ENTRY_SIZE_MAX:
        raise ValueError(f"entry_bytes_max={entry_bytes_max} does not fit the u32 size field")
    if data_file_bytes <= 0 or data_file_bytes % ENTRY_ALIGNMENT_BYTES:
        raise ValueError(
            f"data_file_bytes must be a positive multiple of {ENTRY_ALIGNMENT_BYTES}, "
            f"got {data_file_bytes}"
        )
    if entry_size(entry_bytes_max) > data_file_bytes:
        raise ValueError(
            f"an entry of entry_bytes_max={entry_bytes_max} bytes takes "
            f"{entry_size(entry_bytes_max)} bytes with its header and must fit one data file "
            f"of data_file_bytes={data_file_bytes}"
        )
    if index_file_bytes <= 0 or index_file_bytes % INDEX_SLOT_BYTES:
        raise ValueError(
            f"index_file_bytes must be a positive multiple of {INDEX_SLOT_BYTES}, "
            f"got {index_file_bytes}"
        )


def largest_entry_bytes(data_file_bytes: int) -> int:
    """The most entry data that fits one data file of `data_file_bytes` with its header."""
    usable = data_file_bytes - data_file_bytes % ENTRY_ALIGNMENT_BYTES
    return max(0, usable - ENTRY_HEADER_BYTES)


def open_meta(root: Path, data_file_bytes: int, index_file_bytes: int) -> Meta:
    """Read the meta file, or create the store's directories and a fresh meta."""
    meta_path = root / META_FILE
    with disk_errors(root):
        for directory in (root, root / DATA_DIRECTORY, root / INDEX_DIRECTORY):
            directory.mkdir(parents=True, exist_ok=True)
        encoded = meta_path.read_bytes() if meta_path.exists() else None
    if encoded is None:
        for name in (DATA_DIRECTORY, INDEX_DIRECTORY):
            if any(entry.isdigit() for entry in os.listdir(root / name)):
                raise CorruptLogError(
                    str(meta_path), 0, f"the meta file is missing but {name}/ holds files"
                )
        meta = Meta(
            data_file_bytes=data_file_bytes,
            index_file_bytes=index_file_bytes,
            first_index=1,
            slot_base_index=1,
            first_data_position=0,
            first_entry_present=False,
        )
        atomic_write(meta_path, encode_meta(meta))
        with disk_errors(root):
            fsync_directory(root)
            fsync_directory(root.parent)
        return meta
    decoded = decode_meta(encoded)
    if isinstance(decoded, str):
        raise CorruptLogError(str(meta_path), 0, decoded)
    if (decoded.data_file_bytes, decoded.index_file_bytes) != (data_file_bytes, index_file_bytes):
        raise ValueError(
            f"the store at {root} was created with data_file_bytes={decoded.data_file_bytes} "
            f"and index_file_bytes={decoded.index_file_bytes}; open it with the same sizes "
            f"(got {data_file_bytes} and {index_file_bytes})"
        )
    if decoded.first_data_position % ENTRY_ALIGNMENT_BYTES or decoded.first_index < 1:
        raise CorruptLogError(str(meta_path), 0, f"meta holds impossible values: {decoded}")
    return decoded

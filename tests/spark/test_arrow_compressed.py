"""The Spark reader's decoding of record batches written by the newer producer: compressed
batches (wire.RecordBatch format 2) and tombstones (a null value)."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.codec.compression import compress
from quorumlog.codec.wire import Record, RecordBatch, encode_record_batch
from quorumlog.spark.arrow import RecordColumns, decode_stored_batch

RECORDS = [Record(value=b"v0", key=b"k0"), Record(value=None, key=b"gone"), Record(value=b"v2")]


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
def test_compressed_batches_and_tombstones_become_rows(codec: str) -> None:
    if codec == "none":
        batch = RecordBatch("p", 0, 1_700_000_000_000, RECORDS)
    else:
        payload = compress(codec, msgspec.msgpack.encode(RECORDS))
        batch = RecordBatch("p", 0, 1_700_000_000_000, [], codec, payload, len(RECORDS))
    data = encode_record_batch(batch)
    columns = RecordColumns("t", 0)
    assert columns.add_batch(10, decode_stored_batch(data), 10, 13, len(data)) == 3
    rows = columns.take().to_pylist()
    assert [(row["offset"], row["key"], row["value"]) for row in rows] == [
        (10, b"k0", b"v0"),
        (11, b"gone", None),
        (12, None, b"v2"),
    ]

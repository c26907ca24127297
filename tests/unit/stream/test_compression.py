"""Record batch compression: the codecs, the node's checks on a compressed produce, and
the batch format (an uncompressed batch encodes as before compression existed)."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.codec import wire
from quorumlog.codec.compression import CompressionError, compress, decompress
from quorumlog.node.compressed_batches import compressed_batch_problem
from quorumlog.stream.fetching import batch_decoder, batch_records

RECORDS = [wire.Record(b"v" * 50, b"k"), wire.Record(None, b"gone", 7, [("h", b"1")])]


def produce(codec: str, payload: bytes, count: int) -> wire.Produce:
    return wire.Produce(1, "t", 0, "p", 0, [], codec, payload, count)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_batch_checks_and_reads_back(codec: str) -> None:
    payload = compress(codec, msgspec.msgpack.encode(RECORDS))
    assert compressed_batch_problem(produce(codec, payload, 2), 100, 1000) is None
    batch = wire.RecordBatch("p", 0, 5, [], codec, payload, 2)
    decoded = batch_decoder.decode(wire.encode_record_batch(batch))
    assert [(r.value, r.key) for r in batch_records(decoded)] == [
        (b"v" * 50, b"k"),
        (None, b"gone"),
    ]


def test_the_node_refuses_unsound_compressed_batches() -> None:
    payload = compress("zstd", msgspec.msgpack.encode(RECORDS))
    miscounted = compressed_batch_problem(produce("zstd", payload, 3), 100, 1000)
    assert miscounted is not None and "says 3 records" in miscounted[1]
    damaged = compressed_batch_problem(produce("zstd", payload[:-4] + b"xxxx", 2), 100, 1000)
    assert damaged is not None and damaged[0] is wire.ErrorCode.BAD_REQUEST
    unknown = compressed_batch_problem(produce("gzip", payload, 2), 100, 1000)
    assert unknown is not None and "unknown compression" in unknown[1]
    too_big = compressed_batch_problem(produce("zstd", payload, 2), 100, 10)
    assert too_big is not None and too_big[0] is wire.ErrorCode.TOO_LARGE
    with pytest.raises(CompressionError):
        decompress("lz4", b"not a frame")


def test_an_uncompressed_batch_encodes_as_format_one() -> None:
    batch = wire.RecordBatch("p", 3, 9, [wire.Record(b"v")])
    assert msgspec.msgpack.decode(wire.encode_record_batch(batch)) == [
        "p",
        3,
        9,
        [[b"v", None, 0, []]],
    ]
    old = msgspec.msgpack.encode(["p", 3, 9, [[b"v", None, 0, []]]])
    assert batch_records(batch_decoder.decode(old))[0].value == b"v"

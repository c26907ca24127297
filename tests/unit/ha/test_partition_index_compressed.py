"""An HA partition's commit log holding compressed batches (issue 16): the message layout
is unchanged and its batch is a `wire.RecordBatch` of version 2, so a broker that becomes
master indexes them from its log alone, producer table included, and a fetch returns the
producer's compressed bytes, which read back as the records."""

from __future__ import annotations

from pathlib import Path

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.compression import compress
from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.partition_index import HAPartitionIndex, decode_message, encode_message
from quorumlog.node.ha_topics import stored_batch
from quorumlog.stream.fetching import batch_decoder, batch_records
from quorumlog.stream.partition import ProduceOutcome


def produce(producer_id: str, base_sequence: int, values: list[bytes], codec: str) -> wire.Produce:
    records = [wire.Record(value) for value in values]
    if codec == "none":
        return wire.Produce(1, "t", 0, producer_id, base_sequence, records)
    packed = compress(codec, msgspec.msgpack.encode(records))
    return wire.Produce(
        1, "t", 0, producer_id, base_sequence, [], codec, packed, record_count=len(records)
    )


def test_a_new_master_indexes_compressed_batches_from_its_log(tmp_path: Path) -> None:
    log = MmapCommitLog.open(tmp_path / "log", data_file_bytes=1 << 20, index_file_bytes=1 << 16)
    requests = [
        produce("p", 0, [b"a", b"b"], "none"),
        produce("p", 2, [b"c%d" % n for n in range(30)], "zstd"),
        produce("q", 0, [b"d", b"e", b"f"], "lz4"),
    ]
    base_offset = 0
    for number, request in enumerate(requests):
        count = request.record_count or len(request.records)
        data = wire.encode_record_batch(stored_batch(request, 1000 + number))
        log.append([encode_message(base_offset, count, data)], epoch=1)
        base_offset += count
    index = HAPartitionIndex()
    assert index.catch_up(log) == 3
    assert (index.base_offsets, index.next_offset) == ([0, 2, 32], 35)
    assert index.admit("p", 2, 30) == ProduceOutcome(2, 30, duplicate=True)
    assert index.admit("q", 3, 1) == ProduceOutcome(35, 1)
    read = log.read_batch(index.starts[1], 1 << 20)
    assert read is not None
    _, count, data = decode_message(read.messages[0])
    batch = batch_decoder.decode(data)
    assert (batch.compression, batch.record_count, batch.timestamp_ms) == ("zstd", 30, 1001)
    assert [record.value for record in batch_records(batch)] == [b"c%d" % n for n in range(30)]
    log.close()

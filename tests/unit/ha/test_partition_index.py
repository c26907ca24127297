"""HAPartitionIndex: rebuilt from a commit log, producer table included, without decoding
the records of each batch (a slave indexes every batch it receives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.codec import wire
from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.partition_index import HAPartitionIndex, decode_batch_head, encode_message


def batch_message(base_offset: int, producer_id: str, base_sequence: int, count: int) -> bytes:
    records = [wire.Record(value=b"v" * 10, key=b"k") for _ in range(count)]
    batch = wire.RecordBatch(producer_id, base_sequence, 1_700_000_000_000, records)
    return encode_message(base_offset, count, wire.encode_record_batch(batch))


@pytest.mark.parametrize("producer_id", ["p", "x" * 31, "y" * 32, "z" * 300, "w" * 70_000])
@pytest.mark.parametrize("base_sequence", [0, 127, 128, 65_536, 2**40, -1, -33, -200])
def test_the_head_of_a_batch_is_its_producer_and_sequence(
    producer_id: str, base_sequence: int
) -> None:
    """Every msgpack width of the two leading fields, read from the first bytes."""
    records = [wire.Record(value=b"x" * 30) for _ in range(3)]
    compressed = wire.RecordBatch(
        producer_id, base_sequence, 5, [], compression="zstd", compressed=b"z", record_count=3
    )
    for batch in (wire.RecordBatch(producer_id, base_sequence, 5, records), compressed):
        data = wire.encode_record_batch(batch)
        for view in (data, memoryview(b"header" + data)[6:]):
            head = decode_batch_head(view)
            assert (head.producer_id, head.base_sequence) == (producer_id, base_sequence)


def test_a_malformed_head_is_refused() -> None:
    data = wire.encode_record_batch(wire.RecordBatch("producer", 1, 5, []))
    for malformed in (data[:4], b"\x92\xa3ab", b"\x93\x01\x02\x03", b"\x92\xa1\xff\x01"):
        with pytest.raises(ValueError):
            decode_batch_head(malformed)


def test_catch_up_rebuilds_offsets_and_producers_without_decoding_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MmapCommitLog.open(tmp_path / "log", data_file_bytes=4096, index_file_bytes=32 * 64)
    master = HAPartitionIndex()
    master.catch_up(log)  # becoming master: nothing to read yet
    sequences = {"a": 0, "b": 0}
    for producer_id, count in [("a", 3), ("b", 5), ("a", 2)]:
        sequence = sequences[producer_id]
        sequences[producer_id] += count
        outcome = master.admit(producer_id, sequence, count)
        assert not isinstance(outcome, Exception) and not outcome.duplicate
        start = log.max_offset
        end = log.append([batch_message(outcome.base_offset, producer_id, sequence, count)], 1)
        master.appended(start, end, outcome.base_offset, count)

    def no_full_decode(data: bytes) -> wire.RecordBatch:
        raise AssertionError("indexing decoded every record of a batch")

    monkeypatch.setattr(wire, "decode_record_batch", no_full_decode)
    slave = HAPartitionIndex()
    assert slave.catch_up(log, 2) == 2  # a step at a time, as a slave indexes
    assert slave.catch_up(log) == 1
    assert (slave.base_offsets, slave.starts, slave.ends) == (
        master.base_offsets,
        master.starts,
        master.ends,
    )
    assert slave.next_offset == master.next_offset == 10
    retried = slave.admit("b", 0, 5)  # a retry of b's batch is a duplicate with its offsets
    assert not isinstance(retried, Exception)
    assert (retried.duplicate, retried.base_offset) == (True, 3)

"""Fetching records from partitions: the request, its retries at the leader, and the
decoding of the fetched batches into `Record`s (the consumer's hot loop)."""

from __future__ import annotations

from itertools import count

import msgspec

from quorumlog.codec.compression import NONE, CompressionError, decompress
from quorumlog.codec.wire import ErrorCode, Fetch, FetchResult
from quorumlog.errors import RequestRejectedError
from quorumlog.stream.client_common import (
    OffsetOutOfRangeError,
    StreamTransport,
    leader_status,
)
from quorumlog.stream.records import Record

FETCH_BYTES_MAX_DEFAULT = 4 * 1024 * 1024
READ_RECORDS_MAX_DEFAULT = 10_000


class FetchedRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`codec.wire.Record`'s layout, decoded without garbage-collector tracking: a fetch
    makes tens of thousands of these at once, and tracked ones cost more in collections
    than in decoding (measured). They hold no references back, so they form no cycles."""

    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: list[tuple[str, bytes]] = []


class FetchedRecordBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`codec.wire.RecordBatch`'s layout (a test checks the two decode alike)."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[FetchedRecord]
    compression: str = NONE
    compressed: bytes = b""
    record_count: int = -1


batch_decoder = msgspec.msgpack.Decoder(FetchedRecordBatch)
records_decoder = msgspec.msgpack.Decoder(list[FetchedRecord])


def batch_records(batch: FetchedRecordBatch) -> list[FetchedRecord]:
    """The batch's records, decompressed if it was compressed (CompressionError if its
    payload is damaged, which the partition's checks on produce rule out)."""
    if batch.compression == NONE:
        return batch.records
    records = records_decoder.decode(decompress(batch.compression, batch.compressed))
    if len(records) != batch.record_count:
        raise CompressionError(
            f"a batch says {batch.record_count} records and holds {len(records)}"
        )
    return records


def check_read(offset: int, max_records: int) -> None:
    if offset < 0:
        raise ValueError(f"offset must not be negative, got {offset}")
    if max_records < 1:
        raise ValueError(f"max_records must be positive, got {max_records}")


async def fetch(
    transport: StreamTransport,
    topic: str,
    partition: int,
    offset: int,
    records_max: int,
    bytes_max: int,
    leader_only: bool = False,
    max_wait_ms: int = 0,
) -> FetchResult:
    """Fetch from any replica (or only the leader); an out-of-range answer is checked with
    the leader. `max_wait_ms`: at the end of the partition, the replica holds the fetch up
    to that long for records to arrive (long polling; ledger and HA partitions answer at
    once)."""

    def make_request(request_id: int) -> Fetch:
        return Fetch(
            request_id=request_id,
            topic=topic,
            partition=partition,
            offset=offset,
            records_max=records_max,
            bytes_max=bytes_max,
            leader_only=leader_only,
            max_wait_ms=max_wait_ms,
        )

    what = f"fetch of {topic!r} partition {partition} at {offset}"
    try:
        return await transport.partition_call(
            topic, partition, what, make_request, FetchResult, side_effects=False, at_leader=False
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.OUT_OF_RANGE.value:
            raise
    status = await leader_status(transport, topic, partition)
    leader = status.leader
    descriptor = await transport.topic(topic)
    leader_address = transport.address_of(descriptor, leader) if leader is not None else None
    if not status.begin_offset <= offset <= status.end_offset or leader_address is None:
        raise OffsetOutOfRangeError(
            topic, partition, offset, status.begin_offset, status.end_offset
        )
    # A follower behind the leader answered: the leader has the offset.
    try:
        return await transport.partition_call(
            topic,
            partition,
            what,
            make_request,
            FetchResult,
            side_effects=False,
            at_leader=False,
            fixed_endpoint=leader_address,
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.OUT_OF_RANGE.value:
            raise
        raise OffsetOutOfRangeError(
            topic, partition, offset, status.begin_offset, status.end_offset
        ) from None


def decode_records(
    topic: str, partition: int, offset: int, result: FetchResult, max_records: int
) -> list[Record]:
    """The records of the fetched batches from `offset` on, at most `max_records`.

    Per record only what the result needs is done: one msgspec decode of the batch, one
    Record built per record (the hot loop of a consumer)."""
    records: list[Record] = []
    for fetched in result.batches:
        wanted = max_records - len(records)
        if wanted <= 0:
            break
        batch = batch_decoder.decode(fetched.data)
        skip = max(offset - fetched.base_offset, 0)
        items = batch_records(batch)[skip : skip + wanted]
        stamp = batch.timestamp_ms
        records += [
            Record(
                topic,
                partition,
                record_offset,
                item.key,
                item.value,
                item.timestamp_ms or stamp,
                item.headers,
            )
            for record_offset, item in zip(count(fetched.base_offset + skip), items)
        ]
    return records


__all__ = [
    "FETCH_BYTES_MAX_DEFAULT",
    "READ_RECORDS_MAX_DEFAULT",
    "FetchedRecord",
    "FetchedRecordBatch",
    "batch_decoder",
    "check_read",
    "decode_records",
    "fetch",
]

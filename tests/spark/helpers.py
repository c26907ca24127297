"""Test helpers: put records into a topic and read a whole topic back, through the wire."""

from __future__ import annotations

import itertools
import uuid

from quorumlog.codec.wire import Record, decode_record_batch
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.options import ConnectionOptions

topic_numbers = itertools.count()


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{next(topic_numbers)}-{uuid.uuid4().hex[:6]}"


def produce_values(
    endpoints: str, topic: str, partition: int, values: list[bytes], chunk: int = 500
) -> None:
    """Append `values` (as records without key) to one partition, in order."""
    produce_records(endpoints, topic, partition, [Record(value=value) for value in values], chunk)


def produce_records(
    endpoints: str, topic: str, partition: int, records: list[Record], chunk: int = 500
) -> None:
    """Append `records` to one partition, in order, `chunk` to a batch."""
    producer_id = f"test-{uuid.uuid4().hex}"
    with ClusterAccess(ConnectionOptions(endpoints.split(","), timeout_seconds=10)) as access:
        access.list_topics()
        for start in range(0, len(records), chunk):
            access.produce((topic, partition), producer_id, start, records[start : start + chunk])


def read_topic(
    endpoints: str, topic: str, cluster_id: str = CLUSTER_ID_DEFAULT
) -> dict[int, list[Record]]:
    """Every record of every partition of `topic`, in offset order, per partition."""
    connection = ConnectionOptions(endpoints.split(","), cluster_id, timeout_seconds=10)
    with ClusterAccess(connection) as access:
        descriptor = access.describe_topics([topic], "topic")[topic]
        found: dict[int, list[Record]] = {}
        for partition in range(descriptor.settings.partitions):
            bounds = access.bounds((topic, partition))
            records: list[Record] = []
            offset = bounds.begin
            while offset < bounds.end:
                result = access.fetch((topic, partition), offset, 10_000, 4 << 20)
                for fetched in result.batches:
                    batch = decode_record_batch(fetched.data)
                    skip = max(offset - fetched.base_offset, 0)
                    records += batch.records[skip:]
                    offset = fetched.base_offset + len(batch.records)
            found[partition] = records
        return found

"""The rows the `quorumlog` format reads and writes, as Spark and Arrow types.

The read schema is the Kafka source's, so users' habits carry over:

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int, headers array<struct<key string, value binary>>

`timestampType` is 0 when the producer set the record's time (Kafka's CreateTime) and 1
when the partition leader stamped it on append (LogAppendTime). `headers` is null for a
record without headers, as in Kafka.

Rows travel to Spark as Arrow record batches built column by column from the encoded
record batches a Fetch returns: one decode per log entry, one list per column, no row
objects. `read()` results must match `ARROW_SCHEMA` exactly (Spark checks it).
"""

from __future__ import annotations

from array import array
from itertools import accumulate

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from quorumlog.codec.wire import Record, RecordBatch

TIMESTAMP_TYPE_CREATE_TIME = 0
TIMESTAMP_TYPE_LOG_APPEND_TIME = 1

HEADER_SPARK_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)
SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
        StructField("headers", ArrayType(HEADER_SPARK_TYPE, True), True),
    ]
)

HEADER_ARROW_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")
"""Spark's TimestampType as Arrow: microseconds, UTC."""
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP_ARROW_TYPE),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(HEADER_ARROW_TYPE)),
    ]
)

TABLE_SPARK_SCHEMA = StructType(
    [StructField("key", StringType(), True), StructField("value", StringType(), True)]
)
TABLE_ARROW_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string())])

MICROSECONDS_PER_MILLISECOND = 1000


BINARY_OFFSET_MAX = 2**31 - 1
"""Arrow's `binary` type indexes its data with 32-bit offsets."""


def binary_array(values: list[bytes]) -> pa.Array:
    """A binary Arrow array built from one joined buffer and its offsets: Arrow's
    conversion of a Python list costs about 1 µs per value, this about 0.06 (measured)."""
    ends = list(accumulate(map(len, values)))
    if ends and ends[-1] > BINARY_OFFSET_MAX:
        return pa.array(values, pa.binary())  # too large for 32-bit offsets in one array
    offsets = array("i", [0])
    offsets.extend(ends)
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
    )


def repeated_string(text: str, count: int) -> pa.Array:
    """`count` copies of `text` as a string array, from buffers (pa.repeat of a string
    scalar costs about 1 µs per copy, measured)."""
    encoded = text.encode()
    offsets = array("i", range(0, (count + 1) * len(encoded), len(encoded) or 1))
    if not encoded:
        offsets = array("i", [0] * (count + 1))
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * count)]
    )


class RecordColumns:
    """Records of one topic partition gathered column by column, handed out as Arrow batches."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.clear()

    def clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes] = []
        self.offsets: list[int] = []
        self.timestamps_ms: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []
        self.any_headers = False

    def __len__(self) -> int:
        return len(self.values)

    def add_batch(self, base_offset: int, batch: RecordBatch, start: int, end: int) -> int:
        """Add the batch's records with offsets in [start, end); returns how many."""
        first = max(start - base_offset, 0)
        last = min(end - base_offset, len(batch.records))
        if first >= last:
            return 0
        records = batch.records[first:last]
        self.values += [record.value for record in records]
        self.keys += [record.key for record in records]
        self.offsets += range(base_offset + first, base_offset + last)
        self.add_timestamps(records, batch.timestamp_ms)
        if any(record.headers for record in records):
            self.any_headers = True
            self.headers += [list(record.headers) if record.headers else None for record in records]
        else:
            self.headers += [None] * len(records)
        return last - first

    def add_timestamps(self, records: list[Record], append_time_ms: int) -> None:
        # A record's own time (CreateTime) when its producer set one, else the leader's stamp.
        if all(record.timestamp_ms == 0 for record in records):
            self.timestamps_ms += [append_time_ms] * len(records)
            self.timestamp_types += [TIMESTAMP_TYPE_LOG_APPEND_TIME] * len(records)
            return
        for record in records:
            if record.timestamp_ms:
                self.timestamps_ms.append(record.timestamp_ms)
                self.timestamp_types.append(TIMESTAMP_TYPE_CREATE_TIME)
            else:
                self.timestamps_ms.append(append_time_ms)
                self.timestamp_types.append(TIMESTAMP_TYPE_LOG_APPEND_TIME)

    def take(self) -> pa.RecordBatch:
        """Everything gathered so far as one Arrow batch (ARROW_SCHEMA); starts afresh."""
        count = len(self.values)
        milliseconds = pa.array(self.timestamps_ms, pa.int64())
        timestamps = pc.multiply(milliseconds, MICROSECONDS_PER_MILLISECOND).cast(
            TIMESTAMP_ARROW_TYPE
        )
        if self.any_headers:
            headers = pa.array(self.headers, pa.list_(HEADER_ARROW_TYPE))
        else:
            headers = pa.nulls(count, pa.list_(HEADER_ARROW_TYPE))
        # Columns that repeat one value are built by Arrow from a scalar, not from a
        # Python list of `count` items (that was most of this function's time).
        keys = (
            pa.array(self.keys, pa.binary())
            if any(key is not None for key in self.keys)
            else pa.nulls(count, pa.binary())
        )
        types = self.timestamp_types
        timestamp_types = (
            pa.repeat(pa.scalar(types[0], pa.int32()), count)
            if count and types.count(types[0]) == count
            else pa.array(types, pa.int32())
        )
        batch = pa.RecordBatch.from_arrays(
            [
                keys,
                binary_array(self.values),
                repeated_string(self.topic, count),
                pa.repeat(pa.scalar(self.partition, pa.int32()), count),
                pa.array(self.offsets, pa.int64()),
                timestamps,
                timestamp_types,
                headers,
            ],
            schema=ARROW_SCHEMA,
        )
        self.clear()
        return batch


def table_batch(items: list[tuple[str, str]]) -> pa.RecordBatch:
    """KV pairs as one Arrow batch of TABLE_ARROW_SCHEMA."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([key for key, _ in items], pa.string()),
            pa.array([value for _, value in items], pa.string()),
        ],
        schema=TABLE_ARROW_SCHEMA,
    )

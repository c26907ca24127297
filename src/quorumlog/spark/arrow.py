"""The rows the `quorumlog` format reads and writes, as Spark and Arrow types.

The read schema is the Kafka source's, so users' habits carry over:

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int, headers array<struct<key string, value binary>>

The `headers` column is there only with the option `includeHeaders` true, as in Kafka
(`SPARK_SCHEMA` has it, `SPARK_SCHEMA_WITHOUT_HEADERS` not).

`timestampType` is 0 when the producer set the record's time (Kafka's CreateTime) and 1
when the partition leader stamped it on append (LogAppendTime). `headers` is null for a
record without headers, as in Kafka.

Rows travel to Spark as Arrow record batches built column by column from the encoded
record batches a Fetch returns. An entry whose records share one layout is read straight
from its bytes (`record_scan`: each column a numpy slice, copied once into the Arrow
buffer); any other takes one msgspec decode (in C), then each column in bulk (`map` over
the decoded records, numpy for numbers). No row objects and no Python code per record.
`read()` results must match `ARROW_SCHEMA` exactly (Spark checks it).
"""

from __future__ import annotations

from itertools import chain, groupby
from operator import attrgetter
from typing import cast

import msgspec
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
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

from quorumlog.codec.compression import decompress
from quorumlog.raft.invariants import require
from quorumlog.spark.record_scan import Bytes2D, Int64Array, RecordBlock, scan_entry

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

SPARK_SCHEMA_WITHOUT_HEADERS = StructType(SPARK_SCHEMA.fields[:-1])
ARROW_SCHEMA_WITHOUT_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))


def source_schema(include_headers: bool) -> StructType:
    return SPARK_SCHEMA if include_headers else SPARK_SCHEMA_WITHOUT_HEADERS


TABLE_SPARK_SCHEMA = StructType(
    [StructField("key", StringType(), True), StructField("value", StringType(), True)]
)
TABLE_ARROW_SCHEMA = pa.schema([("key", pa.string()), ("value", pa.string())])

MICROSECONDS_PER_MILLISECOND = 1000


BINARY_OFFSET_MAX = 2**31 - 1
"""Arrow's `binary` type indexes its data with 32-bit offsets."""


def binary_array(values: list[bytes] | list[bytes | None]) -> pa.Array:
    """A binary Arrow array built from one joined buffer and its offsets: Arrow's
    conversion of a Python list costs about 1 µs per value, this about 0.06 (measured);
    the offsets come from numpy over the lengths (half the cost of `accumulate`). Values
    with a None (tombstones) take Arrow's own conversion, which makes them null."""
    if None in values:
        return pa.array(values, pa.binary())
    present = cast(list[bytes], values)
    count = len(present)
    ends = np.empty(count + 1, np.int64)
    ends[0] = 0
    np.cumsum(np.fromiter(map(len, present), np.int64, count), out=ends[1:])
    if ends[-1] > BINARY_OFFSET_MAX:
        return pa.array(values, pa.binary())  # too large for 32-bit offsets in one array
    offsets = ends.astype(np.int32)
    return pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(present))]
    )


def repeated_string(text: str, count: int) -> pa.Array:
    """`count` copies of `text` as a string array, from buffers (pa.repeat of a string
    scalar costs about 1 µs per copy, measured)."""
    encoded = text.encode()
    if count * len(encoded) > BINARY_OFFSET_MAX:
        return pa.repeat(pa.scalar(text, pa.string()), count)
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(len(encoded))
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * count)]
    )


class StoredRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`wire.Record` as the reader decodes it: the same msgpack layout, with headers as a
    tuple so that the common empty one is the shared empty tuple, not a new list per
    record (that halves the decode)."""

    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


class StoredRecordBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`wire.RecordBatch` as the reader decodes it (same layout; see StoredRecord)."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[StoredRecord]
    compression: str = "none"
    compressed: bytes = b""
    record_count: int = -1


stored_batch_decoder = msgspec.msgpack.Decoder(StoredRecordBatch)
stored_records_decoder = msgspec.msgpack.Decoder(list[StoredRecord])
value_of = attrgetter("value")
key_of = attrgetter("key")
timestamp_of = attrgetter("timestamp_ms")
headers_of = attrgetter("headers")


def decode_stored_batch(data: bytes) -> StoredRecordBatch:
    """One log entry's encoded `wire.RecordBatch`; raises one of wire.DECODE_ERRORS."""
    batch: StoredRecordBatch = stored_batch_decoder.decode(data)
    if batch.compression != "none":  # a compressed batch (wire.RecordBatch, version 2)
        records = stored_records_decoder.decode(decompress(batch.compression, batch.compressed))
        batch = msgspec.structs.replace(batch, records=records, compressed=b"")
    return batch


class RecordRun:
    """Records of one log entry with consecutive offsets, as gathered for the next batch:
    decoded records, or a RecordBlock of columns scanned from the entry's bytes."""

    __slots__ = ("append_time_ms", "count", "first_offset", "own_times_ms", "records")

    def __init__(
        self,
        first_offset: int,
        records: list[StoredRecord] | RecordBlock,
        append_time_ms: int,
        own_times_ms: Int64Array | None,
    ) -> None:
        self.first_offset = first_offset
        self.records = records
        self.count = len(records)
        self.append_time_ms = append_time_ms
        self.own_times_ms = own_times_ms
        """Each record's own time (0: none), or None: no record has one."""


StoredEntry = StoredRecordBatch | RecordBlock
"""One log entry as the reader decoded it (`decode_entry`)."""


def decode_entry(data: bytes) -> StoredEntry:
    """One log entry's encoded `wire.RecordBatch`: scanned into columns when its records
    share one layout, else decoded record by record. Raises one of wire.DECODE_ERRORS."""
    block = scan_entry(data)
    return block if block is not None else decode_stored_batch(data)


def entry_record_count(entry: StoredEntry) -> int:
    return len(entry) if isinstance(entry, RecordBlock) else len(entry.records)


class RecordColumns:
    """Records of one topic partition gathered entry by entry, handed out as Arrow batches.

    Entries scanned into RecordBlocks become columns by numpy slicing and one copy; for
    decoded entries each column is built in bulk (attribute reads as `map` over whole
    lists, numbers as numpy arrays). No Python bytecode runs per record unless records
    carry headers (rare, converted one by one).
    """

    def __init__(self, topic: str, partition: int, include_headers: bool = True) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.clear()

    def clear(self) -> None:
        self.runs: list[RecordRun] = []
        self.count = 0
        self.encoded_bytes = 0
        """Encoded bytes of the entries gathered, in proportion to the records taken:
        a bound on the Arrow batch's size."""

    def __len__(self) -> int:
        return self.count

    def add_batch(
        self, base_offset: int, batch: StoredEntry, start: int, end: int, encoded_bytes: int
    ) -> int:
        """Add the records of one log entry (`batch`, at `base_offset`, `encoded_bytes`
        long) with offsets in [start, end); returns how many."""
        total = entry_record_count(batch)
        first = max(start - base_offset, 0)
        last = min(end - base_offset, total)
        if first >= last:
            return 0
        if isinstance(batch, RecordBlock):
            block = batch.rows(first, last)
            run = RecordRun(base_offset + first, block, batch.append_time_ms, block.own_times_ms)
        else:
            records = batch.records
            taken = records if last - first == total else records[first:last]
            own_times: Int64Array | None = None
            # any() over map runs in C: true when some record carries its producer's time.
            if any(map(timestamp_of, taken)):
                own_times = np.fromiter(map(timestamp_of, taken), np.int64, len(taken))
            run = RecordRun(base_offset + first, taken, batch.timestamp_ms, own_times)
        self.runs.append(run)
        self.count += last - first
        self.encoded_bytes += encoded_bytes * (last - first) // total
        return last - first

    def full(self, rows_max: int, bytes_max: int) -> bool:
        return self.count >= rows_max or self.encoded_bytes >= bytes_max

    def take(self) -> pa.RecordBatch:
        """Everything gathered so far as one Arrow batch (ARROW_SCHEMA, or without the
        headers column unless they are included); starts afresh."""
        count = self.count
        keys: list[pa.Array] = []
        values: list[pa.Array] = []
        headers: list[pa.Array] = []
        for scanned, group in groupby(self.runs, key=_is_scanned):
            runs = list(group)
            if scanned:
                blocks = [cast(RecordBlock, run.records) for run in runs]
                keys.append(blocks_binary([(len(block), block.keys) for block in blocks]))
                values.append(blocks_binary([(len(block), block.values) for block in blocks]))
                if self.include_headers:
                    size = sum(len(block) for block in blocks)
                    headers.append(pa.nulls(size, pa.list_(HEADER_ARROW_TYPE)))
                continue
            records = list(
                chain.from_iterable(cast(list[StoredRecord], run.records) for run in runs)
            )
            keys.append(key_column(records))
            values.append(binary_array(list(map(value_of, records))))
            if self.include_headers:
                headers.append(headers_column(records))
        timestamps, timestamp_types = self.timestamp_columns()
        columns = [
            concatenated(keys, pa.binary()),
            concatenated(values, pa.binary()),
            repeated_string(self.topic, count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(self.offset_column(), pa.int64()),
            timestamps,
            timestamp_types,
        ]
        schema = ARROW_SCHEMA_WITHOUT_HEADERS
        if self.include_headers:
            columns.append(concatenated(headers, pa.list_(HEADER_ARROW_TYPE)))
            schema = ARROW_SCHEMA
        require(len(columns[1]) == count, "gathered %d records, counted %d", len(columns[1]), count)
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        self.clear()
        return batch

    def offset_column(self) -> Int64Array:
        runs = self.runs
        if not runs:
            return np.zeros(0, np.int64)
        first = runs[0].first_offset
        if runs[-1].first_offset + runs[-1].count - first == self.count:
            return np.arange(first, first + self.count, dtype=np.int64)  # no gap: one range
        return np.concatenate(
            [np.arange(run.first_offset, run.first_offset + run.count) for run in runs]
        )

    def timestamp_columns(self) -> tuple[pa.Array, pa.Array]:
        """(timestamp, timestampType): a record's own time (CreateTime) when its producer
        set one, else the leader's stamp on its entry (LogAppendTime)."""
        runs = self.runs
        sizes = [run.count for run in runs]
        times_ms = np.repeat(np.array([run.append_time_ms for run in runs], np.int64), sizes)
        types = np.full(self.count, TIMESTAMP_TYPE_LOG_APPEND_TIME, np.int32)
        start = 0
        for run, size in zip(runs, sizes, strict=True):
            own = run.own_times_ms
            if own is not None:  # only then are a record's own times looked at
                created = own != 0
                times_ms[start : start + size][created] = own[created]
                types[start : start + size][created] = TIMESTAMP_TYPE_CREATE_TIME
            start += size
        microseconds = times_ms * MICROSECONDS_PER_MILLISECOND
        return pa.array(microseconds, TIMESTAMP_ARROW_TYPE), pa.array(types, pa.int32())


def _is_scanned(run: RecordRun) -> bool:
    return isinstance(run.records, RecordBlock)


def concatenated(parts: list[pa.Array], arrow_type: pa.DataType) -> pa.Array:
    if not parts:
        return pa.array([], arrow_type)
    return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


def blocks_binary(blocks: list[tuple[int, Bytes2D | None]]) -> pa.Array:
    """A binary Arrow array from (row count, rows of bytes or None: that many nulls) pairs:
    the rows are copied once, into the array's data buffer."""
    count = sum(size for size, _ in blocks)
    if all(rows is None for _, rows in blocks):
        return pa.nulls(count, pa.binary())
    widths = [0 if rows is None else rows.shape[1] for _, rows in blocks]
    lengths = np.repeat(np.array(widths, np.int64), [size for size, _ in blocks])
    ends = np.empty(count + 1, np.int64)
    ends[0] = 0
    np.cumsum(lengths, out=ends[1:])
    require(ends[-1] <= BINARY_OFFSET_MAX, "%d bytes for one binary array", int(ends[-1]))
    data = np.empty(int(ends[-1]), np.uint8)
    position = 0
    for (size, rows), width in zip(blocks, widths, strict=True):
        if rows is not None:
            data[position : position + size * width].reshape(size, width)[...] = rows
            position += size * width
    validity = None
    null_count = sum(size for size, rows in blocks if rows is None)
    if null_count:
        present = np.repeat([rows is not None for _, rows in blocks], [size for size, _ in blocks])
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    buffers = [validity, pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), count, buffers, null_count=null_count)


def key_column(records: list[StoredRecord]) -> pa.Array:
    keys = list(map(key_of, records))
    nulls = keys.count(None)
    if nulls == len(keys):
        return pa.nulls(len(keys), pa.binary())
    if nulls:
        return pa.array(keys, pa.binary())  # Arrow's conversion sets the validity bits
    return binary_array(keys)  # no None among them


def headers_column(records: list[StoredRecord]) -> pa.Array:
    """Null for a record without headers, as in Kafka; a list of (key, value) otherwise."""
    if not any(map(headers_of, records)):
        return pa.nulls(len(records), pa.list_(HEADER_ARROW_TYPE))
    return pa.array(
        [list(headers) if headers else None for headers in map(headers_of, records)],
        pa.list_(HEADER_ARROW_TYPE),
    )


def table_batch(items: list[tuple[str, str]]) -> pa.RecordBatch:
    """KV pairs as one Arrow batch of TABLE_ARROW_SCHEMA."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([key for key, _ in items], pa.string()),
            pa.array([value for _, value in items], pa.string()),
        ],
        schema=TABLE_ARROW_SCHEMA,
    )

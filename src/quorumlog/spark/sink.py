"""Writes: `df.write.format("quorumlog")` and `df.writeStream.format("quorumlog")`.

Columns, as the Kafka sink takes them: `value` (binary or string, required), and
optionally `key` (binary or string), `topic` (string; the `topic` option wins), `partition`
(int) and `headers` (array<struct<key string, value binary>>). Other columns are ignored.
A row without a partition goes where the Producer would send its key (crc32c mod
partitions), or, without a key, to the partitions in turn from the task's own number.

Exactly once. Every task writes as its own producer, and the cluster drops a Produce whose
(producer id, sequence) it has already appended. The producer id is a pure function of
the work: for a stream `spark-stream-<query id>-<batch id>-<task partition>` (the query id
survives restarts from the checkpoint, the batch id is the micro-batch's), for a batch job
`spark-write-<job uuid>-<task partition>`. Sequences start at 0 per topic partition and
requests are cut at fixed record counts, so a task run again over the same rows in the same
order sends byte-for-byte the same Produce requests, and the cluster keeps only the first.
A replayed micro-batch reads the same rows (see `stream_source.py`), so a stream from a
replayable source into this sink is exactly once. A batch job is exactly once across task
retries; running the whole job again is a new job (new uuid) and writes again.

One attempt may cut differently, though: when a stage before the sink fails in the same
task, Spark ends the sink's input as if it were complete, so the sink sends its last,
partial request (say sequences [0, 400)) before the task fails. Its retry then sends
[0, 1000), which straddles what the partition expects next (400) and is refused as out of
order. The sink then splits the request in halves, recursively: a piece wholly below 400
is answered as a duplicate, the piece that starts at 400 is appended, and every piece after
it follows in order. A single record cannot straddle, so a refusal of one record is a real
sequence gap and fails the task; the splitting costs about 2·log2(records) requests, only
on such a retry.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from quorumlog.codec.wire import ErrorCode, Record, TopicDescriptor
from quorumlog.errors import QuorumLogError, RequestRejectedError
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import OptionError
from quorumlog.spark.offsets import TopicPartition
from quorumlog.spark.options import SinkOptions
from quorumlog.stream.client_common import partition_for_key

PRODUCE_RECORDS_MAX = 1_000
PRODUCE_BYTES_MAX = 1024 * 1024
"""A Produce request is cut at whichever bound comes first; both depend only on the rows,
so a retried task cuts its requests at the same places (same sequences)."""

# Local properties Spark sets on a micro-batch's tasks (StreamExecution.QUERY_ID_KEY and
# MicroBatchExecution.BATCH_ID_KEY in Spark 4); the query id is the checkpointed one.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

VALUE_TYPES = (BinaryType, StringType)


class SinkColumnError(QuorumLogError, ValueError):
    """The DataFrame to write lacks `value`, or a known column has the wrong type."""


class WriteSummary(WriterCommitMessage):
    def __init__(self, producer_id: str, records: int, duplicates: int) -> None:
        self.producer_id = producer_id
        self.records = records
        self.duplicates = duplicates
        """Records the cluster had already (a retried task or a replayed micro-batch)."""


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Raise SinkColumnError / OptionError for a DataFrame this sink cannot write."""
    fields = {field.name: field.dataType for field in schema.fields}
    expected: dict[str, tuple[str, tuple[type[DataType], ...]]] = {
        "value": ("binary or string", VALUE_TYPES),
        "key": ("binary or string", VALUE_TYPES),
        "topic": ("string", (StringType,)),
        "partition": ("int", (IntegerType,)),
        "headers": ("array<struct<key:string,value:binary>>", (ArrayType,)),
    }
    if "value" not in fields:
        raise SinkColumnError(
            f"the DataFrame to write needs a 'value' column (binary or string); it has "
            f"{', '.join(fields) or 'no columns'}"
        )
    for name, (description, types) in expected.items():
        if name in fields and not isinstance(fields[name], types):
            raise SinkColumnError(
                f"column {name!r} must be {description}, not {fields[name].simpleString()}"
            )
    if "headers" in fields and fields["headers"].simpleString() != (
        "array<struct<key:string,value:binary>>"
    ):
        raise SinkColumnError(
            "column 'headers' must be array<struct<key:string,value:binary>>, not "
            + fields["headers"].simpleString()
        )
    if options.topic is None and "topic" not in fields:
        raise OptionError("topic", 'required: .option("topic", "name") or a topic column')


class PartitionChooser:
    """Where a row without a `partition` goes; deterministic for the same rows in order."""

    def __init__(self, task_partition: int) -> None:
        self.next_turn = task_partition

    def choose(self, key: bytes | None, partitions: int) -> int:
        if key is not None:
            return partition_for_key(key, partitions)
        chosen = self.next_turn % partitions
        self.next_turn += 1
        return chosen


class PendingProduce:
    """Records gathered for one topic partition, with the sequence the next request takes."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.bytes = 0
        self.next_sequence = 0


class TaskWriter:
    """One task's writes as one producer; see the module docstring for the identity."""

    def __init__(self, options: SinkOptions, producer_id: str, task_partition: int) -> None:
        self.options = options
        self.producer_id = producer_id
        self.chooser = PartitionChooser(task_partition)
        self.access = ClusterAccess(options.connection, "spark-write")
        self.topics: dict[str, TopicDescriptor] = {}
        self.pending: dict[TopicPartition, PendingProduce] = {}
        self.records = 0
        self.duplicates = 0

    def write(self, batches: Iterator[pa.RecordBatch]) -> WriteSummary:
        try:
            for batch in batches:
                self.write_batch(batch)
            for key in sorted(self.pending):
                self.flush(key)
        finally:
            self.access.close()
        return WriteSummary(self.producer_id, self.records, self.duplicates)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        values = batch.column("value").to_pylist()
        count = len(values)
        keys = batch.column("key").to_pylist() if "key" in names else [None] * count
        topics = batch.column("topic").to_pylist() if "topic" in names else [None] * count
        partitions = (
            batch.column("partition").to_pylist() if "partition" in names else [None] * count
        )
        headers = batch.column("headers").to_pylist() if "headers" in names else [None] * count
        for value, key, topic, partition, row_headers in zip(
            values, keys, topics, partitions, headers, strict=True
        ):
            self.add(value, key, topic, partition, row_headers)

    def add(
        self,
        value: bytes | str | None,
        key: bytes | str | None,
        row_topic: str | None,
        partition: int | None,
        headers: list[dict[str, object]] | None,
    ) -> None:
        if value is None:
            raise SinkColumnError("a row has a null 'value'; every record needs a value")
        topic = self.options.topic or row_topic
        if topic is None:
            raise SinkColumnError("a row has a null 'topic' and no 'topic' option is set")
        key_bytes = key.encode() if isinstance(key, str) else key
        partition_count = self.partition_count(topic)
        if partition is None:
            partition = self.chooser.choose(key_bytes, partition_count)
        elif not 0 <= partition < partition_count:
            raise SinkColumnError(
                f"a row names partition {partition} of {topic!r}, which has {partition_count}"
            )
        record = Record(
            value=value.encode() if isinstance(value, str) else value,
            key=key_bytes,
            headers=header_pairs(headers),
        )
        target = (topic, partition)
        pending = self.pending.setdefault(target, PendingProduce())
        pending.records.append(record)
        pending.bytes += len(record.value or b"") + len(key_bytes or b"")
        if len(pending.records) >= PRODUCE_RECORDS_MAX or pending.bytes >= PRODUCE_BYTES_MAX:
            self.flush(target)

    def partition_count(self, topic: str) -> int:
        descriptor = self.topics.get(topic)
        if descriptor is None:
            descriptor = self.access.describe_topics([topic], "topic")[topic]
            self.topics[topic] = descriptor
        return descriptor.settings.partitions

    def flush(self, target: TopicPartition) -> None:
        pending = self.pending[target]
        if not pending.records:
            return
        self.send(target, pending.next_sequence, pending.records)
        count = len(pending.records)
        pending.next_sequence += count
        self.records += count
        pending.records = []
        pending.bytes = 0

    def send(self, target: TopicPartition, base_sequence: int, records: list[Record]) -> None:
        """Produce `records` at `base_sequence`; split on an out-of-order refusal (an
        earlier attempt cut its last request shorter: see the module docstring)."""
        try:
            result = self.access.produce(target, self.producer_id, base_sequence, records)
        except RequestRejectedError as refusal:
            if refusal.code != ErrorCode.OUT_OF_RANGE.value or len(records) == 1:
                raise
            half = len(records) // 2
            self.send(target, base_sequence, records[:half])
            self.send(target, base_sequence + half, records[half:])
            return
        if result.duplicate:
            self.duplicates += len(records)


def header_pairs(headers: list[dict[str, object]] | None) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    pairs: list[tuple[str, bytes]] = []
    for header in headers:
        key, value = header.get("key"), header.get("value")
        if not isinstance(key, str):
            raise SinkColumnError("a header has a null key")
        pairs.append((key, value if isinstance(value, bytes) else b""))
    return pairs


def task_partition() -> int:
    context = TaskContext.get()
    if context is None:
        raise QuorumLogError("the quorumlog sink must run inside a Spark task")
    return context.partitionId()


class QuorumLogBatchWriter(DataSourceArrowWriter):
    """`df.write`: one producer per task, named after a job id made on the driver."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # Made once on the driver and shipped with the writer: every attempt of a task
        # sees the same id, so a retried task is deduplicated.
        self.job_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        partition = task_partition()
        producer_id = f"spark-write-{self.job_id}-{partition}"
        return TaskWriter(self.options, producer_id, partition).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: the records are visible once each Produce is acknowledged."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing can be undone: records acknowledged before the failure stay."""


class QuorumLogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream`: one producer per (query, micro-batch, task)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteSummary:
        partition = task_partition()
        producer_id = stream_producer_id(partition)
        return TaskWriter(self.options, producer_id, partition).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: a replay of this micro-batch is deduplicated by producer id."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be undone; the micro-batch's replay will not duplicate what stayed."""


def stream_producer_id(partition: int) -> str:
    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
    if not query_id or batch_id is None:
        raise QuorumLogError(
            f"the streaming sink found no {QUERY_ID_PROPERTY!r} / {BATCH_ID_PROPERTY!r} task "
            "property; it needs Spark's micro-batch engine (continuous mode is not supported)"
        )
    return f"spark-stream-{query_id}-{batch_id}-{partition}"

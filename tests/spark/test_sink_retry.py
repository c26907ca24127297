"""The sink's task writer without Spark, against the fake stream cluster (whose partitions
decide each Produce with the real `admit_batch`)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from quorumlog.spark.options import parse_sink_options
from quorumlog.spark.sink import PRODUCE_RECORDS_MAX, TaskWriter
from tests.spark.fake_stream_cluster import FakeStreamCluster
from tests.spark.helpers import read_topic, unique_topic

ROWS_PER_BATCH = 200


def value_batches(count: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, count, ROWS_PER_BATCH):
        values = [b"%06d" % number for number in range(start, min(start + ROWS_PER_BATCH, count))]
        yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])


def test_retry_after_a_short_last_request_writes_each_record_once(
    fake_cluster: FakeStreamCluster,
) -> None:
    """Found on a standalone cluster: a stage before the sink failed in the same task, Spark
    ended the sink's input as if complete, and the sink sent its 400 rows as a last request
    (sequences [0, 400)). The retry's first request, [0, 1000), straddled what the partition
    expected next, was refused as out of order, and the job failed."""
    topic = unique_topic("short-cut")
    fake_cluster.create_topic(topic, partitions=1)
    options = parse_sink_options({"endpoints": fake_cluster.endpoints, "topic": topic})
    producer_id = "spark-write-job-0"
    cut_short = TaskWriter(options, producer_id, 0).write(value_batches(400))
    assert cut_short.records == 400 and cut_short.duplicates == 0

    total = 3 * PRODUCE_RECORDS_MAX // 2
    retry = TaskWriter(options, producer_id, 0).write(value_batches(total))

    assert fake_cluster.out_of_order(topic, 0) >= 1  # the retry did straddle
    assert retry.records == total and retry.duplicates == 400
    stored = read_topic(fake_cluster.endpoints, topic)[0]
    assert [record.value for record in stored] == [b"%06d" % number for number in range(total)]

"""The Kafka source options beyond the basics, without Spark running: topic selection,
times, headers, trigger sizes, Kafka spellings; and the offsets-for-times search against
the fake stream cluster (real wire protocol)."""

from __future__ import annotations

import asyncio
import json
import logging
import random

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from quorumlog.codec.wire import Record
from quorumlog.spark.arrow import SPARK_SCHEMA, SPARK_SCHEMA_WITHOUT_HEADERS
from quorumlog.spark.batch_source import OffsetRange, resolve_batch_offsets
from quorumlog.spark.cluster import ClusterAccess
from quorumlog.spark.errors import OptionError
from quorumlog.spark.offsets import OffsetSpec
from quorumlog.spark.options import (
    ConnectionOptions,
    parse_include_headers,
    parse_sink_options,
    parse_source_options,
)
from quorumlog.spark.stream_source import QuorumLogStreamReader
from quorumlog.stream.offsets_for_times import offset_for_time
from tests.spark.fake_stream_cluster import FakeStreamCluster
from tests.spark.helpers import produce_records, produce_values, unique_topic

ENDPOINTS = "127.0.0.1:7001"


def options(streaming: bool = False, **given: str) -> object:
    return parse_source_options({"endpoints": ENDPOINTS, **given}, streaming)


# --- parsing ------------------------------------------------------------------------------


def test_topic_selection_options() -> None:
    pattern = parse_source_options({"endpoints": ENDPOINTS, "subscribePattern": "ev.*"}, False)
    assert pattern.selection.option == "subscribePattern"
    assert pattern.selection.matches("events") and not pattern.selection.matches("my-events")
    assign = parse_source_options(
        {"endpoints": ENDPOINTS, "assign": json.dumps({"b": [1, 0], "a": [2]})}, False
    )
    assert assign.selection.assigned == [("a", 2), ("b", 0), ("b", 1)]
    assert assign.selection.topics == ["a", "b"]


@pytest.mark.parametrize(
    ("given", "streaming", "message"),
    [
        ({"assign": '{"a": [0]}', "subscribe": "a"}, False, "give only one of subscribe, assign"),
        ({"subscribePattern": "("}, False, "'subscribePattern'.*not a regular expression"),
        ({"assign": '{"a": []}'}, False, "'assign'.*non-empty list"),
        ({"assign": '{"a": [0, 0]}'}, False, "'assign'.*twice"),
        ({"assign": '{"a": ["x"]}'}, False, "'assign'.*not a partition"),
        ({"assign": "[1]"}, False, "'assign'"),
        (
            {"assign": '{"a": [0]}', "startingOffsets": '{"b": {"0": 1}}'},
            False,
            "'startingOffsets'.*not read: b",
        ),
        ({"topic": "t", "startingTimestamp": "yesterday"}, False, "'startingTimestamp'"),
        ({"topic": "t", "startingTimestamp": "-5"}, False, "not negative"),
        (
            {"topic": "t", "startingOffsetsByTimestamp": '{"t": {"0": -2}}'},
            False,
            "'startingOffsetsByTimestamp'.*not negative",
        ),
        ({"topic": "t", "endingTimestamp": "5"}, True, "'endingTimestamp': applies only to batch"),
        ({"topic": "t", "startingOffsetsByTimestampStrategy": "skip"}, False, "error, latest"),
        ({"topic": "t", "minOffsetsPerTrigger": "5"}, False, "only to streaming"),
        (
            {"topic": "t", "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
            True,
            "'minOffsetsPerTrigger': 50 is more than maxOffsetsPerTrigger 10",
        ),
        ({"topic": "t", "maxTriggerDelay": "soon"}, True, "'maxTriggerDelay'.*duration"),
        ({"topic": "t", "includeHeaders": "yes"}, False, "'includeHeaders'"),
        ({"topic": "t", "kafka.security.protocol": "SSL"}, False, "reads only kafka.bootstrap"),
        (
            {"topic": "t", "kafka.bootstrap.servers": "127.0.0.1:1"},
            False,
            "'endpoints': given twice",
        ),
    ],
)
def test_bad_options_name_the_option(given: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        options(streaming, **given)


def test_time_options_win_over_offsets_as_in_kafka() -> None:
    both = options(
        topic="t",
        startingOffsets="earliest",
        startingOffsetsByTimestamp='{"t": {"0": 7}}',
        startingTimestamp="5",
        endingOffsetsByTimestamp='{"t": {"0": 9}}',
    )
    assert both.starting == OffsetSpec("timestamp", timestamp_ms=5)  # type: ignore[attr-defined]
    assert both.starting_option == "startingTimestamp"  # type: ignore[attr-defined]
    assert both.ending == OffsetSpec("timestamps", {("t", 0): 9})  # type: ignore[attr-defined]
    assert both.starting_none_found == "error"  # type: ignore[attr-defined]


def test_trigger_sizes_and_delay() -> None:
    parsed = options(True, topic="t", minOffsetsPerTrigger="10", maxTriggerDelay="90s")
    assert parsed.min_offsets_per_trigger == 10  # type: ignore[attr-defined]
    assert parsed.max_trigger_delay_seconds == 90.0  # type: ignore[attr-defined]
    default = options(True, topic="t")
    assert default.max_trigger_delay_seconds == 15 * 60  # type: ignore[attr-defined]
    assert options(True, topic="t", maxTriggerDelay="250").max_trigger_delay_seconds == 0.25  # type: ignore[attr-defined]


def test_headers_column_only_when_asked() -> None:
    assert parse_include_headers({}) is False
    assert parse_include_headers({"INCLUDEHEADERS": "True"}) is True
    assert [field.name for field in SPARK_SCHEMA_WITHOUT_HEADERS.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert SPARK_SCHEMA.fields[-1].name == "headers"


def test_kafka_spellings_are_read_as_ours_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="quorumlog.spark"):
        parsed = parse_source_options(
            {
                "kafka.bootstrap.servers": "10.0.0.1:7001,10.0.0.2:7001",
                "kafka.max.poll.records": "77",
                "subscribe": "t",
            },
            streaming=False,
        )
        sink = parse_sink_options({"kafka.bootstrap.servers": "10.0.0.1:7001", "topic": "t"})
    assert parsed.connection.endpoints == ["10.0.0.1:7001", "10.0.0.2:7001"]
    assert parsed.fetch_records_max == 77
    assert sink.connection.endpoints == ["10.0.0.1:7001"]
    warned = [record.getMessage() for record in caplog.records]
    assert any("'kafka.bootstrap.servers': read as 'endpoints'" in line for line in warned)
    assert any("'kafka.max.poll.records': read as 'fetchRecordsMax'" in line for line in warned)
    with pytest.raises(OptionError, match=r"kafka\.max\.poll\.records"):
        parse_sink_options({"endpoints": ENDPOINTS, "kafka.max.poll.records": "5"})


# --- offsets for times --------------------------------------------------------------------


def timed_records(times_ms: list[int]) -> list[Record]:
    return [
        Record(value=b"%d" % number, timestamp_ms=time_ms)
        for number, time_ms in enumerate(times_ms)
    ]


def reference_offset(times_ms: list[int], begin: int, timestamp_ms: int) -> int | None:
    for offset in range(begin, len(times_ms)):
        if times_ms[offset] >= timestamp_ms:
            return offset
    return None


@pytest.mark.parametrize("seed", range(3))
def test_offset_for_time_matches_a_linear_scan(fake_cluster: FakeStreamCluster, seed: int) -> None:
    """Rising times with ties and gaps, batches of random sizes, a head cut by retention:
    the bisection finds what a record-by-record scan finds, for every time that matters."""
    randomness = random.Random(seed)
    topic = unique_topic("times")
    fake_cluster.create_topic(topic, partitions=1)
    times_ms: list[int] = []
    now_ms = 1_000_000
    for _ in range(400):
        now_ms += randomness.choice([0, 0, 1, 5, 100])
        times_ms.append(now_ms)
    records = timed_records(times_ms)
    position = 0
    connection = ConnectionOptions([fake_cluster.endpoints], timeout_seconds=10)
    while position < len(records):
        size = randomness.randint(1, 30)
        produce_records(fake_cluster.endpoints, topic, 0, records[position : position + size])
        position += size
    cut = randomness.randint(0, 100)
    fake_cluster.remove_before(topic, 0, cut)
    with ClusterAccess(connection) as access:
        begin = access.bounds((topic, 0)).begin
        probes = sorted({times_ms[0] - 1, times_ms[-1] + 1, *times_ms, *(t + 1 for t in times_ms)})
        for timestamp_ms in probes:
            found = access.run(offset_for_time(access.transport, topic, 0, timestamp_ms))
            assert found == reference_offset(times_ms, begin, timestamp_ms), timestamp_ms


def test_batch_offsets_by_time_resolve_per_partition(fake_cluster: FakeStreamCluster) -> None:
    topic = unique_topic("by-time")
    fake_cluster.create_topic(topic, partitions=2)
    for partition in range(2):
        times = [1_000 * (partition + 1) + 10 * offset for offset in range(50)]
        produce_records(fake_cluster.endpoints, topic, partition, timed_records(times), chunk=8)
    # Partition 0 holds times 1000..1490, partition 1 holds 2000..2490.
    given = {"endpoints": fake_cluster.endpoints, "topic": topic}
    connection = ConnectionOptions([fake_cluster.endpoints], timeout_seconds=10)
    with ClusterAccess(connection) as access:

        def resolve(**more: str) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
            return resolve_batch_offsets(access, parse_source_options({**given, **more}, False))

        starts, ends = resolve(startingTimestamp="1255", endingTimestamp="2100")
        assert starts == {(topic, 0): 26, (topic, 1): 0}
        assert ends == {(topic, 0): 50, (topic, 1): 10}  # no record of p0 that new: latest
        by_partition = json.dumps({topic: {"0": 1000, "1": 2490}})
        starts, _ = resolve(startingOffsetsByTimestamp=by_partition)
        assert starts == {(topic, 0): 0, (topic, 1): 49}
        with pytest.raises(OptionError, match=r"'startingTimestamp'.*/0 has no record at or after"):
            resolve(startingTimestamp="2000")
        starts, _ = resolve(startingTimestamp="2000", startingOffsetsByTimestampStrategy="latest")
        assert starts == {(topic, 0): 50, (topic, 1): 0}
        with pytest.raises(OptionError, match="must name every partition"):
            resolve(startingOffsetsByTimestamp=json.dumps({topic: {"0": 5}}))


def test_pattern_and_assign_select_partitions(fake_cluster: FakeStreamCluster) -> None:
    prefix = unique_topic("select")
    fake_cluster.create_topic(f"{prefix}-a", partitions=2)
    fake_cluster.create_topic(f"{prefix}-b", partitions=1)
    fake_cluster.create_topic(f"x{prefix}-c", partitions=1)
    connection = ConnectionOptions([fake_cluster.endpoints], timeout_seconds=10)
    given = {"endpoints": fake_cluster.endpoints}
    with ClusterAccess(connection) as access:
        pattern = parse_source_options({**given, "subscribePattern": f"{prefix}-.*"}, False)
        assert access.selected_partitions(pattern.selection) == [
            (f"{prefix}-a", 0),
            (f"{prefix}-a", 1),
            (f"{prefix}-b", 0),
        ]
        assign = parse_source_options({**given, "assign": json.dumps({f"{prefix}-a": [1]})}, False)
        assert access.selected_partitions(assign.selection) == [(f"{prefix}-a", 1)]
        missing = parse_source_options({**given, "assign": json.dumps({f"{prefix}-b": [3]})}, False)
        with pytest.raises(OptionError, match=r"'assign'.*no such partitions.*-b/3"):
            access.selected_partitions(missing.selection)


# --- the stream reader's planning -------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_seconds = 100.0

    def __call__(self) -> float:
        return self.now_seconds


def test_min_offsets_per_trigger_waits_for_records_or_the_delay(
    fake_cluster: FakeStreamCluster,
) -> None:
    topic = unique_topic("min-offsets")
    fake_cluster.create_topic(topic, partitions=2)
    produce_values(fake_cluster.endpoints, topic, 0, [b"a"] * 60)
    reader = QuorumLogStreamReader(
        parse_source_options(
            {
                "endpoints": fake_cluster.endpoints,
                "topic": topic,
                "startingOffsets": "earliest",
                "minOffsetsPerTrigger": "100",
                "maxOffsetsPerTrigger": "120",
                "maxTriggerDelay": "30s",
            },
            streaming=True,
        )
    )
    clock = reader.clock = FakeClock()
    try:
        assert reader.getDefaultReadLimit() == ReadMinRows(100)
        start = reader.initialOffset()
        limit = ReadMinRows(100)
        assert reader.latestOffset(start, limit) == start  # 60 < 100: wait
        assert reader.reportLatestOffset() == {topic: {"0": 60, "1": 0}}
        produce_values(fake_cluster.endpoints, topic, 1, [b"b"] * 90)
        # 150 now wait: a micro-batch, of at most maxOffsetsPerTrigger.
        end = reader.latestOffset(start, limit)
        assert sum(end[topic].values()) == 120
        assert reader.latestOffset(end, limit) == end  # 30 left: wait again
        clock.now_seconds += 29.0
        assert reader.latestOffset(end, limit) == end
        clock.now_seconds += 1.0  # maxTriggerDelay since the last micro-batch
        assert reader.latestOffset(end, limit) == {topic: {"0": 60, "1": 90}}
        # Spark's own limit wins: all available, whatever the options say.
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 60, "1": 90}}
        assert sum(reader.latestOffset(start, ReadMaxRows(7))[topic].values()) == 7
        # An availableNow query never waits.
        produce_values(fake_cluster.endpoints, topic, 1, [b"c"] * 5)
        reader.prepareForTriggerAvailableNow()
        done = {topic: {"0": 60, "1": 90}}
        assert reader.latestOffset(done, limit) == {topic: {"0": 60, "1": 95}}
    finally:
        reader.stop()


def test_stream_pattern_takes_new_topics_from_their_start_and_splits_by_min_partitions(
    fake_cluster: FakeStreamCluster,
) -> None:
    prefix = unique_topic("grow")
    fake_cluster.create_topic(f"{prefix}-1", partitions=1)
    produce_values(fake_cluster.endpoints, f"{prefix}-1", 0, [b"x"] * 10)
    reader = QuorumLogStreamReader(
        parse_source_options(
            {
                "endpoints": fake_cluster.endpoints,
                "subscribePattern": f"{prefix}-\\d+",
                "minPartitions": "4",
            },
            streaming=True,
        )
    )
    try:
        start = reader.initialOffset()
        assert start == {f"{prefix}-1": {"0": 10}}  # streams start at latest by default
        fake_cluster.create_topic(f"{prefix}-2", partitions=1)
        produce_values(fake_cluster.endpoints, f"{prefix}-2", 0, [b"y"] * 20)
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {f"{prefix}-1": {"0": 10}, f"{prefix}-2": {"0": 20}}
        ranges = reader.partitions(start, end)
        assert ranges == [
            OffsetRange(f"{prefix}-2", 0, 0, 5),
            OffsetRange(f"{prefix}-2", 0, 5, 10),
            OffsetRange(f"{prefix}-2", 0, 10, 15),
            OffsetRange(f"{prefix}-2", 0, 15, 20),
        ]
    finally:
        reader.stop()


def test_offset_for_time_reports_none_on_an_empty_partition(
    fake_cluster: FakeStreamCluster,
) -> None:
    topic = unique_topic("empty-times")
    fake_cluster.create_topic(topic, partitions=1)
    connection = ConnectionOptions([fake_cluster.endpoints], timeout_seconds=10)
    with ClusterAccess(connection) as access:
        access.list_topics()
        assert access.run(offset_for_time(access.transport, topic, 0, 0)) is None
    assert asyncio.iscoroutinefunction(offset_for_time)

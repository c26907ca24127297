"""The Spark side without Spark running: options, offsets, planning, rate limits, Arrow."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from quorumlog.codec.wire import Record, RecordBatch, encode_record_batch
from quorumlog.errors import UnavailableError
from quorumlog.spark.arrow import ARROW_SCHEMA, RecordColumns, decode_stored_batch
from quorumlog.spark.batch_source import OffsetRange, check_data_loss, plan_ranges
from quorumlog.spark.cluster import gather_bounded
from quorumlog.spark.errors import DataLossError, OptionError
from quorumlog.spark.offsets import (
    OffsetSpec,
    PartitionBounds,
    offsets_from_checkpoint,
    offsets_to_document,
    parse_offset_spec,
    resolve_spec,
)
from quorumlog.spark.options import parse_sink_options, parse_source_options, parse_table_options
from quorumlog.spark.stream_source import limit_offsets

ENDPOINTS = "127.0.0.1:7001,127.0.0.1:7002"


def source(streaming: bool = False, **options: str) -> object:
    return parse_source_options({"endpoints": ENDPOINTS, "topic": "t", **options}, streaming)


# --- options ------------------------------------------------------------------------------


def test_source_defaults_follow_kafka() -> None:
    batch = parse_source_options({"ENDPOINTS": ENDPOINTS, "Topic": "t"}, streaming=False)
    stream = parse_source_options({"endpoints": ENDPOINTS, "topic": "t"}, streaming=True)
    assert batch.starting == OffsetSpec("earliest") and stream.starting == OffsetSpec("latest")
    assert batch.ending == OffsetSpec("latest")
    assert batch.fail_on_data_loss is True
    assert batch.connection.endpoints == ENDPOINTS.split(",")


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"topic": ""}, False, "'topic'"),
        ({"topic": "a,b"}, False, "use 'subscribe'"),
        ({"subscribe": "a"}, False, "give only one of topic, subscribe"),
        ({"startingOffsets": "latest"}, False, "'startingOffsets': 'latest' is not allowed"),
        ({"endingOffsets": "latest"}, True, "'endingOffsets': applies only to batch"),
        ({"maxOffsetsPerTrigger": "0"}, True, "'maxOffsetsPerTrigger': must be at least 1"),
        ({"maxOffsetsPerTrigger": "many"}, True, "not an integer"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, False, "not read: other"),
        ({"endpoints": "nohost"}, False, "'endpoints'"),
        ({"minPartition": "3"}, False, "did you mean 'minPartitions'"),
    ],
)
def test_bad_source_options_name_the_option(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        source(streaming, **options)


def test_missing_endpoints_say_how_to_give_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUORUMLOG_ENDPOINTS", raising=False)
    with pytest.raises(OptionError, match="'endpoints': required"):
        parse_source_options({"topic": "t"}, streaming=False)
    monkeypatch.setenv("QUORUMLOG_ENDPOINTS", ENDPOINTS)
    assert parse_source_options({"topic": "t"}, False).connection.endpoints == ENDPOINTS.split(",")


def test_sink_and_table_options() -> None:
    assert parse_sink_options({"endpoints": ENDPOINTS, "checkpointLocation": "/x"}).topic is None
    table = parse_table_options({"endpoints": ENDPOINTS, "startKey": "a", "pageSize": "10"})
    assert (table.start_key, table.end_key, table.page_size) == ("a", None, 10)
    with pytest.raises(OptionError, match="'endKey'"):
        parse_table_options({"endpoints": ENDPOINTS, "startKey": "b", "endKey": "a"})


# --- offsets ------------------------------------------------------------------------------


def test_offset_json_round_trip_and_errors() -> None:
    spec = parse_offset_spec('{"t": {"0": 23, "1": -2}}', "startingOffsets")
    assert spec.specific == {("t", 0): 23, ("t", 1): -2}
    for bad, problem in [
        ("[1]", "non-empty JSON object"),
        ('{"t": {"0": "5"}}', "not an integer"),
        ('{"t": {"0": true}}', "not an integer"),
        ('{"t": {"-1": 5}}', "not a non-negative integer"),
        ('{"t": {"0": -3}}', "is negative"),
        ('{"t": []}', "non-empty object"),
    ]:
        with pytest.raises(OptionError, match=problem):
            parse_offset_spec(bad, "startingOffsets")
    with pytest.raises(OptionError, match="-1 \\(latest\\) is not allowed"):
        parse_offset_spec('{"t": {"0": -1}}', "startingOffsets", allow_latest=False)
    document = offsets_to_document({("t", 1): 5, ("t", 0): 3})
    assert json.dumps(document) == '{"t": {"0": 3, "1": 5}}'
    assert offsets_from_checkpoint(document) == {("t", 0): 3, ("t", 1): 5}


def test_resolve_spec_against_bounds() -> None:
    bounds = {("t", 0): PartitionBounds(10, 100), ("t", 1): PartitionBounds(0, 5)}
    assert resolve_spec(OffsetSpec("earliest"), bounds, "o") == {("t", 0): 10, ("t", 1): 0}
    assert resolve_spec(OffsetSpec("latest"), bounds, "o") == {("t", 0): 100, ("t", 1): 5}
    mixed = parse_offset_spec('{"t": {"0": 3, "1": -1}}', "o")
    assert resolve_spec(mixed, bounds, "o") == {("t", 0): 3, ("t", 1): 5}
    with pytest.raises(OptionError, match="missing: t/1"):
        resolve_spec(parse_offset_spec('{"t": {"0": 3}}', "o"), bounds, "o")
    with pytest.raises(OptionError, match="no such topic partitions: t/7"):
        resolve_spec(parse_offset_spec('{"t": {"0": 3, "1": 0, "7": 0}}', "o"), bounds, "o")
    with pytest.raises(OptionError, match="past the partition's end 5"):
        resolve_spec(parse_offset_spec('{"t": {"0": 3, "1": 6}}', "o"), bounds, "o")


def test_data_loss_fails_or_moves_to_begin() -> None:
    bounds = {("t", 0): PartitionBounds(10, 100)}
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        check_data_loss({("t", 0): 3}, bounds, fail_on_data_loss=True)
    assert check_data_loss({("t", 0): 3}, bounds, fail_on_data_loss=False) == {("t", 0): 10}


# --- planning -----------------------------------------------------------------------------


def test_plan_ranges_split_evenly_and_cover_exactly() -> None:
    starts = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    ends = {("t", 0): 10, ("t", 1): 350, ("t", 2): 7}
    ranges = plan_ranges(starts, ends, max_records_per_partition=100)
    assert ranges == [
        OffsetRange("t", 0, 0, 10),
        OffsetRange("t", 1, 100, 183),
        OffsetRange("t", 1, 183, 266),
        OffsetRange("t", 1, 266, 350),
    ]
    many = plan_ranges(starts, ends, max_records_per_partition=1000, min_partitions=13)
    assert len(many) >= 13
    covered = sorted((r.partition, offset) for r in many for offset in range(r.start, r.end))
    assert covered == [(0, o) for o in range(10)] + [(1, o) for o in range(100, 350)]


def test_limit_offsets_takes_exactly_the_limit_in_proportion() -> None:
    starts = {("t", 0): 0, ("t", 1): 50, ("t", 2): 10}
    latest = {("t", 0): 900, ("t", 1): 150, ("t", 2): 10}
    limited = limit_offsets(starts, latest, 100)
    taken = {key: limited[key] - starts[key] for key in starts}
    assert sum(taken.values()) == 100
    assert taken == {("t", 0): 90, ("t", 1): 10, ("t", 2): 0}
    assert limit_offsets(starts, latest, 10_000) == latest
    assert sum(limit_offsets(starts, latest, 1).values()) == sum(starts.values()) + 1


# --- Arrow --------------------------------------------------------------------------------


def gathered(
    columns: RecordColumns, base_offset: int, batch: RecordBatch, start: int, end: int
) -> int:
    """Add `batch` the way a reader does: from its stored bytes."""
    data = encode_record_batch(batch)
    return columns.add_batch(base_offset, decode_stored_batch(data), start, end, len(data))


def test_record_columns_take_exactly_the_range_with_times_and_headers() -> None:
    batch = RecordBatch(
        producer_id="p",
        base_sequence=0,
        timestamp_ms=1_700_000_000_000,
        records=[
            Record(value=b"v0"),
            Record(value=b"v1", key=b"k1", timestamp_ms=1_600_000_000_000),
            Record(value=b"v2", headers=[("h", b"x")]),
            Record(value=b"v3"),
        ],
    )
    columns = RecordColumns("t", 4)
    assert gathered(columns, 100, batch, start=101, end=103) == 2
    assert gathered(columns, 104, batch, start=101, end=103) == 0
    arrow_batch = columns.take()
    assert arrow_batch.schema.equals(ARROW_SCHEMA)
    rows = arrow_batch.to_pylist()
    assert [row["offset"] for row in rows] == [101, 102]
    assert [row["key"] for row in rows] == [b"k1", None]
    assert [row["timestampType"] for row in rows] == [0, 1]
    assert rows[0]["timestamp"].timestamp() == 1_600_000_000
    assert rows[1]["headers"] == [{"key": "h", "value": b"x"}]
    assert rows[0]["headers"] is None
    assert {row["topic"] for row in rows} == {"t"} and {row["partition"] for row in rows} == {4}
    assert len(columns) == 0
    assert isinstance(arrow_batch, pa.RecordBatch)
    assert columns.take().num_rows == 0  # nothing gathered: an empty batch of the schema


def random_batch(chooser: random.Random, size: int) -> RecordBatch:
    """Records of every shape a producer can send: keys absent, empty or set; own times
    or none; headers or none; values of any length, the empty one included."""
    shapes = chooser.choice(["plain", "keys", "mixed"])
    records = []
    for _ in range(size):
        mixed = shapes == "mixed"
        key = chooser.choice([None, b"", b"key"]) if mixed else (b"k" if shapes == "keys" else None)
        records.append(
            Record(
                value=chooser.randbytes(chooser.choice([0, 1, 100])),
                key=key,
                timestamp_ms=chooser.choice([0, 1_600_000_000_123]) if mixed else 0,
                headers=[("h", b"v"), ("", b"")] if mixed and chooser.random() < 0.3 else [],
            )
        )
    return RecordBatch("p", 0, chooser.randrange(1, 2**41), records)


def expected_rows(
    base_offset: int, batch: RecordBatch, start: int, end: int
) -> list[dict[str, object]]:
    """The Kafka-shaped rows of one entry, record by record (the reference)."""
    rows: list[dict[str, object]] = []
    for position, record in enumerate(batch.records):
        offset = base_offset + position
        if not start <= offset < end:
            continue
        own_time = record.timestamp_ms != 0
        milliseconds = record.timestamp_ms if own_time else batch.timestamp_ms
        rows.append(
            {
                "key": record.key,
                "value": record.value,
                "topic": "t",
                "partition": 2,
                "offset": offset,
                "timestamp": datetime.fromtimestamp(milliseconds / 1000, UTC),
                "timestampType": 0 if own_time else 1,
                "headers": [{"key": key, "value": value} for key, value in record.headers] or None,
            }
        )
    return rows


@pytest.mark.parametrize("seed", range(20))
def test_record_columns_match_a_record_by_record_reference(seed: int) -> None:
    chooser = random.Random(seed)
    columns = RecordColumns("t", 2)
    expected: list[dict[str, object]] = []
    base_offset = chooser.randrange(0, 1000)
    start = base_offset + chooser.randrange(0, 5)
    end = start + chooser.randrange(0, 400)
    while base_offset < end + 3:
        batch = random_batch(chooser, chooser.randrange(1, 60))
        added = gathered(columns, base_offset, batch, start, end)
        rows = expected_rows(base_offset, batch, start, end)
        assert added == len(rows)
        expected += rows
        base_offset += len(batch.records) + chooser.choice([0, 0, 0, 3])  # retention gaps too
    assert len(columns) == len(expected)
    arrow_batch = columns.take()
    assert arrow_batch.schema.equals(ARROW_SCHEMA)
    assert arrow_batch.to_pylist() == expected


# --- planning many partitions -------------------------------------------------------------


def test_gather_bounded_keeps_order_bounds_concurrency_and_raises_the_typed_error() -> None:
    running = 0
    most_running = 0

    async def status(number: int) -> int:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        await asyncio.sleep(0)  # let the others start: the bound is what stops them
        running -= 1
        if number == 13:
            raise UnavailableError("partition 13 has no leader")
        return number * 10

    assert asyncio.run(gather_bounded([status(n) for n in range(12)], 5)) == [
        n * 10 for n in range(12)
    ]
    assert most_running == 5
    with pytest.raises(UnavailableError, match="partition 13"):
        asyncio.run(gather_bounded([status(n) for n in range(20)], 4))

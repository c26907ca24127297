"""The job's transformation on tiny frames, and its streaming query on a file stream.

Plain Spark, no cluster: the `quorumlog` source and sink are tested in tests/spark; here
the records come from a list or from text files (one JSON value a line), which is all
the transformation sees of the topic anyway (a `value` column).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, StructField, StructType

from quorumlog.demo.flights import Flight, encode_flights
from quorumlog.demo.pipeline import (
    FlightStats,
    GroupTotals,
    ResultTable,
    aggregate_flights,
    airlines_frame,
    dry_run,
    name_carriers,
    parse_flights,
    start_flight_stats_query,
)

# Warnings Spark and py4j raise that are theirs, not ours: py4j leaves sockets to the
# garbage collector, pyspark 4 warns about pandas 3, and both use deprecated APIs.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:py4j.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark.*"),
]

AIRLINES = {"UA": "United Air Lines Inc.", "B6": "JetBlue Airways"}
FILE_TIME_SECONDS = 1_700_000_000
UA_JANUARY_DELAYS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def flights() -> list[Flight]:
    """UA in January: delays 1..10 and one cancelled; B6 in January: one flight; an
    unknown carrier ZZ in March: one cancelled flight."""
    rows = [(1, "UA", delay) for delay in UA_JANUARY_DELAYS]
    rows += [(1, "UA", None), (1, "B6", -4), (3, "ZZ", None)]
    return [
        Flight(id=number, month=month, carrier=carrier, dep_delay=delay)
        for number, (month, carrier, delay) in enumerate(rows)
    ]


def value_frame(spark: SparkSession, values: list[bytes]) -> DataFrame:
    schema = StructType([StructField("value", BinaryType())])
    return spark.createDataFrame([(value,) for value in values], schema)


def stats_by_key(spark: SparkSession) -> dict[str, FlightStats]:
    values = [value for _, value in encode_flights(flights())]
    stats = aggregate_flights(parse_flights(value_frame(spark, values)))
    table = ResultTable()
    table.update(name_carriers(stats, airlines_frame(spark, AIRLINES)).collect())
    return {stats.key: stats for stats in table.rows()}


def test_parse_reads_the_json_fields(spark: SparkSession) -> None:
    values = [value for _, value in encode_flights(flights()[-3:])]
    rows = parse_flights(value_frame(spark, values)).collect()
    assert [row.asDict() for row in rows] == [
        {"id": 10, "month": 1, "carrier": "UA", "dep_delay": None},
        {"id": 11, "month": 1, "carrier": "B6", "dep_delay": -4},
        {"id": 12, "month": 3, "carrier": "ZZ", "dep_delay": None},
    ]


def test_aggregate_per_carrier_and_month(spark: SparkSession) -> None:
    assert stats_by_key(spark) == {
        # 11 flights, 1 cancelled; mean of 1..10 = 5.5; p90 of 1..10 = 9 (the smallest
        # delay with at least 90% of the flights at or below it).
        "UA/01": FlightStats("UA", "United Air Lines Inc.", 1, 11, 1, 5.5, 9),
        "B6/01": FlightStats("B6", "JetBlue Airways", 1, 1, 0, -4.0, -4),
        # Unknown carrier: keeps its code as its name; all cancelled: no delay figures.
        "ZZ/03": FlightStats("ZZ", "ZZ", 3, 1, 1, None, None),
    }


def test_aggregate_carries_the_id_checksums(spark: SparkSession) -> None:
    values = [value for _, value in encode_flights(flights())]
    stats = aggregate_flights(parse_flights(value_frame(spark, values)))
    table = ResultTable()
    table.update(name_carriers(stats, airlines_frame(spark, AIRLINES)).collect())
    assert table.total() == GroupTotals.expected(len(flights()))
    assert table.records_counted() == len(flights())


def test_dry_run_counts_groups(spark: SparkSession) -> None:
    values = [value for _, value in encode_flights(flights())]
    assert dry_run(spark, values, airlines_frame(spark, AIRLINES)) == 3


def test_streaming_query_counts_each_record_once_across_micro_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Three files, one micro-batch each: UA January grows in every batch, and each batch
    # hands over only the groups it changed; the newest row of each group is its total.
    records = encode_flights(flights())
    input_directory = tmp_path / "input"
    input_directory.mkdir()
    for number, start in enumerate(range(0, len(records), 5)):
        lines = b"\n".join(value for _, value in records[start : start + 5])
        path = input_directory / f"part-{number}.json"
        path.write_bytes(lines + b"\n")
        # The file source takes files oldest first: make the order the numbering.
        os.utime(path, (FILE_TIME_SECONDS + number, FILE_TIME_SECONDS + number))
    stream = spark.readStream.option("maxFilesPerTrigger", 1).text(str(input_directory))
    table = ResultTable()
    published: list[list[str]] = []
    query = start_flight_stats_query(
        stream,
        airlines_frame(spark, AIRLINES),
        table,
        lambda changed: published.append(sorted(stats.key for stats in changed)),
        str(tmp_path / "checkpoint"),
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert published == [["UA/01"], ["UA/01"], ["B6/01", "UA/01", "ZZ/03"]]
    assert table.batches == 3
    assert table.total() == GroupTotals.expected(len(records))
    assert {stats.key: stats for stats in table.rows()} == stats_by_key(spark)

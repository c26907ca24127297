"""A task's fetch window (`spark/range_fetches.py`) and `read_range` over it, without Spark
and without sockets: fetches are answered at once by a `FakePartition`, and the test sees
each fetch started and each answer taken, in order."""

from __future__ import annotations

from concurrent.futures import Future

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from quorumlog.codec import wire
from quorumlog.spark.batch_source import FetchSettings, OffsetRange, read_range
from quorumlog.spark.errors import DataLossError
from quorumlog.spark.options import parse_source_options
from quorumlog.spark.range_fetches import FETCHES_IN_FLIGHT_MAX, RangeFetches
from quorumlog.stream.client_common import OffsetOutOfRangeError
from tests.spark.fake_stream_cluster import FakePartition

TOPIC = "window"


class AnsweredFuture(Future[wire.FetchResult]):
    """A fetch answered already; taking its result is logged."""

    def __init__(self, log: list[str], offset: int) -> None:
        super().__init__()
        self.log = log
        self.offset = offset

    def result(self, timeout: float | None = None) -> wire.FetchResult:
        self.log.append(f"take {self.offset}")
        return super().result(timeout)


class InstantAccess:
    """Stands in for ClusterAccess: `fetch_soon` answers from one FakePartition."""

    def __init__(self, partition: FakePartition) -> None:
        self.partition = partition
        self.log: list[str] = []
        self.requests_max: list[int] = []

    def fetch_soon(
        self, topic_partition: tuple[str, int], offset: int, records_max: int, bytes_max: int
    ) -> Future[wire.FetchResult]:
        self.log.append(f"fetch {offset}")
        self.requests_max.append(records_max)
        future = AnsweredFuture(self.log, offset)
        answer = self.partition.fetch(wire.Fetch(0, TOPIC, 0, offset, records_max, bytes_max))
        if isinstance(answer, wire.FetchResult):
            future.set_result(answer)
        else:
            part = self.partition
            future.set_exception(OffsetOutOfRangeError(TOPIC, 0, offset, part.begin, part.end))
        return future


def filled_partition(records: int, entry_records: int) -> FakePartition:
    """`records` records of values b"v<offset>", `entry_records` to a log entry."""
    partition = FakePartition()
    for start in range(0, records, entry_records):
        count = min(entry_records, records - start)
        partition.append(
            wire.Produce(
                request_id=0,
                topic=TOPIC,
                partition=0,
                producer_id="p",
                base_sequence=start,
                records=[
                    wire.Record(value=b"v%d" % number) for number in range(start, start + count)
                ],
            )
        )
    return partition


def settings_of(**given: str) -> FetchSettings:
    return FetchSettings(
        parse_source_options({"endpoints": "127.0.0.1:1", "topic": TOPIC, **given}, False)
    )


def read_rows(
    access: InstantAccess, start: int, end: int, settings: FetchSettings
) -> list[tuple[int, bytes]]:
    batches = list(read_range(access, OffsetRange(TOPIC, 0, start, end), settings))  # type: ignore[arg-type]
    table = pa.Table.from_batches(batches)
    return list(zip(table["offset"].to_pylist(), table["value"].to_pylist(), strict=True))


def test_two_fetches_are_in_flight_before_the_first_answer_is_taken() -> None:
    access = InstantAccess(filled_partition(1_000, 50))
    rows = read_rows(access, 0, 1_000, settings_of(fetchRecordsMax="100"))
    assert [offset for offset, _ in rows] == list(range(1_000))
    assert access.log[:3] == ["fetch 0", "fetch 100", "take 0"]
    # Never more than the window: each answer taken makes room for one more fetch.
    outstanding = 0
    for event in access.log:
        outstanding += 1 if event.startswith("fetch") else -1
        assert 0 <= outstanding <= FETCHES_IN_FLIGHT_MAX


@pytest.mark.parametrize(
    ("start", "end", "entry_records", "fetch_records", "fetch_bytes"),
    [
        (0, 1_000, 37, 100, 4 << 20),  # entries across chunk boundaries
        (13, 977, 37, 100, 1024),  # short answers (bytes): each chunk's rest fetched next
        (500, 501, 37, 100, 1024),  # one record in the middle of an entry
        (0, 1_000, 1_000, 7, 4 << 20),  # one entry, fetched again for every chunk
        (250, 750, 1, 64, 1024),  # one record per entry
    ],
)
def test_read_range_returns_exactly_the_range_in_order(
    start: int, end: int, entry_records: int, fetch_records: int, fetch_bytes: int
) -> None:
    access = InstantAccess(filled_partition(1_000, entry_records))
    settings = settings_of(fetchRecordsMax=str(fetch_records), fetchBytesMax=str(fetch_bytes))
    rows = read_rows(access, start, end, settings)
    assert rows == [(offset, b"v%d" % offset) for offset in range(start, end)]
    assert max(access.requests_max) <= fetch_records


def test_offsets_lost_to_retention_restart_the_window_from_the_begin() -> None:
    partition = filled_partition(1_000, 50)
    partition.remove_before(300)
    access = InstantAccess(partition)
    rows = read_rows(access, 100, 900, settings_of(fetchRecordsMax="100", failOnDataLoss="false"))
    assert rows == [(offset, b"v%d" % offset) for offset in range(300, 900)]
    with pytest.raises(DataLossError):
        read_rows(InstantAccess(partition), 100, 900, settings_of(fetchRecordsMax="100"))


def test_the_window_asks_for_a_chunks_rest_before_later_chunks() -> None:
    started: list[tuple[int, int]] = []
    answers: dict[int, Future[wire.FetchResult]] = {}

    def start_fetch(offset: int, records_max: int) -> Future[wire.FetchResult]:
        started.append((offset, records_max))
        answers[offset] = Future()
        answers[offset].set_result(wire.FetchResult(0, 0, 1_000, []))
        return answers[offset]

    fetches = RangeFetches(0, 250, 100, start_fetch)
    assert fetches.next_answer()[:2] == (0, 100)
    fetches.ask_again(40, 100)
    assert fetches.next_answer()[:2] == (40, 100)
    assert fetches.next_answer()[:2] == (100, 200)
    assert fetches.next_answer()[:2] == (200, 250)
    # The window was topped up when chunk 0 was taken; its rest came after, and first.
    assert started == [(0, 100), (100, 100), (200, 50), (40, 60)]
    fetches.restart_at(10)
    assert fetches.next_answer()[:2] == (10, 110)


def test_cancel_leaves_no_fetch_in_flight() -> None:
    pending: list[Future[wire.FetchResult]] = []

    def start_fetch(offset: int, records_max: int) -> Future[wire.FetchResult]:
        pending.append(Future())
        return pending[-1]

    fetches = RangeFetches(0, 1_000, 100, start_fetch)
    fetches.fill()
    assert len(pending) == FETCHES_IN_FLIGHT_MAX
    fetches.cancel()
    assert all(future.cancelled() for future in pending)

"""The access a Python worker keeps for its next task (`spark/shared_access.py`), without
Spark and without sockets: `ClusterAccess` is replaced by a stand-in that records what was
opened and closed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from quorumlog.spark import batch_source, shared_access
from quorumlog.spark.batch_source import FetchSettings, OffsetRange, QuorumLogBatchReader
from quorumlog.spark.options import ConnectionOptions, parse_source_options
from quorumlog.spark.shared_access import borrowed_access, close_idle_access

FIRST = ConnectionOptions(endpoints=["127.0.0.1:1"], cluster_id="one")
SECOND = ConnectionOptions(endpoints=["127.0.0.1:2"], cluster_id="two")


class StandInAccess:
    numbers = itertools.count(1)

    def __init__(self, connection: ConnectionOptions, client_name: str) -> None:
        self.connection = connection
        self.client_name = client_name
        self.number = next(self.numbers)
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> StandInAccess:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@pytest.fixture(autouse=True)
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    close_idle_access()
    monkeypatch.setattr(shared_access, "ClusterAccess", StandInAccess)
    yield
    close_idle_access()


def test_the_next_task_of_the_process_reuses_the_access_of_the_last() -> None:
    with borrowed_access(FIRST, "spark-read") as first:
        pass
    with borrowed_access(FIRST, "spark-read") as second:
        pass
    assert second is first
    assert not first.closed


def test_an_access_left_by_an_error_is_closed_and_not_reused() -> None:
    with pytest.raises(RuntimeError), borrowed_access(FIRST, "spark-read") as failed:
        raise RuntimeError("the task failed")
    assert failed.closed
    with borrowed_access(FIRST, "spark-read") as fresh:
        pass
    assert fresh is not failed


def test_a_reader_stopped_early_closes_its_access() -> None:
    def reader() -> Iterator[int]:
        with borrowed_access(FIRST, "spark-read"):
            yield 1
            yield 2

    batches = reader()
    assert next(batches) == 1
    batches.close()  # Spark stops reading (a limit): GeneratorExit inside the block
    assert shared_access.idle is None


def test_other_options_get_their_own_access_and_the_idle_one_is_closed() -> None:
    with borrowed_access(FIRST, "spark-read") as first:
        pass
    with borrowed_access(SECOND, "spark-read") as second:
        pass
    assert second is not first
    assert first.closed
    assert second.connection == SECOND
    with borrowed_access(SECOND, "spark-plan") as planner:
        pass
    assert planner is not second  # the client name is part of what the access is for


def test_two_readers_at_once_never_share_an_access() -> None:
    with borrowed_access(FIRST, "spark-read") as one, borrowed_access(FIRST, "spark-read") as two:
        assert one is not two
    # Both were given back: one is kept, the other closed.
    assert [one.closed, two.closed].count(True) == 1


def test_a_forked_child_opens_its_own_access(monkeypatch: pytest.MonkeyPatch) -> None:
    with borrowed_access(FIRST, "spark-read") as parents:
        pass
    monkeypatch.setattr(shared_access.os, "getpid", lambda: -1)
    with borrowed_access(FIRST, "spark-read") as childs:
        pass
    assert childs is not parents
    assert not parents.closed  # the parent's: not the child's to close


def test_the_tasks_of_one_worker_read_through_one_access(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two tasks in one Python worker (Spark reuses it): one access opened, not two."""
    opened: list[object] = []

    def read_range(access: object, offset_range: OffsetRange, _: FetchSettings) -> Iterator[int]:
        opened.append(access)
        yield offset_range.end

    monkeypatch.setattr(batch_source, "ClusterAccess", StandInAccess)  # a reader's own
    monkeypatch.setattr(batch_source, "read_range", read_range)
    options = parse_source_options({"endpoints": "127.0.0.1:1", "topic": "t"}, False)
    reader = object.__new__(QuorumLogBatchReader)  # no planning: no cluster to ask
    reader.settings = FetchSettings(options)
    assert list(reader.read(OffsetRange("t", 0, 0, 5))) == [5]
    assert list(reader.read(OffsetRange("t", 1, 0, 7))) == [7]
    assert len(opened) == 2
    assert opened[0] is opened[1]

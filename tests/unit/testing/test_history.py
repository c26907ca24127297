"""The history recorder: ids, statuses, times, misuse, and sharing between threads."""

from __future__ import annotations

import math
import threading

import msgspec
import pytest

from quorumlog.errors import QuorumLogError
from quorumlog.testing.history import (
    History,
    HistoryError,
    Operation,
    OperationStatus,
    check_operation,
)


def test_a_completed_operation_keeps_what_was_asked_and_answered() -> None:
    history = History()
    operation_id = history.invoke("client-1", "cas", "x", ("a", "b"), 10)
    history.complete(operation_id, True, 15)

    [operation] = history.operations()
    assert operation == Operation(
        operation_id=operation_id,
        client_id="client-1",
        kind="cas",
        key="x",
        argument=("a", "b"),
        output=True,
        call_time=10,
        return_time=15,
        status=OperationStatus.OK,
    )


def test_operation_ids_are_unique_and_operations_come_back_in_id_order() -> None:
    history = History()
    first = history.invoke(1, "put", "x", "a", 0)
    second = history.invoke(2, "get", "x", None, 1)
    history.complete(second, None, 2)
    history.complete(first, None, 3)

    assert first != second
    assert [operation.operation_id for operation in history.operations()] == [first, second]
    assert len(history) == 2


def test_a_failed_operation_has_its_return_time_and_no_output() -> None:
    history = History()
    operation_id = history.invoke(1, "put", "x", "a", 5)
    history.fail(operation_id, 7)

    [operation] = history.operations()
    assert operation.status is OperationStatus.FAILED
    assert operation.return_time == 7
    assert operation.output is None


def test_an_unknown_outcome_returns_at_infinity() -> None:
    history = History()
    operation_id = history.invoke(1, "put", "x", "a", 5)
    history.unknown(operation_id)

    [operation] = history.operations()
    assert operation.status is OperationStatus.UNKNOWN
    assert operation.return_time == math.inf
    assert history.in_flight_count == 0


def test_operations_still_in_flight_are_reported_as_unknown() -> None:
    history = History()
    operation_id = history.invoke(1, "put", "x", "a", 5)

    [operation] = history.operations()
    assert operation.status is OperationStatus.UNKNOWN
    assert history.in_flight_count == 1
    # Reading the history does not end the operation: it can still complete.
    history.complete(operation_id, None, 9)
    assert history.operations()[0].status is OperationStatus.OK


def test_a_client_goes_on_after_an_unknown_outcome() -> None:
    history = History()
    history.unknown(history.invoke(1, "put", "x", "a", 0))
    history.complete(history.invoke(1, "get", "x", None, 1), "a", 2)

    statuses = [operation.status for operation in history.operations()]
    assert statuses == [OperationStatus.UNKNOWN, OperationStatus.OK]


def test_a_client_cannot_have_two_operations_in_flight() -> None:
    history = History()
    history.invoke(1, "put", "x", "a", 0)
    with pytest.raises(HistoryError, match="still in flight"):
        history.invoke(1, "get", "x", None, 1)


def test_an_operation_ends_only_once() -> None:
    history = History()
    operation_id = history.invoke(1, "put", "x", "a", 0)
    history.complete(operation_id, None, 1)
    with pytest.raises(HistoryError, match="already ended"):
        history.fail(operation_id, 2)
    with pytest.raises(HistoryError, match="already ended"):
        history.unknown(operation_id)


def test_an_operation_never_invoked_cannot_end() -> None:
    with pytest.raises(HistoryError, match="never invoked"):
        History().complete(42, None, 1)


def test_a_return_before_the_call_is_refused_and_changes_nothing() -> None:
    history = History()
    operation_id = history.invoke(1, "put", "x", "a", 10)
    with pytest.raises(HistoryError, match="before its call"):
        history.complete(operation_id, None, 9)
    history.complete(operation_id, None, 10)
    assert history.operations()[0].status is OperationStatus.OK


@pytest.mark.parametrize("time", [math.nan, math.inf, -math.inf])
def test_times_must_be_finite(time: float) -> None:
    history = History()
    with pytest.raises(HistoryError, match="finite"):
        history.invoke(1, "put", "x", "a", time)
    operation_id = history.invoke(1, "put", "x", "a", 0)
    with pytest.raises(HistoryError, match="finite"):
        history.complete(operation_id, None, time)


def test_history_errors_are_quorumlog_errors_and_value_errors() -> None:
    assert issubclass(HistoryError, QuorumLogError)
    assert issubclass(HistoryError, ValueError)


def test_operations_are_immutable() -> None:
    history = History()
    history.complete(history.invoke(1, "put", "x", "a", 0), None, 1)
    [operation] = history.operations()
    with pytest.raises(AttributeError):
        operation.output = "b"  # type: ignore[misc]


def test_operations_encode_to_json() -> None:
    history = History()
    history.complete(history.invoke(1, "get", "x", None, 0), "a", 1)
    encoded = msgspec.json.decode(msgspec.json.encode(history.operations()))
    assert encoded[0]["status"] == "ok"
    assert encoded[0]["output"] == "a"


@pytest.mark.parametrize(
    ("status", "return_time", "message"),
    [
        (OperationStatus.UNKNOWN, 5.0, "must have return time"),
        (OperationStatus.OK, math.inf, "finite return time"),
        (OperationStatus.FAILED, math.inf, "finite return time"),
        (OperationStatus.OK, 1.0, "before its call"),
        (OperationStatus.OK, math.nan, "NaN"),
    ],
)
def test_check_operation_refuses_times_that_disagree_with_the_status(
    status: OperationStatus, return_time: float, message: str
) -> None:
    operation = Operation(0, 1, "put", "x", "a", None, 2, return_time, status)
    with pytest.raises(HistoryError, match=message):
        check_operation(operation)


def test_client_threads_share_one_history() -> None:
    history = History()
    clients_count = 8
    operations_per_client = 200
    start = threading.Barrier(clients_count)

    def client(client_id: int) -> None:
        start.wait()
        for step in range(operations_per_client):
            operation_id = history.invoke(client_id, "put", "x", step, step * 2)
            if step % 3 == 0:
                history.unknown(operation_id)
            else:
                history.complete(operation_id, None, step * 2 + 1)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    operations = history.operations()
    assert len(operations) == clients_count * operations_per_client
    assert len({operation.operation_id for operation in operations}) == len(operations)
    assert history.in_flight_count == 0
    for client_id in range(clients_count):
        arguments = [item.argument for item in operations if item.client_id == client_id]
        assert arguments == list(range(operations_per_client))

"""RecordFuture: a concurrent.futures.Future without its own lock or lists (made on first
use), still usable with everything that takes standard futures."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from concurrent.futures import Future

import pytest

from quorumlog.codec.wire import Record as WireRecord
from quorumlog.stream.record_futures import RecordFuture, resolve_all, resolve_batch
from quorumlog.stream.records import RecordMetadata

WAIT_SECONDS = 10.0


def metadata(offset: int) -> RecordMetadata:
    return RecordMetadata("events", 0, offset, 1000 + offset)


def test_a_pending_future_holds_no_lists_and_one_tracked_object() -> None:
    future = RecordFuture(threading.Condition())
    assert future.waiter_list is None
    assert future.callback_list is None
    assert not future.done()
    assert not [referent for referent in gc.get_referents(future) if type(referent) is list]


def test_a_callback_added_before_and_one_added_after_completion_each_run_once() -> None:
    future = RecordFuture(threading.Condition())
    calls: list[tuple[str, int]] = []

    def record_call(name: str) -> object:
        def called(done: Future[RecordMetadata]) -> None:
            calls.append((name, done.result(0).offset))

        return called

    future.add_done_callback(record_call("before"))
    assert future.callback_list is not None
    resolve_all(future._condition, [future], [metadata(7)])
    future.add_done_callback(record_call("after"))
    resolve_all(future._condition, [future], [metadata(8)])  # already done: ignored
    assert calls == [("before", 7), ("after", 7)]


def test_resolve_all_keeps_the_outcome_of_a_failed_future() -> None:
    condition = threading.Condition()
    failed, pending = RecordFuture(condition), RecordFuture(condition)
    failed.set_exception(TimeoutError("expired"))
    resolve_all(condition, [failed, pending], [metadata(0), metadata(1)])
    assert isinstance(failed.exception(0), TimeoutError)
    assert pending.result(0) == metadata(1)


def test_a_waiter_on_another_thread_wakes() -> None:
    condition = threading.Condition()
    future, other = RecordFuture(condition), RecordFuture(condition)
    results: list[RecordMetadata] = []
    waiting = threading.Event()

    def wait_for_result() -> None:
        waiting.set()
        results.append(future.result(timeout=WAIT_SECONDS))

    waiter = threading.Thread(target=wait_for_result)
    waiter.start()
    assert waiting.wait(WAIT_SECONDS)
    resolve_all(condition, [other], [metadata(1)])  # wakes the waiter for another future
    resolve_all(condition, [future], [metadata(2)])
    waiter.join(WAIT_SECONDS)
    assert not waiter.is_alive()
    assert results == [metadata(2)]


def test_result_times_out_while_pending() -> None:
    future = RecordFuture(threading.Condition())
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)


def test_wait_and_as_completed_see_futures_resolved_on_another_thread() -> None:
    condition = threading.Condition()
    futures = [RecordFuture(condition) for _ in range(3)]
    first, rest = futures[:1], futures[1:]
    resolver = threading.Thread(
        target=resolve_all, args=(condition, first, [metadata(0)]), daemon=True
    )
    resolver.start()
    done, not_done = concurrent.futures.wait(
        futures, timeout=WAIT_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED
    )
    resolver.join(WAIT_SECONDS)
    assert done == set(first)
    assert not_done == set(rest)
    assert not any(future.waiter_list for future in futures)  # wait removed its waiters
    resolver = threading.Thread(
        target=resolve_all, args=(condition, rest, [metadata(1), metadata(2)]), daemon=True
    )
    resolver.start()
    completed = list(concurrent.futures.as_completed(futures, timeout=WAIT_SECONDS))
    resolver.join(WAIT_SECONDS)
    assert sorted(future.result(0).offset for future in completed) == [0, 1, 2]


def test_a_failure_reaches_waiters_and_callbacks() -> None:
    condition = threading.Condition()
    future = RecordFuture(condition)
    seen: list[BaseException | None] = []
    future.add_done_callback(lambda done: seen.append(done.exception(0)))
    failer = threading.Thread(target=future.set_exception, args=(ValueError("refused"),))
    failer.start()
    done, _ = concurrent.futures.wait([future], timeout=WAIT_SECONDS)
    failer.join(WAIT_SECONDS)
    assert done == {future}
    assert isinstance(future.exception(0), ValueError)
    assert len(seen) == 1 and isinstance(seen[0], ValueError)


@pytest.mark.parametrize("outcome", ["result", "failure", "cancelled"])
def test_a_settled_future_answers_as_a_standard_future_does(outcome: str) -> None:
    ours = RecordFuture(threading.Condition())
    standard: Future[RecordMetadata] = Future()
    for future in (ours, standard):
        if outcome == "result":
            future.set_result(metadata(3))
        elif outcome == "failure":
            future.set_exception(ValueError("refused"))
        else:
            assert future.cancel()

    def answers(future: Future[RecordMetadata]) -> tuple[object, ...]:
        try:
            result: object = future.result(timeout=0)
        except BaseException as error:  # the type is the answer here
            result = type(error)
        try:
            exception: object = future.exception(timeout=0)
        except BaseException as error:
            exception = type(error)
        exception = type(exception) if isinstance(exception, BaseException) else exception
        return future.done(), future.cancelled(), future.running(), result, exception

    assert answers(ours) == answers(standard)


def test_a_settled_future_answers_while_another_thread_holds_the_shared_condition() -> None:
    # The I/O thread holds the producer's condition while it resolves a batch; a caller
    # checking futures already settled must not queue behind it (nor pay for the lock).
    condition = threading.Condition()
    finished, failed = RecordFuture(condition), RecordFuture(condition)
    resolve_all(condition, [finished], [metadata(4)])
    failed.set_exception(ValueError("refused"))
    held, release, answered = threading.Event(), threading.Event(), threading.Event()
    answers: list[object] = []

    def hold() -> None:
        with condition:
            held.set()
            release.wait(WAIT_SECONDS)

    def ask() -> None:
        answers.extend([finished.done(), finished.result(), failed.done()])
        answers.append(type(failed.exception()))
        answered.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(WAIT_SECONDS)
        asker = threading.Thread(target=ask)
        asker.start()
        assert answered.wait(WAIT_SECONDS / 2)
    finally:
        release.set()
        holder.join(WAIT_SECONDS)
    asker.join(WAIT_SECONDS)
    assert answers == [True, metadata(4), True, ValueError]


def test_asyncio_can_await_a_record_future_settled_on_another_thread() -> None:
    condition = threading.Condition()
    future = RecordFuture(condition)

    async def await_it() -> RecordMetadata:
        wrapped = asyncio.wrap_future(future)  # registers a callback while pending
        resolver = threading.Thread(target=resolve_all, args=(condition, [future], [metadata(9)]))
        resolver.start()
        try:
            return await asyncio.wait_for(wrapped, WAIT_SECONDS)
        finally:
            resolver.join(WAIT_SECONDS)

    assert asyncio.run(await_it()) == metadata(9)


def test_resolve_batch_gives_each_record_its_offset_and_stamp_and_keeps_settled_ones() -> None:
    condition = threading.Condition()
    futures = [RecordFuture(condition) for _ in range(4)]
    failed = futures[2]
    failed.set_exception(ValueError("timed out before"))
    called: list[int] = []
    futures[3].add_done_callback(lambda done: called.append(done.result(0).offset))
    waited = concurrent.futures.wait([futures[1]], timeout=0)  # gives it a waiter list
    assert not waited.done
    records = [WireRecord(b"v", None, stamp, []) for stamp in (0, 77, 0, 0)]
    resolve_batch(condition, futures, records, "events", 3, 40, 999)
    assert [futures[n].result(0) for n in (0, 1, 3)] == [
        RecordMetadata("events", 3, 40, 999),
        RecordMetadata("events", 3, 41, 77),  # the record's own stamp
        RecordMetadata("events", 3, 43, 999),
    ]
    assert isinstance(failed.exception(0), ValueError)
    assert called == [43]
    assert concurrent.futures.wait([futures[1]], timeout=0).done == {futures[1]}


def test_resolve_batch_of_a_replay_gives_no_offsets() -> None:
    # A replay of a batch written long ago: written once, its offsets not remembered.
    condition = threading.Condition()
    futures = [RecordFuture(condition) for _ in range(2)]
    records = [WireRecord(b"v", None, 0, []) for _ in range(2)]
    resolve_batch(condition, futures, records, "events", 0, -1, 5)
    assert [future.result(0).offset for future in futures] == [-1, -1]

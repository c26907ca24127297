"""`AttemptLoop` takes a request through the shipped retry rules by callbacks, and
`SessionCommand` numbers a write in its session: the pieces the simulator's clients share
with KVClient. Here on a hand-driven clock and a transport that records what was sent."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import pytest

from quorumlog.codec import wire
from quorumlog.errors import (
    RequestRejectedError,
    SessionExpiredError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.attempt_loop import AttemptLoop
from quorumlog.kv.connection import ClientSession, EndpointSelector, RequestAttempts
from quorumlog.kv.requests import SessionCommand, read_request, read_value
from quorumlog.kv.sessions import SESSION_EXPIRED_RESULT

ENDPOINTS = ["a:1", "b:1", "c:1"]


class Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Timers on a clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: list[tuple[float, int, Handle, Callable[[], None]]] = []
        self.count = 0

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.count += 1
        heapq.heappush(self.due, (self.now + delay_seconds, self.count, handle, callback))
        return handle

    def monotonic_seconds(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        while self.due and self.due[0][0] <= until:
            at, _, handle, callback = heapq.heappop(self.due)
            self.now = at
            if not handle.cancelled:
                callback()
        self.now = until


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, wire.ClientRequest, Callable[[wire.Frame], None]]] = []
        self.refuse: set[str] = set()

    def send(
        self, endpoint: str, request: wire.ClientRequest, on_answer: Callable[[wire.Frame], None]
    ) -> None:
        if endpoint in self.refuse:
            raise ConnectionRefusedError(endpoint)
        self.sent.append((endpoint, request, on_answer))

    def answer(self, frame_of: Callable[[int], wire.Frame], which: int = -1) -> None:
        _, request, on_answer = self.sent[which]
        on_answer(frame_of(request.request_id))


class Outcome:
    def __init__(self) -> None:
        self.answers: list[tuple[Any, str]] = []
        self.errors: list[BaseException] = []

    def on_answer(self, answer: Any, endpoint: str) -> None:
        self.answers.append((answer, endpoint))

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def read_loop(
    timers: ManualTimers,
    transport: RecordingTransport,
    selector: EndpointSelector,
    outcome: Outcome,
    side_effects: bool = False,
) -> AttemptLoop[wire.KVReadResult]:
    request_ids = iter(range(1, 1000))
    attempts = RequestAttempts(
        "get 'k'", selector, timers.monotonic_seconds, 2.0, 0.5, side_effects=side_effects
    )
    return AttemptLoop(
        attempts,
        wire.KVReadResult,
        lambda request_id: read_request("k", request_id),
        timers=timers,
        transport=transport,
        next_request_id=lambda: next(request_ids),
        on_answer=outcome.on_answer,
        on_error=outcome.on_error,
    )


def value(text: str | None) -> Callable[[int], wire.Frame]:
    return lambda request_id: wire.KVReadResult(request_id=request_id, values=[text])


def not_leader(hint: str | None) -> Callable[[int], wire.Frame]:
    return lambda request_id: wire.ErrorResponse(
        request_id=request_id, code=wire.ErrorCode.NOT_LEADER, message="no", leader_hint=hint
    )


def test_an_answer_ends_the_loop_and_the_answering_leader_is_remembered() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    selector = EndpointSelector(ENDPOINTS)
    read_loop(timers, transport, selector, outcome).start()
    transport.answer(value("v"))
    assert outcome.answers[0][1] == "a:1"
    assert read_value(outcome.answers[0][0]) == "v"
    assert selector.leader == "a:1"
    timers.advance(10)
    assert len(transport.sent) == 1 and not outcome.errors


def test_a_not_leader_hint_is_followed_at_once() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome).start()
    transport.answer(not_leader("c:1"))
    assert [endpoint for endpoint, _, _ in transport.sent] == ["a:1", "c:1"]
    transport.answer(value("v"))
    assert outcome.answers[0][1] == "c:1"


def test_a_silent_node_times_out_and_the_next_is_asked_with_a_new_request_id() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    loop = read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome)
    loop.start()
    timers.advance(0.49)
    assert len(transport.sent) == 1
    timers.advance(0.02)
    assert [endpoint for endpoint, _, _ in transport.sent] == ["a:1", "b:1"]
    assert transport.sent[1][1].request_id != transport.sent[0][1].request_id
    assert loop.attempts_lost == 1


def test_late_and_repeated_answers_are_dropped() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome).start()
    timers.advance(0.6)  # the first attempt is given up
    transport.answer(value("old"), which=0)
    assert outcome.answers == []
    transport.answer(value("new"))
    transport.answer(value("copy"))
    assert [read_value(answer) for answer, _ in outcome.answers] == ["new"]


def test_giving_up_a_read_is_unavailable_and_a_write_unknown() -> None:
    for side_effects, error_type in ((False, UnavailableError), (True, UnknownOutcomeError)):
        timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
        selector = EndpointSelector(ENDPOINTS)
        read_loop(timers, transport, selector, outcome, side_effects).start()
        timers.advance(5)
        assert len(outcome.errors) == 1
        assert isinstance(outcome.errors[0], error_type)
        assert len(transport.sent) >= 3


def test_a_busy_node_is_asked_again_after_a_back_off() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome).start()
    transport.answer(
        lambda request_id: wire.ErrorResponse(
            request_id=request_id, code=wire.ErrorCode.PENDING_FULL, message="busy"
        )
    )
    assert len(transport.sent) == 1
    timers.advance(0.01)
    assert len(transport.sent) == 2


def test_a_refusal_is_the_error_and_a_cancelled_loop_says_nothing() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome).start()
    transport.answer(
        lambda request_id: wire.ErrorResponse(
            request_id=request_id, code=wire.ErrorCode.TOO_LARGE, message="big"
        )
    )
    assert isinstance(outcome.errors[0], RequestRejectedError)
    cancelled = Outcome()
    loop = read_loop(timers, transport, EndpointSelector(ENDPOINTS), cancelled)
    loop.start()
    loop.cancel()
    transport.answer(value("v"))
    timers.advance(10)
    assert cancelled.answers == [] and cancelled.errors == []


def test_nodes_that_refuse_connections_leave_the_request_unavailable() -> None:
    timers, transport, outcome = ManualTimers(), RecordingTransport(), Outcome()
    transport.refuse = set(ENDPOINTS)
    read_loop(timers, transport, EndpointSelector(ENDPOINTS), outcome, side_effects=True).start()
    timers.advance(5)
    assert transport.sent == []
    assert isinstance(outcome.errors[0], UnavailableError)


# --- SessionCommand ---------------------------------------------------------------------


def write_result(request_id: int, result: wire.KVCommandResult) -> wire.KVWriteResult:
    return wire.KVWriteResult(request_id=request_id, results=[result])


def test_a_write_reports_its_session_and_acknowledges_its_sequence_when_answered() -> None:
    session = ClientSession("client-1", hold_seconds=5)
    first = SessionCommand(session, ("put", "k", "v", None), 0.0)
    request = first.request(7)
    assert (request.client_id, request.request_id) == ("client-1", 7)
    assert request.commands[0].sequence == wire.FIRST_SEQUENCE
    assert request.first_unacknowledged == wire.FIRST_SEQUENCE
    result = first.answered(write_result(7, wire.KVCommandResult(ok=True)), "a:1")
    assert result.ok and session.answered
    second = SessionCommand(session, ("append", "k", "w", None), 1.0)
    assert second.request(8).first_unacknowledged == second.command.sequence == 2


def test_after_an_unknown_outcome_the_same_call_reuses_its_sequence() -> None:
    session = ClientSession("client-1", hold_seconds=5)
    identity = ("append", "k", "x", None)
    lost = SessionCommand(session, identity, 0.0)
    lost.failed(UnknownOutcomeError("no answer"), 1.0)
    assert SessionCommand(session, identity, 2.0).command.sequence == lost.command.sequence
    other = SessionCommand(session, ("append", "k", "y", None), 2.0)
    assert other.command.sequence != lost.command.sequence


def test_a_refused_session_raises_and_a_failed_cas_is_an_answer() -> None:
    session = ClientSession("client-1", hold_seconds=5)
    refused = SessionCommand(session, ("put", "k", "v", None), 0.0)
    with pytest.raises(SessionExpiredError):
        refused.answered(write_result(1, SESSION_EXPIRED_RESULT), "a:1")
    cas = SessionCommand(session, ("cas", "k", "new", "old"), 0.0)
    result = cas.answered(write_result(2, wire.KVCommandResult(ok=False, value="x")), "a:1")
    assert result.ok is False

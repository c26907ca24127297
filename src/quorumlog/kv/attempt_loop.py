"""`AttemptLoop`: one request taken through `RequestAttempts` by callbacks, for a client
that lives on an event loop instead of blocking a thread.

The blocking clients loop on one thread: next attempt, sleep the back-off, send, wait for
the answer or the attempt's deadline, report it, again. Here each of those steps is a
callback, so the same retry rules (`kv.connection.RequestAttempts`: whom to ask, when to
back off, when to give up and with which error) run wherever timers and a way to send
frames exist. Nothing here does I/O or reads a clock: both come in as small interfaces.
The simulator's KV clients run on it, over virtual time and the simulated frame network.

Only the answer to the attempt in flight counts, as in the blocking client, which skips
answers to attempts it gave up: a late answer to an earlier attempt, or a second copy of
an answer, is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from quorumlog.codec.wire import ClientRequest, Frame
from quorumlog.errors import ClientError
from quorumlog.kv.connection import Attempt, RequestAttempts

ResponseType = TypeVar("ResponseType")


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """Callbacks after a delay, and the clock the deadlines are read on (the runtime's
    `Scheduler` is one)."""

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> TimerHandle: ...

    def monotonic_seconds(self) -> float: ...


class FrameTransport(Protocol):
    def send(
        self, endpoint: str, request: ClientRequest, on_answer: Callable[[Frame], None]
    ) -> None:
        """Send `request` to `endpoint`; call `on_answer` with every frame that comes back
        for it (none, one, or more: callers time out and ignore copies). Raises OSError
        if it certainly could not be sent (no connection to `endpoint`)."""
        ...


class AttemptLoop(Generic[ResponseType]):
    """Sends `make_request(request_id)` until `attempts` yields an answer of type
    `expected` (passed to `on_answer`) or an error (`on_error`: the give-up error of
    `RequestAttempts`, or a refusal it raised). Exactly one of them is called, once,
    unless the loop is cancelled first."""

    def __init__(
        self,
        attempts: RequestAttempts,
        expected: type[ResponseType],
        make_request: Callable[[int], ClientRequest],
        *,
        timers: Timers,
        transport: FrameTransport,
        next_request_id: Callable[[], int],
        on_answer: Callable[[ResponseType, str], None],
        on_error: Callable[[BaseException], None],
        at_leader: bool = True,
    ) -> None:
        self.attempts = attempts
        self.expected = expected
        self.make_request = make_request
        self.timers = timers
        self.transport = transport
        self.next_request_id = next_request_id
        self.on_answer = on_answer
        """Called with the answer and the endpoint that gave it."""
        self.on_error = on_error
        self.at_leader = at_leader
        self.attempt: Attempt | None = None
        self.request_id: int | None = None
        """The request id whose answer is awaited; None between attempts."""
        self.timer: TimerHandle | None = None
        self.finished = False
        self.attempts_sent = 0
        self.attempts_lost = 0

    def start(self) -> None:
        self.next_attempt()

    def cancel(self) -> None:
        """Stop: no more attempts, and neither callback is called."""
        self.finished = True
        self.request_id = None
        self.cancel_timer()

    def next_attempt(self) -> None:
        attempt = self.attempts.next()
        if attempt is None:
            self.fail(self.attempts.give_up_error())
            return
        self.attempt = attempt
        if attempt.delay_seconds:
            self.timer = self.timers.call_later(attempt.delay_seconds, self.send_attempt)
        else:
            self.send_attempt()

    def send_attempt(self) -> None:
        self.timer = None
        attempt = self.attempt
        if self.finished or attempt is None:
            return
        request_id = self.next_request_id()
        try:
            self.transport.send(
                attempt.endpoint,
                self.make_request(request_id),
                lambda frame: self.answered(request_id, frame),
            )
        except OSError as error:
            self.attempts.connect_failed(attempt.endpoint, error)
            self.next_attempt()
            return
        self.attempts.sent()
        self.attempts_sent += 1
        self.request_id = request_id
        wait_seconds = max(attempt.deadline - self.timers.monotonic_seconds(), 0.0)
        self.timer = self.timers.call_later(wait_seconds, lambda: self.timed_out(request_id))

    def timed_out(self, request_id: int) -> None:
        attempt = self.attempt
        if self.finished or request_id != self.request_id or attempt is None:
            return
        self.timer = None
        self.request_id = None
        self.attempts_lost += 1
        self.attempts.lost(attempt.endpoint, TimeoutError("no answer before the deadline"))
        self.next_attempt()

    def answered(self, request_id: int, frame: Frame) -> None:
        attempt = self.attempt
        if self.finished or request_id != self.request_id or attempt is None:
            return  # an attempt given up, or a second copy of the answer
        self.request_id = None
        self.cancel_timer()
        try:
            answer = self.attempts.answered(attempt.endpoint, frame, self.expected)
        except ClientError as error:  # a refusal: SessionExpiredError, RequestRejectedError
            self.fail(error)
            return
        if answer is None:
            self.next_attempt()
            return
        if self.at_leader and self.attempts.fixed_endpoint is None:
            self.attempts.selector.succeeded_at_leader(attempt.endpoint)
        self.finished = True
        self.on_answer(answer, attempt.endpoint)

    def fail(self, error: BaseException) -> None:
        self.finished = True
        self.on_error(error)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


__all__ = ["AttemptLoop", "FrameTransport", "TimerHandle", "Timers"]

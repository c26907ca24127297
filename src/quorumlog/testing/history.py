"""A recorder of client operations, for the linearizability checker.

Each client calls `invoke` just before it sends a request and one of `complete` (it got an
answer), `fail` (the request definitely had no effect, for example it was refused before
it reached any replica) or `unknown` (a timeout or a crash: it may or may not have taken
effect, at any time after its call) once it knows how the request ended.

Times are passed in by the caller and never read here: virtual ticks in the simulator,
`time.monotonic_ns()` on real processes. Any numbers work, as long as one history uses one
clock. The recorder is pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import enum
import math
import threading
from typing import Any

import msgspec

from quorumlog.errors import QuorumLogError


class HistoryError(QuorumLogError, ValueError):
    """A history that breaks the recorder's rules: a return before its call, an operation
    completed twice, a client with two operations in flight, and the like."""


class OperationStatus(enum.Enum):
    """How an operation ended, as its client saw it."""

    OK = "ok"
    """The client got an answer; `output` holds it."""
    FAILED = "failed"
    """The operation definitely did not take effect. Checkers drop it."""
    UNKNOWN = "unknown"
    """It may or may not have taken effect, at any time after its call (a timeout, a crash,
    or still in flight when the history was read). Its return time is +infinity."""


class Operation(msgspec.Struct, frozen=True):
    """One client operation: what was asked, what came back, and when.

    `return_time` is `math.inf` for an unknown outcome, because the operation may take
    effect at any later time. `output` is None unless the status is OK.
    """

    operation_id: int
    client_id: int | str
    kind: str
    key: Any
    argument: Any
    output: Any
    call_time: float
    return_time: float
    status: OperationStatus


def check_operation(operation: Operation) -> None:
    """Raise `HistoryError` unless the operation's times agree with its status.

    Checkers call this on every operation they are given, so hand-built histories get the
    same checks as recorded ones.
    """
    if math.isnan(operation.call_time) or math.isinf(operation.call_time):
        raise HistoryError(f"operation {operation.operation_id}: call time must be finite")
    if math.isnan(operation.return_time):
        raise HistoryError(f"operation {operation.operation_id}: return time is NaN")
    if operation.status is OperationStatus.UNKNOWN:
        if operation.return_time != math.inf:
            raise HistoryError(
                f"operation {operation.operation_id}: an unknown outcome must have return "
                f"time +inf, not {operation.return_time}"
            )
        return
    if math.isinf(operation.return_time):
        raise HistoryError(
            f"operation {operation.operation_id}: status {operation.status.value} needs a "
            "finite return time"
        )
    if operation.return_time < operation.call_time:
        raise HistoryError(
            f"operation {operation.operation_id}: returned at {operation.return_time}, "
            f"before its call at {operation.call_time}"
        )


class _Pending(msgspec.Struct):
    """An operation invoked and not yet ended."""

    client_id: int | str
    kind: str
    key: Any
    argument: Any
    call_time: float


def _check_time(time: float, what: str) -> None:
    if math.isnan(time) or math.isinf(time):
        raise HistoryError(f"{what} time must be a finite number, not {time}")


class History:
    """Records operations of many clients; safe to share between client threads.

    A client has at most one operation in flight: real clients are sequential, and the
    checkers rely on it to tell concurrency from order. A client whose operation ended as
    unknown may go on with its next operation.
    """

    def __init__(self) -> None:
        # One lock around every change: client threads record concurrently, and ids must
        # be unique and the pending table consistent.
        self._lock = threading.Lock()
        self._next_operation_id = 0
        self._pending: dict[int, _Pending] = {}
        self._client_in_flight: dict[int | str, int] = {}
        self._ended: dict[int, Operation] = {}

    def invoke(self, client_id: int | str, kind: str, key: Any, argument: Any, time: float) -> int:
        """Record the call of an operation at `time`; return its operation id."""
        _check_time(time, "call")
        with self._lock:
            in_flight = self._client_in_flight.get(client_id)
            if in_flight is not None:
                raise HistoryError(
                    f"client {client_id!r} invoked {kind!r} while its operation "
                    f"{in_flight} is still in flight"
                )
            operation_id = self._next_operation_id
            self._next_operation_id += 1
            self._pending[operation_id] = _Pending(client_id, kind, key, argument, time)
            self._client_in_flight[client_id] = operation_id
            return operation_id

    def complete(self, operation_id: int, output: Any, time: float) -> None:
        """Record that the operation returned `output` at `time`."""
        _check_time(time, "return")
        self._end(operation_id, OperationStatus.OK, output, time)

    def fail(self, operation_id: int, time: float) -> None:
        """Record that the operation definitely did not take effect; it returned at `time`."""
        _check_time(time, "return")
        self._end(operation_id, OperationStatus.FAILED, None, time)

    def unknown(self, operation_id: int) -> None:
        """Record that the outcome is unknown: it may take effect at any time after its call."""
        self._end(operation_id, OperationStatus.UNKNOWN, None, math.inf)

    def _end(self, operation_id: int, status: OperationStatus, output: Any, time: float) -> None:
        with self._lock:
            pending = self._pending.get(operation_id)
            if pending is None:
                state = "already ended" if operation_id in self._ended else "never invoked"
                raise HistoryError(f"operation {operation_id} cannot end: it was {state}")
            if time < pending.call_time:
                raise HistoryError(
                    f"operation {operation_id} returned at {time}, before its call at "
                    f"{pending.call_time}"
                )
            del self._pending[operation_id]
            del self._client_in_flight[pending.client_id]
            self._ended[operation_id] = _operation(operation_id, pending, status, output, time)

    def operations(self) -> list[Operation]:
        """Every operation so far, in operation-id order.

        Operations still in flight are reported as unknown: from the outside they may or
        may not have taken effect yet, which is exactly what unknown means.
        """
        with self._lock:
            ended = dict(self._ended)
            for operation_id, pending in self._pending.items():
                ended[operation_id] = _operation(
                    operation_id, pending, OperationStatus.UNKNOWN, None, math.inf
                )
        return [ended[operation_id] for operation_id in sorted(ended)]

    @property
    def in_flight_count(self) -> int:
        """Operations invoked that have not ended yet."""
        with self._lock:
            return len(self._pending)

    def __len__(self) -> int:
        with self._lock:
            return self._next_operation_id


def _operation(
    operation_id: int, pending: _Pending, status: OperationStatus, output: Any, time: float
) -> Operation:
    return Operation(
        operation_id=operation_id,
        client_id=pending.client_id,
        kind=pending.kind,
        key=pending.key,
        argument=pending.argument,
        output=output,
        call_time=pending.call_time,
        return_time=time,
        status=status,
    )

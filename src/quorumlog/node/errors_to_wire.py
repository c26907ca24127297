"""How typed errors travel to clients: an ErrorCode and a one-line message."""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec.wire import ErrorCode, ErrorResponse, Frame
from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    InvalidConfigurationChangeError,
    LeaderTransferringError,
    NotLeaderError,
    PendingFullError,
    ProposalDroppedError,
    QuorumLogError,
    SessionExpiredError,
)
from quorumlog.runtime.completion import Completion


def error_code(error: BaseException) -> ErrorCode:
    if isinstance(error, NotLeaderError | ProposalDroppedError):
        # The outcome of a dropped proposal is known (it did not happen); a client retries
        # at the leader with the same sequence either way.
        return ErrorCode.NOT_LEADER
    if isinstance(error, PendingFullError):
        return ErrorCode.PENDING_FULL
    if isinstance(error, LeaderTransferringError):
        return ErrorCode.TRANSFERRING
    if isinstance(error, ConfigurationChangeInProgressError):
        return ErrorCode.CONFIGURATION_IN_PROGRESS
    if isinstance(error, InvalidConfigurationChangeError):
        return ErrorCode.INVALID_CONFIGURATION_CHANGE
    if isinstance(error, SessionExpiredError):
        # Known not to have happened, and not to be retried under the same session.
        return ErrorCode.SESSION_EXPIRED
    return ErrorCode.UNAVAILABLE


def error_response(
    request_id: int, error: BaseException, leader_address: Callable[[], str | None]
) -> ErrorResponse:
    """The answer to a request that failed with `error`; NOT_LEADER carries where the
    leader listens, so the client goes there next."""
    code = error_code(error)
    hint = leader_address() if code is ErrorCode.NOT_LEADER else None
    return ErrorResponse(request_id=request_id, code=code, message=str(error), leader_hint=hint)


def after_read_barrier(
    read_barrier: Callable[[], Completion[int]],
    request_id: int,
    reply: Callable[[Frame], None],
    leader_address: Callable[[], str | None],
    answer: Callable[[], None],
) -> None:
    """Call `answer` once a ReadIndex round confirms reads may be served here (the state
    applied then is linearizable); on a refusal or a failed round, reply with the error."""
    try:
        future = read_barrier()
    except QuorumLogError as error:  # typed refusals from the group (not leader, stopped)
        reply(error_response(request_id, error, leader_address))
        return

    def when_done(done: Completion[int]) -> None:
        error = done.exception()
        if error is not None:
            reply(error_response(request_id, error, leader_address))
        else:
            answer()

    future.add_done_callback(when_done)

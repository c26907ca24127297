"""How typed errors travel to clients: an ErrorCode and a one-line message."""

from __future__ import annotations

from quorumlog.codec.wire import ErrorCode
from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    InvalidConfigurationChangeError,
    LeaderTransferringError,
    NotLeaderError,
    PendingFullError,
    ProposalDroppedError,
)


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
    return ErrorCode.UNAVAILABLE

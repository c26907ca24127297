"""How a refusal travels to clients decides whether they retry it."""

from __future__ import annotations

from quorumlog.codec.wire import ErrorCode
from quorumlog.errors import LeaderNotReadyError
from quorumlog.kv.connection import BUSY_CODES, MAYBE_APPLIED_CODES
from quorumlog.node.errors_to_wire import error_code


def test_a_leader_not_ready_for_a_membership_change_is_retried_by_clients() -> None:
    # Nothing was appended: the client backs off and asks again (not "maybe applied",
    # which ends a membership change that may not be sent twice).
    code = error_code(LeaderNotReadyError("no entry of term 2 committed yet"))
    assert code is ErrorCode.CONFIGURATION_IN_PROGRESS
    assert code in BUSY_CODES
    assert code not in MAYBE_APPLIED_CODES

"""The rules of a node's requests to other groups (`PeerAttempts`, `PeerSelectors`), which the
asyncio requester and the simulator's both follow: whom to ask next, which answers count,
when to pause, what to say at the deadline."""

from __future__ import annotations

import pytest

from quorumlog.codec import wire
from quorumlog.errors import UnavailableError
from quorumlog.node.peer_requests import BACKOFF_SECONDS, PeerSelectors

ADDRESSES = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]


def not_leader(hint: str | None) -> wire.ErrorResponse:
    return wire.ErrorResponse(
        request_id=1, code=wire.ErrorCode.NOT_LEADER, message="not leader", leader_hint=hint
    )


def answer() -> wire.ShardGroupResponse:
    return wire.ShardGroupResponse(request_id=1, message=b"")


def test_a_not_leader_hint_is_followed_and_the_answering_address_is_kept_as_leader() -> None:
    selectors = PeerSelectors()
    attempts = selectors.attempts(ADDRESSES, None, 10.0)
    assert attempts.choose() == ADDRESSES[0]
    assert attempts.outcome(ADDRESSES[0], not_leader(ADDRESSES[2])) is None
    assert attempts.choose() == ADDRESSES[2]
    frame = answer()
    assert attempts.outcome(ADDRESSES[2], frame) is frame
    # The next request to the same group (in any order) starts at the leader it found.
    again = selectors.attempts(list(reversed(ADDRESSES)), None, 10.0)
    assert again.choose() == ADDRESSES[2]


def test_silence_and_unaccepted_answers_move_on_and_pause_once_every_address_failed() -> None:
    attempts = PeerSelectors().attempts(
        ADDRESSES, lambda frame: isinstance(frame, wire.ShardGroupResponse), 10.0
    )
    assert attempts.outcome(ADDRESSES[0], None) is None
    assert attempts.pause_seconds() == 0.0
    assert attempts.choose() == ADDRESSES[1]
    refused = wire.ControllerResponse(request_id=1, results=b"")
    assert attempts.outcome(ADDRESSES[1], refused) is None
    assert attempts.pause_seconds() == 0.0
    assert attempts.choose() == ADDRESSES[2]
    unavailable = wire.ErrorResponse(
        request_id=1, code=wire.ErrorCode.UNAVAILABLE, message="stopping"
    )
    assert attempts.outcome(ADDRESSES[2], unavailable) is None
    assert attempts.pause_seconds() == BACKOFF_SECONDS
    assert attempts.choose() == ADDRESSES[0]
    error = attempts.give_up_error()
    assert isinstance(error, UnavailableError)
    assert "unavailable: stopping" in str(error)


def test_servers_are_resolved_on_every_request_and_none_is_unavailable() -> None:
    where = {"n1": ADDRESSES[0], "n2": ADDRESSES[1]}
    selectors = PeerSelectors(resolve=lambda server: where.get(server, server))
    assert selectors.attempts(["n1", "n2"], None, 10.0).addresses == ADDRESSES[:2]
    where["n1"] = ADDRESSES[2]  # n1 restarted elsewhere
    assert selectors.attempts(["n1", "n2"], None, 10.0).addresses == [ADDRESSES[2], ADDRESSES[1]]
    with pytest.raises(UnavailableError):
        selectors.attempts([], None, 10.0)

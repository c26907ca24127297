"""`RaftCore.peer_reachable`: a quiet follower that an unreachable report woke goes quiet
again when its leader's node is heard before anything else happened; any message or a
campaign in between, or another peer's return, leaves it awake."""

from __future__ import annotations

from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Push, PushKind, VoteRequest
from tests.unit.raft.test_heartbeat_fast_path import (
    FOLLOWER,
    LEADER,
    OTHER,
    follower_holding,
)


def quiet_follower() -> RaftCore:
    core, _ = follower_holding(entries_count=2, commit=2)
    core.step(
        Push(
            source=LEADER,
            target=FOLLOWER,
            term=core.term,
            kind=PushKind.COMMIT,
            round=1,
            index=2,
            index_term=core.term,
            commit_index=2,
            quiesce=True,
        )
    )
    core.ready()
    assert core.quiet
    return core


def test_woken_by_the_leaders_silence_and_quiet_again_when_it_is_heard() -> None:
    core = quiet_follower()
    elapsed = core.election_elapsed
    core.peer_unreachable(LEADER)
    assert not core.quiet and core.election_elapsed == core.config.election_ticks
    core.peer_reachable(OTHER)  # not the leader: nothing
    assert not core.quiet
    core.peer_reachable(LEADER)
    assert core.quiet and core.role is Role.FOLLOWER and core.election_elapsed == elapsed


def test_a_message_or_a_campaign_since_the_wake_keeps_it_awake() -> None:
    core = quiet_follower()
    core.peer_unreachable(LEADER)
    core.step(
        VoteRequest(
            source=OTHER,
            target=FOLLOWER,
            term=core.term + 1,
            pre_vote=True,
            last_log_index=2,
            last_log_term=core.term,
        )
    )
    core.peer_reachable(LEADER)
    assert not core.quiet
    core = quiet_follower()
    core.peer_unreachable(LEADER)
    core.campaign()
    core.peer_reachable(LEADER)
    assert not core.quiet and core.role is Role.PRE_CANDIDATE

"""`RaftConfig.commit_heartbeat_ticks`: a busy group's commit index moves every tick, and a
heartbeat to every follower on every tick only to carry it (and the answers it asked for)
was most of what a node with a thousand busy groups did. With the spacing, a follower
pushed to lately waits for the new commit index until the spacing has passed."""

from __future__ import annotations

from quorumlog.raft.core import RaftCore
from quorumlog.raft.messages import Push
from tests.unit.raft.test_heartbeat_fast_path import (
    FOLLOWER,
    answer_heartbeats,
    answer_to,
    elected_leader_and_store,
    heartbeats,
    persist,
)


def leader_with_a_new_commit_index(spacing_ticks: int) -> RaftCore:
    """A leader whose commit index just moved to 2 after it pushed index 2 to both."""
    core, store = elected_leader_and_store(commit_heartbeat_ticks=spacing_ticks)
    core.send_heartbeats_at_once = True
    core.tick()
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    core.propose(b"y")
    ready = core.ready()
    appends = [m for m in ready.messages if isinstance(m, Push)]
    persist(core, store, ready)
    core.step(answer_to(appends[0], match_index=2))
    core.ready()
    assert core.commit_index == 2
    return core


def test_without_spacing_the_next_tick_carries_the_new_commit_index_to_both() -> None:
    core = leader_with_a_new_commit_index(spacing_ticks=0)
    core.tick()
    assert [h.commit_index for h in heartbeats(core.take_messages_at_once())] == [2, 2]


def test_with_spacing_the_commit_index_waits_for_the_spacing_then_goes_to_both() -> None:
    core = leader_with_a_new_commit_index(spacing_ticks=2)
    core.tick()  # one tick after the APPENDs: nothing yet
    assert heartbeats(core.take_messages_at_once()) == []
    core.tick()
    sent = heartbeats(core.take_messages_at_once())
    assert [h.commit_index for h in sent] == [2, 2]
    assert any(h.target == FOLLOWER for h in sent)


def test_a_waiting_read_is_not_delayed_by_the_spacing() -> None:
    core = leader_with_a_new_commit_index(spacing_ticks=2)
    core.read_index(7)
    core.tick()
    assert len(heartbeats([*core.take_messages_at_once(), *core.ready().messages])) == 2

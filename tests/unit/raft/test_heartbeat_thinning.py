"""Which followers a leader's tick heartbeat leaves out (raft/leader.py
`broadcast_heartbeat`, whose docstring states the rule): an awake group on a busy node
heartbeats only what a follower would otherwise miss within one interval.

The last test drives a leader through random histories (proposals, answers lost or
delivered, reads) and checks the rule's invariant after every tick: each follower gets
some push every keepalive interval, a follower not heard in this check-quorum window is
asked for an answer every tick, and a waiting read's sequence reaches every follower."""

from __future__ import annotations

import random

import msgspec

from quorumlog.raft.core import RaftCore
from quorumlog.raft.messages import Message, Push, PushKind, PushResponse
from tests.unit.raft.test_heartbeat_fast_path import (
    FOLLOWER,
    OTHER,
    answer_heartbeats,
    answer_to,
    elected_leader,
    elected_leader_and_store,
    follower_holding,
    heartbeats,
    persist,
    push,
)


def tick_and_take(core: RaftCore) -> list[Push]:
    core.tick()
    return heartbeats(core.take_messages_at_once())


def test_an_idle_group_asks_each_follower_once_then_waits_quietly_to_quiesce() -> None:
    core = elected_leader(quiesce_idle_ticks=4)
    core.send_heartbeats_at_once = True
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    sent_per_tick: list[int] = []
    while not core.quiet:
        sent = tick_and_take(core)
        sent_per_tick.append(len(sent))
        answer_heartbeats(core, sent, match_index=1)
        assert len(sent_per_tick) < 20, sent_per_tick
    assert core.quiet
    # Every tick of the idle stretch heartbeated both followers before (2, 2, 2, 2...);
    # now the first idle heartbeat is answered, and only the keepalive rule sends more.
    assert sum(sent_per_tick[:-1]) <= len(sent_per_tick[:-1]), sent_per_tick


def test_an_idle_follower_that_has_not_answered_is_asked_every_tick() -> None:
    core = elected_leader(quiesce_idle_ticks=4)
    core.send_heartbeats_at_once = True
    core.take_messages_at_once()
    tick_and_take(core)  # the idle stretch starts at the second tick
    for _ in range(6):
        sent = tick_and_take(core)
        assert [h.target for h in sent if h.target == OTHER] == [OTHER]
        assert all(h.answer_wanted for h in sent)
        answer_heartbeats(core, [h for h in sent if h.target == FOLLOWER], match_index=1)
    assert not core.quiet  # OTHER never answered: a cut-off leader must stay awake


def test_a_heard_follower_with_an_append_in_flight_is_asked_for_no_answer() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    core.propose(b"y")
    core.ready()  # APPENDs of index 2 in flight to both, unanswered
    keepalives: list[Push] = []
    for _ in range(3):
        keepalives.extend(tick_and_take(core))
    assert keepalives  # the followers' timers still hear from us
    assert not any(h.answer_wanted for h in keepalives), keepalives


def deliver(
    core: RaftCore, messages: list[Message], rng: random.Random, last: dict[str, int]
) -> None:
    """Answer what arrived (each message lost with some chance), as followers holding
    everything sent to them would; note the tick each follower last got a push."""
    for message in messages:
        if not isinstance(message, Push):
            continue
        last[message.target] = core.ticks
        if rng.random() < 0.3:
            continue  # lost: no answer
        if message.kind is PushKind.APPEND:
            core.step(answer_to(message, match_index=message.entries[-1].index))
        elif message.kind is PushKind.COMMIT and message.answer_wanted:
            progress = core.leader.progress[message.target]  # type: ignore[union-attr]
            core.step(answer_to(message, match_index=progress.match_index))
        elif message.kind is PushKind.COMPARE:
            core.step(answer_to(message, match_index=message.index))


def test_random_histories_keep_every_follower_timed_heard_and_asked() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        core, store = elected_leader_and_store(quiesce_idle_ticks=rng.choice([0, 3]))
        core.send_heartbeats_at_once = True
        config = core.config
        keepalive_ticks = max(config.heartbeat_ticks, config.election_ticks // 5)
        last_push = {FOLLOWER: core.ticks, OTHER: core.ticks}
        for _ in range(200):
            if core.quiet or not core.is_leader:
                break
            if rng.random() < 0.2:
                core.propose(b"v")
            read_waits = rng.random() < 0.05
            if read_waits:
                core.read_index(rng.randrange(10**6))
            unheard = {
                peer
                for peer, progress in core.leader.progress.items()  # type: ignore[union-attr]
                if not progress.recent_active
            }
            core.tick()
            at_once = core.take_messages_at_once()
            ready = core.ready()
            persist(core, store, ready)
            sent = [*at_once, *ready.messages]
            beats = heartbeats(sent)
            if core.leader is not None and core.leader.check_quorum_elapsed != 0:
                for peer in unheard:  # (a window that just reopened asks again next tick)
                    assert any(h.target == peer and h.answer_wanted for h in beats), (seed, peer)
            if read_waits and core.leader is not None and core.leader.pending_reads:
                assert {h.target for h in beats if h.answer_wanted} == {FOLLOWER, OTHER}
            deliver(core, sent, rng, last_push)
            if not core.quiet and core.is_leader:
                for peer, tick in last_push.items():
                    assert core.ticks - tick < keepalive_ticks + 1, (seed, peer, core.ticks)
            leftover = [m for m in core.ready().messages if isinstance(m, PushResponse)]
            assert not leftover


def test_a_follower_that_lags_the_commit_index_answers_only_when_asked() -> None:
    """It verified entries against this leader (its appends answer for it): a heartbeat
    wanting no answer gets none, though the leader committed past what it holds."""
    core, _ = follower_holding(3, commit=2)
    core.step(push(PushKind.COMMIT, commit_index=5, answer_wanted=False))
    ready = core.ready()
    assert core.commit_index == 3
    assert ready.messages == [] and ready.messages_after_persist == []

    core.step(push(PushKind.COMMIT, commit_index=5, answer_wanted=True))
    assert core.take_messages_at_once() or core.ready().messages


def quiet_leader() -> RaftCore:
    core = elected_leader(quiesce_idle_ticks=2)
    core.send_heartbeats_at_once = True
    for _ in range(20):
        if core.quiet:
            core.take_messages_at_once()
            core.ready()  # the quiesce pushes
            return core
        sent = [*core.take_messages_at_once(), *core.ready().messages]
        for heartbeat in heartbeats(sent):
            answer = answer_to(heartbeat, match_index=1)
            if heartbeat.quiesce:
                answer = msgspec.structs.replace(answer, quiet=True)
            core.step(answer)
        core.tick()
    raise AssertionError("the leader never went quiet")


def test_a_leader_woken_by_a_proposal_sends_the_entries_and_no_heartbeat() -> None:
    core = quiet_leader()
    core.propose(b"y")
    sent = [*core.take_messages_at_once(), *core.ready().messages]
    appends = [m for m in sent if isinstance(m, Push) and m.kind is PushKind.APPEND]
    assert sorted(m.target for m in appends) == [FOLLOWER, OTHER]
    assert heartbeats(sent) == []  # the APPENDs reset both timers and carry the commit index


def test_a_leader_woken_by_a_read_heartbeats_every_follower_first() -> None:
    core = quiet_leader()
    core.read_index(7)
    core.propose(b"y")
    sent = [*core.take_messages_at_once(), *core.ready().messages]
    assert [m.target for m in sent[:2]] == [FOLLOWER, OTHER]
    assert all(h.answer_wanted for h in heartbeats(sent[:2])) and len(heartbeats(sent)) == 2

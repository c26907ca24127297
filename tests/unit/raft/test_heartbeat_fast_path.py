"""Heartbeats without a Ready (raft/core.py `step_heartbeat`, `step_heartbeat_answer`,
`send_heartbeats_at_once`): with a thousand awake groups on a node, a Ready pass per
heartbeat and per answer kept the event loop busy. The fast path must do exactly what
`step` does for what it accepts, and decline (changing nothing) for anything else.

Each test runs twin cores fed the same history: one takes the message by the fast path,
the other by `step` and a Ready; their answers and states must agree."""

from __future__ import annotations

import random

import msgspec

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore
from quorumlog.raft.messages import Message, Push, PushKind, PushResponse, VoteResponse
from quorumlog.raft.ready import HardState, Ready
from quorumlog.storage import LogEntry
from quorumlog.storage.memory import MemoryLogStore

LEADER = "n1"
FOLLOWER = "n2"
OTHER = "n3"
TERM = 3
VOTERS = Configuration(voters=(LEADER, FOLLOWER, OTHER))


def new_core(node_id: str, **settings: object) -> tuple[RaftCore, MemoryLogStore]:
    store = MemoryLogStore()
    core = RaftCore(
        RaftConfig(node_id=node_id, **settings),  # type: ignore[arg-type]
        store,
        hard_state=HardState(term=TERM),
        configuration=VOTERS,
        random=random.Random(7),
    )
    return core, store


def push(kind: PushKind, **fields: object) -> Push:
    settings: dict[str, object] = {"term": TERM, "round": 1, **fields}
    return Push(source=LEADER, target=FOLLOWER, kind=kind, **settings)  # type: ignore[arg-type]


def persist(core: RaftCore, store: MemoryLogStore, ready: Ready) -> None:
    """What the host does once the Ready's sync landed."""
    if ready.entries:
        store.append(ready.entries)
        core.persisted(ready.entries[-1].index, ready.entries[-1].term)


def follower_holding(entries_count: int, commit: int) -> tuple[RaftCore, MemoryLogStore]:
    """A follower of LEADER in TERM, holding `entries_count` durable entries, `commit` of
    them committed, with nothing left to hand out."""
    core, store = new_core(FOLLOWER)
    core.step(push(PushKind.COMPARE))
    persist(core, store, core.ready())
    entries = [LogEntry(index=i, term=TERM, data=b"x") for i in range(1, entries_count + 1)]
    core.step(push(PushKind.APPEND, index=0, index_term=0, entries=entries, commit_index=commit))
    persist(core, store, core.ready())
    core.ready()  # the apply of what committed
    assert not core.has_ready()
    return core, store


def follower_state(core: RaftCore) -> tuple[object, ...]:
    follower = core.follower
    return (
        core.term,
        core.role,
        core.leader_id,
        core.commit_index,
        core.election_elapsed,
        core.randomized_election_ticks,
        follower.round,
        follower.verified_index,
    )


def slow_answer(core: RaftCore, message: Push) -> PushResponse:
    core.step(message)
    ready = core.ready()
    assert not ready.messages_after_persist and ready.hard_state is None
    (answer,) = [m for m in ready.messages if isinstance(m, PushResponse)]
    return answer


def test_a_plain_heartbeat_is_answered_as_step_would_and_needs_no_ready() -> None:
    fast, _ = follower_holding(3, commit=2)
    slow, _ = follower_holding(3, commit=2)
    fast.tick()
    fast.tick()
    slow.tick()
    slow.tick()
    heartbeat = push(PushKind.COMMIT, commit_index=2, read_sequence=9, round=2)

    assert fast.step_heartbeat(heartbeat)

    (answer,) = fast.take_messages_at_once()
    assert isinstance(answer, PushResponse)
    assert answer == slow_answer(slow, heartbeat)
    assert answer.match_index == 3 and answer.read_sequence == 9
    assert follower_state(fast) == follower_state(slow)
    assert fast.election_elapsed == 0  # the leader was heard
    assert not fast.has_ready()


def test_a_heartbeat_that_wants_no_answer_resets_the_timer_and_sends_nothing() -> None:
    fast, _ = follower_holding(3, commit=2)
    slow, _ = follower_holding(3, commit=2)
    for core in (fast, slow):
        core.tick()
    heartbeat = push(PushKind.COMMIT, commit_index=2, read_sequence=9, answer_wanted=False)

    assert fast.step_heartbeat(heartbeat)
    slow.step(heartbeat)

    assert fast.take_messages_at_once() == []
    assert not slow.has_ready()  # the usual step sends nothing either
    assert follower_state(fast) == follower_state(slow)
    assert fast.election_elapsed == 0
    # A heartbeat that moves the commit index still wants no answer: none after the step.
    moving = push(PushKind.COMMIT, commit_index=3, answer_wanted=False)
    assert not fast.step_heartbeat(moving)
    fast.step(moving)
    ready = fast.ready()
    assert fast.commit_index == 3
    assert ready.messages == [] and ready.messages_after_persist == []


def test_the_fast_path_declines_a_heartbeat_that_moves_the_commit_index() -> None:
    core, _ = follower_holding(3, commit=1)
    before = follower_state(core)

    assert not core.step_heartbeat(push(PushKind.COMMIT, commit_index=3))

    assert follower_state(core) == before  # declined: changed nothing
    core.step(push(PushKind.COMMIT, commit_index=3))
    assert core.commit_index == 3  # the usual step does it


def test_the_fast_path_declines_what_only_step_may_decide() -> None:
    core, _ = follower_holding(2, commit=2)
    declined = [
        push(PushKind.COMMIT, commit_index=2, term=TERM + 1),  # a new term: persist first
        push(PushKind.COMMIT, commit_index=2, round=0),  # an older round
        push(PushKind.COMMIT, commit_index=2, quiesce=True, index=2, index_term=TERM),
        Push(source=OTHER, target=FOLLOWER, term=TERM, kind=PushKind.COMMIT, round=1),
        push(PushKind.APPEND, index=2, index_term=TERM, commit_index=2),
    ]
    before = follower_state(core)
    for message in declined:
        assert not core.step_heartbeat(message), message
    assert core.outbox_at_once == []
    assert follower_state(core) == before


def test_a_follower_whose_term_is_not_durable_yet_takes_the_slow_path() -> None:
    core, _ = new_core(FOLLOWER)
    # A heartbeat of a new term: the term is durable only once the Ready is persisted.
    core.step(Push(source=LEADER, target=FOLLOWER, term=TERM + 1, kind=PushKind.COMMIT, round=1))
    assert not core.step_heartbeat(push(PushKind.COMMIT, term=TERM + 1))
    core.ready()  # the host saved the new term
    assert core.step_heartbeat(push(PushKind.COMMIT, term=TERM + 1))


def elected_leader(**settings: object) -> RaftCore:
    """LEADER in TERM + 1, both followers caught up through its no-op (index 1)."""
    return elected_leader_and_store(**settings)[0]


def elected_leader_and_store(**settings: object) -> tuple[RaftCore, MemoryLogStore]:
    core, store = new_core(LEADER, **settings)
    core.campaign()  # pre-vote first, then the vote, each granted by both
    for message in core.ready().messages:
        core.step(grant(message, pre_vote=True))
    for message in core.ready().messages_after_persist:
        core.step(grant(message, pre_vote=False))
    assert core.is_leader
    ready = core.ready()
    persist(core, store, ready)
    for message in [*ready.messages, *core.ready().messages]:
        if isinstance(message, Push) and message.kind is PushKind.COMPARE:
            core.step(answer_to(message, match_index=message.index))
    for message in core.ready().messages:
        if isinstance(message, Push) and message.kind is PushKind.APPEND:
            core.step(answer_to(message, match_index=message.entries[-1].index))
    core.ready()
    assert core.commit_index == 1
    assert not core.has_ready()
    return core, store


def grant(message: Message, pre_vote: bool) -> Message:
    return VoteResponse(
        source=message.target,
        target=message.source,
        term=message.term,
        granted=True,
        pre_vote=pre_vote,
    )


def answer_to(message: Push, match_index: int, read_sequence: int | None = None) -> PushResponse:
    return PushResponse(
        source=message.target,
        target=message.source,
        term=message.term,
        kind=message.kind,
        round=message.round,
        success=True,
        index=message.index,
        match_index=match_index,
        end_index=match_index,
        read_sequence=message.read_sequence if read_sequence is None else read_sequence,
    )


def heartbeats(messages: list[Message]) -> list[Push]:
    return [m for m in messages if isinstance(m, Push) and m.kind is PushKind.COMMIT]


def test_a_leader_tick_sends_its_heartbeats_at_once_without_a_ready() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    core.tick()
    sent = heartbeats(core.take_messages_at_once())
    assert sorted(m.target for m in sent) == [FOLLOWER, OTHER]
    assert not core.has_ready()


def test_heartbeats_at_once_left_undrained_go_out_with_the_next_ready() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    core.tick()
    assert core.has_ready()  # nothing may be stranded in the outbox
    assert len(heartbeats(core.ready().messages)) == 2


def test_an_unchanged_answer_is_taken_without_a_ready_and_confirms_a_read() -> None:
    fast = elected_leader()
    slow = elected_leader()
    for core in (fast, slow):
        core.read_index(41)
    fast_pushes = heartbeats(fast.ready().messages)
    slow_pushes = heartbeats(slow.ready().messages)
    assert fast_pushes == slow_pushes

    assert fast.step_heartbeat_answer(answer_to(fast_pushes[0], match_index=1))
    slow.step(answer_to(slow_pushes[0], match_index=1))

    assert fast.has_ready()  # the quorum (us and one follower) confirmed the read
    fast_ready, slow_ready = fast.ready(), slow.ready()
    assert fast_ready.read_states == slow_ready.read_states != []
    assert fast_ready.messages == slow_ready.messages == []
    assert fast.leader is not None and slow.leader is not None
    assert fast.leader.describe() == slow.leader.describe()


def test_an_answer_that_moves_a_match_index_is_declined_unchanged() -> None:
    core = elected_leader()
    core.propose(b"y")
    core.ready()  # the APPEND of index 2 goes out; its own answer is not here yet
    core.tick()
    (heartbeat, _) = heartbeats(core.ready().messages)
    leader = core.leader
    assert leader is not None
    progress = leader.progress[heartbeat.target]
    before = (repr(progress), progress.read_sequence_acked, progress.recent_active)

    assert not core.step_heartbeat_answer(answer_to(heartbeat, match_index=2))

    assert (repr(progress), progress.read_sequence_acked, progress.recent_active) == before
    core.step(answer_to(heartbeat, match_index=2))  # the usual step counts the match
    assert progress.match_index == 2


def test_a_leader_keeps_no_lease_bookkeeping_without_lease_reads() -> None:
    core = elected_leader()
    for _ in range(50):
        core.tick()
        for heartbeat in heartbeats(core.ready().messages):
            core.step(answer_to(heartbeat, match_index=1))
    assert core.leader is not None
    assert core.leader.sequence_sent_tick == {}  # it grew by one entry per heartbeat before


def answer_heartbeats(core: RaftCore, messages: list[Message], match_index: int) -> None:
    for heartbeat in heartbeats(messages):
        core.step(answer_to(heartbeat, match_index=match_index))


def test_a_tick_heartbeat_leaves_out_a_follower_just_pushed_the_same_commit_index() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    core.tick()
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    core.propose(b"y")
    appends = core.ready().messages  # index 2 to both followers, carrying commit 1
    assert sorted(m.target for m in appends if isinstance(m, Push)) == [FOLLOWER, OTHER]

    core.tick()
    assert heartbeats(core.take_messages_at_once()) == []  # the APPENDs did it

    core.tick()  # no push since the last heartbeat (and none answered): both again
    assert sorted(m.target for m in heartbeats(core.take_messages_at_once())) == [
        FOLLOWER,
        OTHER,
    ]


def test_a_pushed_follower_not_heard_in_this_window_still_gets_a_heartbeat_to_answer() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    for _ in range(core.config.election_ticks):  # a new check-quorum window opens
        core.tick()
        sent = core.take_messages_at_once()
        answer_heartbeats(core, [m for m in sent if m.target == OTHER], match_index=1)
    assert core.is_leader
    core.propose(b"y")
    core.ready()
    core.tick()
    # FOLLOWER has not answered in this window; its APPEND answer waits for its sync,
    # which may be slow, so it still gets this heartbeat, and must answer it at once
    # (check-quorum). OTHER was heard and just got the APPEND: nothing for it.
    (heartbeat,) = heartbeats(core.take_messages_at_once())
    assert heartbeat.target == FOLLOWER and heartbeat.answer_wanted


def test_a_heard_follower_that_knows_the_commit_index_gets_a_keepalive_every_other_tick() -> None:
    core = elected_leader()  # election_ticks 10: a keepalive every 2 ticks
    core.send_heartbeats_at_once = True
    counts: list[int] = []
    for _ in range(3 * core.config.election_ticks):
        core.tick()
        sent = heartbeats(core.take_messages_at_once())
        counts.append(len(sent))
        answer_heartbeats(core, [h for h in sent if h.answer_wanted], match_index=1)
    assert core.is_leader
    assert sum(counts) <= len(counts) * 2 * 0.7, counts  # every tick to both before
    assert all(count > 0 for count in (sum(counts[i : i + 2]) for i in range(len(counts) - 1)))


def test_a_follower_pushed_an_older_commit_index_or_a_waiting_read_gets_the_heartbeat() -> None:
    core, store = elected_leader_and_store()
    core.send_heartbeats_at_once = True
    core.tick()
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    core.propose(b"y")
    ready = core.ready()
    appends = [m for m in ready.messages if isinstance(m, Push)]
    persist(core, store, ready)
    core.step(answer_to(appends[0], match_index=2))  # commit 2: newer than the pushes carried
    assert core.commit_index == 2
    core.ready()  # the new commit index waits for the heartbeat (no entries to push)
    core.tick()
    sent = heartbeats(core.take_messages_at_once())
    assert len(sent) == 2
    for heartbeat in sent:  # FOLLOWER holds index 2; OTHER's APPEND is still in flight
        core.step(answer_to(heartbeat, match_index=2 if heartbeat.target == FOLLOWER else 1))

    core.propose(b"z")
    core.ready()
    core.read_index(5)
    core.tick()  # a read waits: every follower must answer this sequence
    assert len(heartbeats(core.take_messages_at_once())) == 2


def test_a_busy_leader_wants_one_answer_per_follower_per_check_quorum_window() -> None:
    core = elected_leader()
    core.send_heartbeats_at_once = True
    wanted: list[int] = []
    for _ in range(3 * core.config.election_ticks):
        core.tick()
        assert core.is_leader  # one answer per window keeps check-quorum satisfied
        sent = heartbeats(core.take_messages_at_once())
        wanted.append(sum(1 for heartbeat in sent if heartbeat.answer_wanted))
        answer_heartbeats(core, [h for h in sent if h.answer_wanted], match_index=1)
    # The window (election_ticks) opens with every follower unheard: both are asked once.
    assert sum(wanted) <= 2 * 4, wanted
    assert wanted.count(2) >= 3, wanted


def test_a_leader_wants_every_answer_while_a_read_waits_or_while_it_is_idle() -> None:
    core = elected_leader(quiesce_idle_ticks=3)
    core.send_heartbeats_at_once = True
    core.tick()
    answer_heartbeats(core, core.take_messages_at_once(), match_index=1)
    core.tick()  # idle now: quiescing counts answers, so every heartbeat asks for one
    assert all(h.answer_wanted for h in heartbeats(core.take_messages_at_once()))

    busy = elected_leader()
    busy.send_heartbeats_at_once = True
    busy.tick()
    answer_heartbeats(busy, busy.take_messages_at_once(), match_index=1)
    busy.read_index(3)
    busy.tick()
    sent = heartbeats([*busy.take_messages_at_once(), *busy.ready().messages])
    assert sent and all(h.answer_wanted for h in sent)


def test_a_follower_that_cannot_vouch_for_the_commit_index_answers_anyway() -> None:
    """After a restart a follower has verified nothing against the leader: it answers a
    heartbeat that wants no answer, so the leader learns of it and compares again."""
    core, _ = follower_holding(3, commit=3)
    core.follower.start(TERM, LEADER)  # what a restart leaves: nothing verified yet
    heartbeat = push(PushKind.COMMIT, commit_index=3, answer_wanted=False)

    assert core.step_heartbeat(heartbeat)

    (answer,) = core.take_messages_at_once()
    assert isinstance(answer, PushResponse) and answer.match_index == 0


class PushBeforeAnswerWanted(msgspec.Struct, frozen=True, tag="Push", array_like=True):
    """`Push` as a node from before `answer_wanted` declares it (same tag, same order)."""

    source: str
    target: str
    term: int
    kind: PushKind
    round: int
    index: int = 0
    index_term: int = 0
    entries: list[LogEntry] = []
    commit_index: int = 0
    read_sequence: int = 0
    quiesce: bool = False


def test_answer_wanted_is_a_trailing_field_older_and_newer_nodes_both_read() -> None:
    new = push(PushKind.COMMIT, commit_index=4, read_sequence=2, answer_wanted=False)
    as_old = msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=PushBeforeAnswerWanted)
    assert (as_old.commit_index, as_old.read_sequence) == (4, 2)  # the flag is dropped
    old = PushBeforeAnswerWanted(
        source=LEADER, target=FOLLOWER, term=TERM, kind=PushKind.COMMIT, round=1
    )
    as_new = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Push)
    assert as_new.answer_wanted  # an older leader's heartbeat is answered, as before

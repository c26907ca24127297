"""`RaftCore.tick_counting_only`: the host's cheap tick for a follower whose tick only
counts toward its election timeout. Twin cores fed the same history, one ticked through
the cheap path (falling back to `tick` when it declines), the other through `tick` alone,
must agree on every state and every Ready, through heartbeats, a silent leader and the
elections that follow; a leader always takes the full tick."""

from __future__ import annotations

import random

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Push, PushKind
from quorumlog.raft.ready import HardState, Ready
from quorumlog.storage.memory import MemoryLogStore
from tests.unit.raft.test_heartbeat_fast_path import elected_leader_and_store

LEADER = "n1"
FOLLOWER = "n2"
TERM = 3
VOTERS = Configuration(voters=(LEADER, FOLLOWER, "n3"))


def new_follower() -> RaftCore:
    return RaftCore(
        RaftConfig(node_id=FOLLOWER),
        MemoryLogStore(),
        hard_state=HardState(term=TERM),
        configuration=VOTERS,
        random=random.Random(11),
    )


def state(core: RaftCore) -> tuple[object, ...]:
    return (
        core.ticks,
        core.term,
        core.role,
        core.leader_id,
        core.quiet,
        core.election_elapsed,
        core.randomized_election_ticks,
        core.has_ready(),
    )


def described(ready: Ready) -> tuple[object, ...]:
    return (ready.messages, ready.messages_after_persist, ready.hard_state, ready.entries)


def heartbeat(round_number: int) -> Push:
    return Push(source=LEADER, target=FOLLOWER, term=TERM, kind=PushKind.COMMIT, round=round_number)


def test_the_cheap_tick_does_exactly_what_tick_does() -> None:
    cheap, plain = new_follower(), new_follower()
    history = random.Random(5)
    taken = declined = 0
    for step_number in range(600):
        if step_number < 300 and history.random() < 0.15:
            # A live leader for the first half: its heartbeats reset the timers; after
            # that it is silent, and the followers time out, campaign and go on ticking.
            message = heartbeat(1)
            cheap.step(message)
            plain.step(message)
        elif cheap.tick_counting_only():
            taken += 1
            plain.tick()
        else:
            declined += 1
            cheap.tick()
            plain.tick()
        assert state(cheap) == state(plain), step_number
        if plain.has_ready():
            assert described(cheap.ready()) == described(plain.ready()), step_number
    assert taken > 100 and declined > 10  # both paths were exercised


def test_the_cheap_tick_declines_the_tick_that_times_out_and_a_leader() -> None:
    core = new_follower()
    core.randomized_election_ticks = 3
    assert core.tick_counting_only() and core.tick_counting_only()
    before = state(core)
    assert not core.tick_counting_only()  # the third tick starts an election
    assert state(core) == before
    core.tick()
    assert core.role is Role.PRE_CANDIDATE
    assert elected_leader_and_store()[0].tick_counting_only() is False

"""`RaftConfig.leader_node_hold_ticks`: a follower whose election timeout ran out holds its
campaign while the node-level liveness hears its leader's node, for a bounded number of
ticks; a silent leader's node, a report that the group stopped there, or the bound ends
the hold. Liveness only: what a campaign then does is unchanged."""

from __future__ import annotations

import random

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import PushKind
from quorumlog.raft.ready import HardState
from quorumlog.storage.memory import MemoryLogStore
from tests.unit.raft.test_heartbeat_fast_path import LEADER, TERM, new_core, persist, push

HOLD_TICKS = 15


def follower(hold_ticks: int = HOLD_TICKS) -> tuple[RaftCore, set[str]]:
    """A follower that knows LEADER, and the set of peers its liveness calls silent."""
    core, store = new_core("n2", leader_node_hold_ticks=hold_ticks)
    core.step(push(PushKind.COMPARE))
    persist(core, store, core.ready())
    assert core.leader_id == LEADER and core.role is Role.FOLLOWER
    silent: set[str] = set()
    core.leader_node_live = lambda peer: peer not in silent
    return core, silent


def ticks_until_campaign(core: RaftCore, ticks_max: int = 200) -> int:
    for tick in range(1, ticks_max + 1):
        core.tick()
        if core.role is not Role.FOLLOWER:
            return tick
    raise AssertionError("never campaigned")


def test_a_live_leaders_node_holds_the_campaign_for_at_most_the_bound() -> None:
    held, _ = follower()
    plain, _ = follower(hold_ticks=0)
    timeout = plain.randomized_election_ticks
    assert held.randomized_election_ticks == timeout  # the same seed: the same draw
    assert ticks_until_campaign(plain) == timeout
    assert ticks_until_campaign(held) == timeout + HOLD_TICKS
    assert held.elections_held == 1 and plain.elections_held == 0


def test_a_silent_leaders_node_ends_the_hold_at_once() -> None:
    core, silent = follower()
    timeout = core.randomized_election_ticks
    for _ in range(timeout + 3):
        core.tick()
    assert core.role is Role.FOLLOWER and core.election_held_ticks == 4
    silent.add(LEADER)
    core.tick()
    assert core.role is Role.PRE_CANDIDATE


def test_a_stopped_group_at_the_leaders_live_node_is_not_waited_for() -> None:
    """`peer_unreachable` for this group (its leader's group stopped on a node that still
    pings) voids the hold until the leader is heard in this group again."""
    core, _ = follower()
    core.peer_unreachable(LEADER)
    timeout = core.randomized_election_ticks
    assert ticks_until_campaign(core) == timeout


def test_a_message_from_the_leader_restarts_the_timer_and_the_hold() -> None:
    core, _ = follower()
    for _ in range(core.randomized_election_ticks + 5):
        core.tick()
    assert core.election_held_ticks == 6
    core.step(push(PushKind.COMMIT, index=0, index_term=0))
    core.ready()
    assert (core.election_elapsed, core.election_held_ticks) == (0, 0)
    timeout = core.randomized_election_ticks
    assert ticks_until_campaign(core) == timeout + HOLD_TICKS
    assert core.elections_held == 2


def test_no_liveness_no_hold() -> None:
    core, _ = follower()
    core.leader_node_live = None
    timeout = core.randomized_election_ticks
    assert ticks_until_campaign(core) == timeout


def test_a_leader_removed_from_the_voters_is_not_waited_for() -> None:
    """A leader that removed itself steps down while its node lives on: holding for it
    would only delay the election (the simulator's quiet seed 3, at 8 s, caught it)."""
    store = MemoryLogStore()
    core = RaftCore(
        RaftConfig(node_id="n2", leader_node_hold_ticks=HOLD_TICKS),
        store,
        hard_state=HardState(term=TERM),
        configuration=Configuration(voters=("n2", "n3")),
        random=random.Random(7),
    )
    core.step(push(PushKind.COMPARE))
    persist(core, store, core.ready())
    assert core.leader_id == LEADER and not core.configuration.is_voter(LEADER)
    core.leader_node_live = lambda peer: True
    timeout = core.randomized_election_ticks
    assert ticks_until_campaign(core) == timeout

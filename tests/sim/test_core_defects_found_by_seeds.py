"""Core bugs a review found, put back on purpose: the seeded nemesis must find each in a
bounded block of seeds, and the seed that finds it must pass on the fixed core. A test
that breaks the code proves the simulator notices (see KNOWN_CORE_BUGS.md, core-10 and
core-12); the unit tests in tests/unit/raft/test_safety_scenarios.py script each bug.

The blocks name their seeds. Any change to the core, the nemesis, the workload or the
seed plan can move what a seed does; when a block here stops finding its bug, patch the
old code in as these tests do, run a wider block (`run_seed` over, say, 1-300), move the
block to cover the new finders, and update the seeds in KNOWN_CORE_BUGS.md.
"""

from __future__ import annotations

import re

import pytest

from quorumlog.errors import ConfigurationChangeInProgressError, LeaderTransferringError
from quorumlog.raft.configuration import MembershipChange, apply_change, encode_configuration
from quorumlog.raft.core import RaftCore
from quorumlog.raft.leader import LeaderState, PendingRead
from quorumlog.raft.messages import TimeoutNow
from quorumlog.raft.progress import Progress, ReplicationState
from quorumlog.raft.ready import ReadState
from quorumlog.storage.entry import EntryType
from quorumlog.testing.sim.runner import SeedResult, run_seed

SIMULATED_SECONDS = 30

MEMBERSHIP_RACE_SEEDS = range(21, 61)
"""Five nodes. With the old change_membership, seeds 28, 31 and 34 of this block fail
(leader completeness); membership races run in about a third of the seeds
(`RACE_SEED_FRACTION`). (Re-picked when the simulator moved to the shipped KV service
and clients; before, 28, 31, 51, 56 and 58 failed.)"""

LEASE_TRANSFER_SEEDS = range(1, 41)
"""Three nodes. With the old lease reads, seeds 8, 14, 24, 28, 37 and 38 of this block
fail (not linearizable: a read from the old leader's lease misses a write of the new
leader). (Re-picked when the simulator moved to the shipped KV service and clients;
before, 41, 70 and 85 of 31-100 failed.)"""


def first_failure(seeds: range, node_count: int) -> SeedResult | None:
    for seed in seeds:
        result = run_seed(seed, node_count, SIMULATED_SECONDS, capture_trace=False)
        if not result.ok:
            return result
    return None


# --- defect 1: a membership change before the leader's first commit ---------------------


def change_membership_before_the_fix(core: RaftCore, change: MembershipChange) -> int:
    """`RaftCore.change_membership` before 8a15966: a new leader changed membership before
    an entry of its term had committed."""
    leader = core.require_leader()
    if leader.transfer_target is not None:
        raise LeaderTransferringError("a leader transfer is in progress")
    if core.configurations[-1][0] > core.commit_index:
        raise ConfigurationChangeInProgressError(
            f"the change at index {core.configurations[-1][0]} is not committed yet"
        )
    new_configuration = apply_change(core.configuration, change)
    return leader.append_local(encode_configuration(new_configuration), EntryType.CONFIGURATION)


def test_defect_1_membership_change_before_the_first_commit_is_found_by_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RaftCore, "change_membership", change_membership_before_the_fix)
    found = first_failure(MEMBERSHIP_RACE_SEEDS, 5)
    assert found is not None, f"the old change_membership passed seeds {MEMBERSHIP_RACE_SEEDS}"
    failure = str(found.failure)
    # Two majorities that do not overlap: each elects and commits on its own.
    assert re.search(
        r"leader completeness|state-machine safety|two leaders|drops committed|truncates after",
        failure,
    ), failure
    assert found.faults.get("membership_race", 0) > 0, found.faults
    monkeypatch.undo()
    fixed = run_seed(found.seed, 5, SIMULATED_SECONDS)
    assert fixed.ok, fixed.failure


# --- defect 3: lease reads survive a leadership transfer --------------------------------


def read_index_before_the_fix(leader: LeaderState, request_id: int) -> None:
    """`LeaderState.read_index` before 8a15966: a lease read even during a transfer."""
    core = leader.core
    if core.commit_index < leader.first_index_of_term:
        leader.reads_before_first_commit.append(request_id)
        return
    if core.config.lease_read and leader.lease_valid():
        core.read_states.append(ReadState(request_id=request_id, index=core.commit_index))
        return
    leader.pending_reads.append(
        PendingRead(request_id, core.commit_index, leader.read_sequence + 1)
    )
    leader.heartbeat_due = True


def lease_valid_before_the_fix(leader: LeaderState) -> bool:
    """`LeaderState.lease_valid` before 8a15966: a TimeoutNow sent did not end the lease."""
    return leader.core.ticks < leader.lease_start_tick + leader.core.config.election_ticks - 1


def maybe_finish_transfer_before_the_fix(
    leader: LeaderState, peer: str, progress: Progress
) -> None:
    """`LeaderState.maybe_finish_transfer` before 8a15966: the lease outlived TimeoutNow."""
    core = leader.core
    if leader.transfer_target != peer:
        return
    if progress.match_index == core.log.last_index:
        core.send(TimeoutNow(source=core.node_id, target=peer, term=leader.term))
    elif progress.state is ReplicationState.APPEND:
        leader.send_appends(peer, progress)


def test_defect_3_lease_reads_during_a_transfer_are_found_by_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LeaderState, "read_index", read_index_before_the_fix)
    monkeypatch.setattr(LeaderState, "lease_valid", lease_valid_before_the_fix)
    monkeypatch.setattr(LeaderState, "maybe_finish_transfer", maybe_finish_transfer_before_the_fix)
    found = first_failure(LEASE_TRANSFER_SEEDS, 3)
    assert found is not None, f"the old lease reads passed seeds {LEASE_TRANSFER_SEEDS}"
    failure = str(found.failure)
    assert "not linearizable" in failure, failure
    assert found.faults.get("transfer_then_cut", 0) > 0, found.faults
    monkeypatch.undo()
    fixed = run_seed(found.seed, 3, SIMULATED_SECONDS)
    assert fixed.ok, fixed.failure

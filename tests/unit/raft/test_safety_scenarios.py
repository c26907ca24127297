"""Safety scenarios a review found and thousands of simulator seeds did not: each scripts
the exact interleaving, names the section it checks, and fails on the core before the fix.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    LeaderNotReadyError,
    LeaderTransferringError,
)
from quorumlog.raft.configuration import ChangeKind, MembershipChange, apply_change
from quorumlog.raft.configuration import encode_configuration as encode
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.raft.messages import Message, Push, PushKind, TimeoutNow
from quorumlog.storage import EntryType, LogEntry
from tests.unit.raft.harness import Cluster


def partition(cluster: Cluster, *groups: list[str]) -> None:
    """Cut every link between the groups (replacing earlier cuts)."""
    cluster.heal()
    for group in groups:
        for other in groups:
            if other is not group:
                cluster.cut.update((source, target) for source in group for target in other)


def applied_agree(cluster: Cluster) -> bool:
    """State-machine safety: no two nodes applied different entries at one index."""
    by_index: dict[int, tuple[int, EntryType, bytes]] = {}
    for node in cluster.nodes.values():
        for entry in node.applied:
            identity = (entry.term, entry.type, entry.data)
            if by_index.setdefault(entry.index, identity) != identity:
                return False
    return True


def drop_appends_from(source: str) -> Callable[[Message], bool]:
    return lambda m: isinstance(m, Push) and m.source == source and m.kind is PushKind.APPEND


# --- 1: a membership change before the leader's first commit ---------------------------


def add_n5_then_elect_n2_before_its_no_op_commits() -> Cluster:
    """C0 = {n1..n4}. n1 (term 1) adds n5; the entry reaches only n5. n2 wins term 2 with
    n2, n3, n4, and its no-op has reached no one yet."""
    cluster = Cluster(4)
    cluster.add_node("n5")
    cluster.elect("n1")
    cluster.tick(2)
    partition(cluster, ["n1", "n5"], ["n2", "n3", "n4"])
    add_index = cluster.core("n1").change_membership(MembershipChange(ChangeKind.ADD_VOTER, "n5"))
    cluster.stabilize()
    assert cluster.core("n5").log.term(add_index) == 1
    assert all(cluster.core(i).log.last_index < add_index for i in ("n2", "n3", "n4"))
    cluster.drop_filter = drop_appends_from("n2")
    cluster.elect("n2")
    n2 = cluster.core("n2")
    assert n2.term == 2 and n2.commit_index < n2.log.last_index
    return cluster


def n1_campaigns_with_n4_and_n5(cluster: Cluster) -> None:
    """n1 comes back on the side of n4 and n5: together a majority of C1 = {n1..n5}."""
    partition(cluster, ["n1", "n4", "n5"], ["n2", "n3"])
    cluster.drop_filter = None
    cluster.tick(2, nodes=["n1", "n4", "n5"])  # n4's answers tell n1 of term 2: it steps down
    assert cluster.core("n1").role is Role.FOLLOWER
    for _ in range(2):  # a refused pre-vote may still teach n1 the current term
        cluster.expire_leases()
        cluster.core("n1").campaign()
        cluster.stabilize()
    cluster.tick(2, nodes=["n1", "n4", "n5"])


def test_a_new_leader_changes_membership_only_after_its_first_commit_4_1() -> None:
    """Dissertation §4.1 with its errata (Ongaro, raft-dev 2015, single-server changes):
    a change stacked on an earlier leader's uncommitted one lets two majorities that do
    not overlap commit different entries at the same indexes."""
    cluster = add_n5_then_elect_n2_before_its_no_op_commits()
    n2 = cluster.core("n2")
    remove_n4 = MembershipChange(ChangeKind.REMOVE, "n4")
    with pytest.raises(LeaderNotReadyError):
        n2.change_membership(remove_n4)
    assert n2.configuration.voters == ("n1", "n2", "n3", "n4")
    # Once the no-op commits (on n2, n3 and n4), the same change is taken.
    cluster.drop_filter = None
    cluster.tick(n2.config.append_timeout_ticks + 1, nodes=["n2", "n3", "n4"])
    assert n2.commit_index == n2.log.last_index
    n2.change_membership(remove_n4)
    # C2 = {n1, n2, n3} and a client write commit on n2 and n3 alone.
    partition(cluster, ["n1", "n5"], ["n2", "n3"], ["n4"])
    write_index = cluster.propose("n2", b"acknowledged")
    cluster.tick(2, nodes=["n2", "n3"])
    assert n2.commit_index >= write_index
    assert cluster.nodes["n2"].data_applied() == [b"acknowledged"]
    # n4 holds n2's no-op, so it refuses n1: no majority of C1 elects n1 now.
    n1_campaigns_with_n4_and_n5(cluster)
    assert cluster.core("n1").role is not Role.LEADER
    assert cluster.core("n5").role is not Role.LEADER
    cluster.heal()
    cluster.tick(30)
    assert applied_agree(cluster)
    for node_id in ("n1", "n2", "n3"):
        assert cluster.nodes[node_id].data_applied() == [b"acknowledged"]


def change_membership_before_the_fix(core: RaftCore, change: MembershipChange) -> int:
    """`RaftCore.change_membership` as it was: no wait for the leader's first commit."""
    leader = core.require_leader()
    if leader.transfer_target is not None:
        raise LeaderTransferringError("a leader transfer is in progress")
    if core.configurations[-1][0] > core.commit_index:
        raise ConfigurationChangeInProgressError("the last change is not committed yet")
    new_configuration = apply_change(core.configuration, change)
    return leader.append_local(encode(new_configuration), EntryType.CONFIGURATION)


def test_without_the_wait_the_same_interleaving_loses_an_acknowledged_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control for the test above: the interleaving is real, and costs a write."""
    monkeypatch.setattr(RaftCore, "change_membership", change_membership_before_the_fix)
    cluster = add_n5_then_elect_n2_before_its_no_op_commits()
    n2 = cluster.core("n2")
    n2.change_membership(MembershipChange(ChangeKind.REMOVE, "n4"))
    partition(cluster, ["n1", "n5"], ["n2", "n3"], ["n4"])
    cluster.drop_filter = None
    cluster.tick(n2.config.append_timeout_ticks + 1, nodes=["n2", "n3"])
    write_index = cluster.propose("n2", b"acknowledged")
    cluster.tick(2, nodes=["n2", "n3"])
    assert n2.commit_index >= write_index
    assert cluster.nodes["n2"].data_applied() == [b"acknowledged"]
    n1_campaigns_with_n4_and_n5(cluster)
    n1 = cluster.core("n1")
    assert n1.role is Role.LEADER and n1.term == 3
    assert n1.commit_index >= write_index - 1  # n1's own entries, at n2's indexes
    assert not applied_agree(cluster)
    assert n1.log.term(write_index) != 2  # the acknowledged write can never commit now


# --- 2: check before mutating ---------------------------------------------------------


def push_below_commit(core: RaftCore, kind: PushKind) -> Message:
    """What a buggy leader of the current term could send: drop entries a follower has
    committed (TRUNCATE), or overwrite one (APPEND with a conflicting entry)."""
    below = core.commit_index - 3  # the entry after it has term 1; the leader's term is 2
    fields: dict[str, object] = {}
    if kind is PushKind.APPEND:
        fields["entries"] = [LogEntry(index=below + 1, term=core.term, data=b"conflict")]
    return Push(
        source=str(core.leader_id),
        target=core.node_id,
        term=core.term,
        kind=kind,
        round=core.follower.round,
        index=below,
        index_term=core.log.term(below) or 0,
        commit_index=core.commit_index,
        **fields,  # type: ignore[arg-type]
    )


def durable_view(core: RaftCore) -> tuple[object, ...]:
    log = core.log
    return (
        core.term,
        core.vote,
        core.commit_index,
        core.applied_index,
        list(core.configurations),
        log.last_index,
        log.entries(log.first_index, log.last_index + 1),
        log.unstable_offset,
        log.handed_out_index,
        log.pending_truncate_after,
        core.follower.verified_index,
    )


@pytest.mark.parametrize("kind", [PushKind.TRUNCATE, PushKind.APPEND])
def test_a_push_that_would_cut_below_the_commit_index_changes_nothing_5_3(
    kind: PushKind,
) -> None:
    """§5.3 never removes a committed entry; the check that refuses it must run before
    the log is touched, or the runtime could later persist the truncation."""
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.propose("n1", b"b")
    cluster.elect("n2")  # term 2, so a term-2 entry conflicts with n3's term-1 entries
    cluster.propose("n2", b"c")
    cluster.tick(2)
    n3 = cluster.core("n3")
    assert n3.commit_index == n3.log.last_index == 5
    before = durable_view(n3)
    with pytest.raises(InvariantViolation, match="truncating committed entries"):
        n3.step(push_below_commit(n3, kind))
    assert durable_view(n3) == before


# --- 3: lease reads and leadership transfer -------------------------------------------


def leader_with_a_lease() -> Cluster:
    cluster = Cluster(3, lease_read=True)
    cluster.elect("n1")
    cluster.propose("n1", b"old")
    cluster.tick(2)
    leader = cluster.core("n1").leader
    assert leader is not None and leader.lease_valid()
    # The lease serves a read at once, without a heartbeat round.
    cluster.core("n1").read_index(1)
    cluster.process("n1")
    assert cluster.read_results["n1"] == [(1, cluster.core("n1").commit_index)]
    return cluster


def n2_wins_and_commits_while_n1_hears_nothing(cluster: Cluster, timeout_now: Message) -> int:
    """Messages to n1 are withheld: n1 still believes it leads term 1."""
    cluster.cut.update({("n2", "n1"), ("n3", "n1")})
    cluster.core("n2").step(timeout_now)
    cluster.stabilize()
    assert cluster.core("n2").role is Role.LEADER and cluster.core("n2").term == 2
    index = cluster.propose("n2", b"new")
    assert cluster.core("n2").commit_index >= index
    assert cluster.core("n1").role is Role.LEADER and cluster.core("n1").term == 1
    return index


def assert_no_read_from_the_lease(cluster: Cluster, request_id: int) -> None:
    cluster.core("n1").read_index(request_id)
    cluster.stabilize()
    # On the old core n1 answered from its lease: a read without "new", which committed.
    assert request_id not in [served for served, _ in cluster.read_results["n1"]]
    cluster.heal()
    cluster.tick(3)
    assert cluster.core("n1").role is Role.FOLLOWER
    assert request_id in cluster.failed_reads["n1"]  # the client retries at n2


def take_timeout_now(cluster: Cluster) -> Message:
    cluster.process("n1")
    [timeout_now] = [m for m in cluster.queue if isinstance(m, TimeoutNow)]
    cluster.queue.remove(timeout_now)
    return timeout_now


def test_a_leader_transferring_leadership_serves_no_lease_reads_6_4_1_and_3_10() -> None:
    """Dissertation §6.4.1: a lease holds because voters ignore other candidates while it
    runs. A TimeoutNow candidate (§3.10) is exempt, so the lease ends when one is sent."""
    cluster = leader_with_a_lease()
    cluster.core("n1").transfer_leadership("n2")
    timeout_now = take_timeout_now(cluster)
    n2_wins_and_commits_while_n1_hears_nothing(cluster, timeout_now)
    assert_no_read_from_the_lease(cluster, 2)


def test_a_timeout_now_delivered_after_the_transfer_gave_up_still_voids_the_lease() -> None:
    """The TimeoutNow is delayed past the transfer's deadline; the leader carried on and
    renewed its lease with heartbeats, then the target is elected at once. A lease is no
    good for the rest of a term in which a TimeoutNow went out."""
    cluster = leader_with_a_lease()
    n1 = cluster.core("n1")
    n1.transfer_leadership("n2")
    timeout_now = take_timeout_now(cluster)
    # The leader sends TimeoutNow again with each answer of the target; those are lost.
    cluster.drop_filter = lambda m: isinstance(m, TimeoutNow)
    cluster.tick(n1.config.election_ticks + 1)
    cluster.drop_filter = None
    assert n1.leader is not None and n1.leader.transfer_target is None
    assert n1.leader.lease_start_tick >= n1.ticks - 2  # heartbeats were confirmed since
    n2_wins_and_commits_while_n1_hears_nothing(cluster, timeout_now)
    assert_no_read_from_the_lease(cluster, 2)

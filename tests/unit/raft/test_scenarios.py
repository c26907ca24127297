"""Readable Raft scenarios, each naming the paper section or reference step it checks."""

from __future__ import annotations

import pytest

from quorumlog.errors import LeaderTransferringError, NotLeaderError, PendingFullError
from quorumlog.raft.configuration import ChangeKind, MembershipChange
from quorumlog.raft.core import Role
from quorumlog.raft.messages import Push, PushKind
from quorumlog.raft.progress import ReplicationState
from quorumlog.storage import EntryType
from tests.unit.raft.harness import Cluster


def committed_data(cluster: Cluster, node_id: str) -> list[bytes]:
    return cluster.nodes[node_id].data_applied()


def test_election_one_leader_and_noop_commits_5_2() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    assert cluster.leaders() == ["n1"]
    leader = cluster.core("n1")
    assert leader.term == 1
    # §5.4.2: the new leader's no-op commits, and with it the leader knows its commit index.
    assert leader.commit_index == 1
    assert leader.log.entries(1, 2)[0].type is EntryType.NO_OP
    cluster.tick(2)
    for node_id in ("n2", "n3"):
        assert cluster.core(node_id).commit_index == 1
        assert cluster.core(node_id).leader_id == "n1"


def test_replication_and_apply_on_every_node_5_3() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    for i in range(20):
        cluster.propose("n1", f"v{i}".encode())
    cluster.tick(2)
    expected = [f"v{i}".encode() for i in range(20)]
    for node_id in cluster.nodes:
        assert committed_data(cluster, node_id) == expected


def test_follower_refuses_proposals_with_leader_hint() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.tick(1)
    with pytest.raises(NotLeaderError) as raised:
        cluster.core("n2").propose(b"x")
    assert raised.value.leader_hint == "n1"


def test_election_timeout_elects_someone_without_help_5_2() -> None:
    cluster = Cluster(5, seed=7)
    cluster.tick(40)
    assert len(cluster.leaders()) == 1


def test_divergent_uncommitted_tail_compare_then_truncate_reference_3_3() -> None:
    """A follower holding entries of an old leader that never committed: COMPARE finds the
    match point by fast backup and TRUNCATE drops the tail (reference 000 §3.3.4 to 3.3.5)."""
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    # n1 appends entries only it (and n2's queue, which we drop) will hold.
    cluster.isolate("n1")
    for i in range(5):
        cluster.core("n1").propose(f"lost{i}".encode())
    cluster.stabilize()
    old_tail = cluster.core("n1").log.last_index
    cluster.heal()
    cluster.isolate("n1")
    cluster.cut.discard(("n2", "n3"))
    cluster.elect("n2")
    cluster.propose("n2", b"b")
    cluster.propose("n2", b"c")
    cluster.heal()
    # n1's first COMPARE was lost while it was cut off; the leader retries after a timeout.
    cluster.tick(cluster.core("n2").config.append_timeout_ticks + 2)
    n1 = cluster.core("n1")
    assert n1.role is Role.FOLLOWER
    assert n1.log.last_index < old_tail + 3
    expected = [b"a", b"b", b"c"]
    for node_id in cluster.nodes:
        assert committed_data(cluster, node_id) == expected
    n2_log = cluster.core("n2").log
    assert n1.log.entries(1, n1.log.last_index + 1) == n2_log.entries(1, n2_log.last_index + 1)


def test_figure_8_older_term_entry_is_not_committed_by_counting_5_4_2() -> None:
    """Raft figure 8: a leader must not commit an entry of an earlier term just because it
    is on a majority; only an entry of its own term commits, and the older ones with it."""
    cluster = Cluster(5, seed=3, append_entries_max=1)
    cluster.elect("n1")
    # (a) n1 (term 1) replicates an entry at index 2 to n2 only.
    cluster.isolate("n1")
    cluster.cut -= {("n1", "n2"), ("n2", "n1")}
    cluster.core("n1").propose(b"term1-entry")
    cluster.stabilize()
    assert cluster.core("n2").log.term(2) == 1
    # (b) n1 crashes; n5 wins term 2 with n3, n4 but its entries reach no one.
    cluster.down.add("n1")
    cluster.heal()
    cluster.isolate("n2")
    cluster.drop_filter = lambda m: isinstance(m, Push) and m.kind is PushKind.APPEND
    cluster.elect("n5")
    assert cluster.core("n5").term == 2
    # (c) n5 crashes; n1 restarts and wins term 3 with n2 and n3. Its no-op (index 3)
    # reaches n2 but not n3, while the term-1 entry at index 2 does reach n3.
    cluster.down = {"n5"}
    cluster.nodes["n1"].restart()
    cluster.heal()
    cluster.isolate("n4")
    cluster.drop_filter = lambda m: (
        isinstance(m, Push) and m.target == "n3" and any(e.index >= 3 for e in m.entries)
    )
    cluster.core("n1").campaign()  # learns of term 2 from the refusals
    cluster.stabilize()
    cluster.elect("n1")
    leader = cluster.core("n1")
    assert leader.term == 3
    cluster.tick(2)
    assert cluster.core("n3").log.term(2) == 1  # on n1, n2, n3: a majority of five
    assert leader.log.term(3) == 3
    # The term-1 entry is on a majority, yet it must not count as committed.
    assert leader.commit_index < 2
    # Once the leader's own entry reaches a majority, both commit together.
    cluster.drop_filter = None
    cluster.tick(cluster.core("n1").config.append_timeout_ticks + 2)
    assert leader.commit_index >= 3
    assert cluster.nodes["n3"].data_applied() == [b"term1-entry"]


def test_isolated_old_leader_rejoins_and_steps_down_5_1() -> None:
    cluster = Cluster(3, seed=5)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.isolate("n1")
    cluster.tick(30, nodes=["n2", "n3"])
    [new_leader] = [i for i in ("n2", "n3") if cluster.core(i).role is Role.LEADER]
    cluster.propose(new_leader, b"b")
    # Meanwhile the old leader has stepped down by check-quorum (§6.2).
    cluster.tick(25, nodes=["n1"])
    assert cluster.core("n1").role is not Role.LEADER
    cluster.heal()
    cluster.tick(5)
    assert cluster.leaders() == [new_leader]
    assert committed_data(cluster, "n1") == [b"a", b"b"]


def test_pre_vote_stops_term_inflation_9_6() -> None:
    cluster = Cluster(3, seed=11)
    cluster.elect("n1")
    cluster.isolate("n3")
    cluster.tick(60)
    # n3 kept timing out but never raised its term: pre-votes never won a majority.
    assert cluster.core("n3").term == 1
    cluster.heal()
    cluster.tick(5)
    assert cluster.leaders() == ["n1"]
    assert cluster.core("n1").term == 1


def test_without_pre_vote_a_rejoining_node_would_disrupt() -> None:
    """The control for the test above: the same schedule without pre-vote does disrupt."""
    cluster = Cluster(3, seed=11, pre_vote=False, check_quorum=False)
    cluster.elect("n1")
    cluster.isolate("n3")
    cluster.tick(60)
    assert cluster.core("n3").term > 1


def test_leader_transfer_hands_over_and_refuses_proposals_meanwhile_3_10() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.cut.add(("n1", "n3"))  # n3 lags, so the transfer must wait for it
    cluster.propose("n1", b"b")
    cluster.core("n1").transfer_leadership("n3")
    with pytest.raises(LeaderTransferringError):
        cluster.core("n1").propose(b"refused")
    cluster.heal()
    # The lost push is resent after a timeout; then n3 is caught up and takes over.
    cluster.tick(cluster.core("n1").config.append_timeout_ticks + 2)
    assert cluster.leaders() == ["n3"]
    assert cluster.core("n3").term == 2
    cluster.propose("n3", b"c")
    cluster.tick(2)
    assert committed_data(cluster, "n1") == [b"a", b"b", b"c"]


def test_pending_full_fails_fast_reference_2() -> None:
    cluster = Cluster(3, pending_entries_max=5)
    cluster.elect("n1")
    cluster.isolate("n1")
    for i in range(5):
        cluster.core("n1").propose(f"p{i}".encode())
    with pytest.raises(PendingFullError):
        cluster.core("n1").propose(b"one too many")
    cluster.heal()
    cluster.tick(3)
    cluster.core("n1").propose(b"after")  # room again once the backlog commits


def test_follower_behind_compaction_gets_snapshot_7() -> None:
    cluster = Cluster(3, snapshot_chunk_bytes_max=7)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.isolate("n3")
    for i in range(10):
        cluster.propose("n1", f"x{i}".encode())
    leader = cluster.nodes["n1"]
    # The leader snapshots its state machine and compacts its log up to it, so the
    # entries n3 lacks exist only in the snapshot.
    meta = cluster.snapshot("n1")
    assert leader.store.first_index == meta.index + 1
    cluster.heal()
    cluster.tick(6)
    n3 = cluster.nodes["n3"]
    assert n3.snapshot is not None and leader.snapshot is not None
    assert n3.snapshot.data == leader.snapshot.data
    assert n3.data_applied() == leader.data_applied()
    assert n3.core.commit_index == leader.core.commit_index
    progress = leader.core.leader.progress["n3"]  # type: ignore[union-attr]
    assert progress.state is ReplicationState.APPEND
    cluster.propose("n1", b"after-snapshot")
    cluster.tick(2)
    assert n3.data_applied()[-1] == b"after-snapshot"


def test_read_index_confirms_leadership_before_answering_6_4() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.core("n1").read_index(42)
    cluster.stabilize()
    assert cluster.read_results["n1"] == [(42, cluster.core("n1").commit_index)]
    # A leader cut off from everyone cannot confirm: the read does not complete.
    cluster.isolate("n1")
    cluster.core("n1").read_index(43)
    cluster.tick(3, nodes=["n1"])
    assert [r for r, _ in cluster.read_results["n1"]] == [42]
    cluster.tick(30, nodes=["n1"])  # check-quorum steps it down; the read fails
    assert 43 in cluster.failed_reads["n1"]


def test_membership_add_learner_promote_and_remove_4_1() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.add_node("n4")
    cluster.core("n1").change_membership(MembershipChange(ChangeKind.ADD_LEARNER, "n4"))
    cluster.tick(4)
    assert committed_data(cluster, "n4") == [b"a"]
    assert not cluster.core("n1").configuration.is_voter("n4")
    cluster.core("n1").change_membership(MembershipChange(ChangeKind.PROMOTE_LEARNER, "n4"))
    cluster.tick(2)
    assert cluster.core("n4").configuration.voters == ("n1", "n2", "n3", "n4")
    cluster.core("n1").change_membership(MembershipChange(ChangeKind.REMOVE, "n1"))
    cluster.tick(40)
    [leader] = cluster.leaders()
    assert leader != "n1"
    cluster.propose(leader, b"b")
    cluster.tick(2)
    assert committed_data(cluster, "n4") == [b"a", b"b"]


def test_a_restarted_follower_of_an_idle_group_learns_the_commit_index() -> None:
    """After a restart a follower has compared nothing with the leader, so heartbeats alone
    must not leave it without a commit index while the group is idle."""
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.tick(2)
    assert cluster.core("n3").commit_index == 2
    # The runtime saves the commit index only with term and vote changes.
    node = cluster.nodes["n3"]
    assert node.hard_state.commit == 0
    node.restart()
    assert cluster.core("n3").commit_index == 0
    cluster.tick(cluster.core("n1").config.append_timeout_ticks + 2)
    assert cluster.core("n3").commit_index == 2
    assert cluster.nodes["n3"].data_applied() == [b"a"]


def test_a_leader_sends_a_configuration_entry_only_once_it_holds_it_durably_4_1() -> None:
    """A change that removes a follower must never reach that follower before the leader
    has it on disk. Otherwise: {n2, n3} with leader n3 removes n2; n2 gets the entry, n3
    crashes before its write lands and loses it. n2 now holds a longer log whose newest
    configuration says n2 is no voter, so n2 may not campaign, and it refuses n3's votes
    (n3's log is shorter): no leader is ever elected again (seed 102 of the simulator)."""
    cluster = Cluster(3)
    cluster.elect("n1")
    leader = cluster.core("n1")
    leader.change_membership(MembershipChange(ChangeKind.REMOVE, "n3"))
    change_index = leader.log.last_index
    ready = leader.ready()  # taken before the leader's own write is durable

    def carries_the_change(message: object) -> bool:
        return isinstance(message, Push) and any(
            entry.index == change_index for entry in message.entries
        )

    assert ready.entries[-1].type is EntryType.CONFIGURATION
    assert not any(carries_the_change(m) for m in ready.messages + ready.messages_after_persist)
    cluster.nodes["n1"].store.append(ready.entries)  # what the host writes, then syncs
    leader.persisted(change_index, leader.term)
    later = leader.ready()
    assert [m.target for m in later.messages if carries_the_change(m)] == ["n2"]

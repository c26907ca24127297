"""The scenario harness runs the shipped Ready loop: each node is a `RaftHost`, so its
fail-stop, its persistence and its restart are the ones production has."""

from __future__ import annotations

import pytest

from quorumlog.errors import GroupFailedError
from quorumlog.raft.core import Role
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.raft.messages import Push, PushKind
from quorumlog.runtime.host import RaftHost
from quorumlog.storage import LogEntry
from tests.unit.raft.harness import Cluster


def cluster_with_a_committed_tail() -> Cluster:
    """n2 leads term 2; every node holds five committed entries, the first two of term 1."""
    cluster = Cluster(3)
    cluster.elect("n1")
    cluster.propose("n1", b"a")
    cluster.propose("n1", b"b")
    cluster.elect("n2")
    cluster.propose("n2", b"c")
    cluster.tick(2)
    assert cluster.core("n3").commit_index == cluster.core("n3").log.last_index == 5
    return cluster


def push_overwriting_a_committed_entry(cluster: Cluster) -> Push:
    """What a buggy leader could send n3: an entry of term 2 over n3's committed index 3."""
    n3 = cluster.core("n3")
    return Push(
        source="n2",
        target="n3",
        term=n3.term,
        kind=PushKind.APPEND,
        round=n3.follower.round,
        index=2,
        index_term=n3.log.term(2) or 0,
        entries=[LogEntry(index=3, term=n3.term, data=b"conflict")],
        commit_index=n3.commit_index,
    )


def test_every_harness_node_is_a_raft_host_on_its_own_manual_clock() -> None:
    cluster = Cluster(3)
    hosts = [cluster.host(node_id) for node_id in sorted(cluster.nodes)]
    assert all(isinstance(host, RaftHost) for host in hosts)
    assert len({id(host.scheduler) for host in hosts}) == 3
    cluster.tick(3, nodes=["n1"])
    assert cluster.nodes["n1"].scheduler.now_seconds == 3 * cluster.host_settings.tick_seconds
    assert cluster.nodes["n2"].scheduler.now_seconds == 0


def test_an_invariant_failing_in_the_core_stops_the_hosts_group() -> None:
    """Design, "Sans-I/O cores, one host": an invariant that fails stops its group before
    anything more is persisted or sent. The harness delivers through the host, so the
    failure is the host's, not an exception the test happens to catch."""
    cluster = cluster_with_a_committed_tail()
    n3 = cluster.nodes["n3"]
    durable = n3.disk.file_system.durable_file_contents
    durable_before = (n3.store.last_index, durable(), n3.hard_state, n3.applied[:])
    cluster.queue.append(push_overwriting_a_committed_entry(cluster))
    with pytest.raises(GroupFailedError) as raised:
        cluster.stabilize()
    assert isinstance(raised.value.__cause__, InvariantViolation)
    host = cluster.host("n3")
    assert host.failure is not None and "truncating committed entries" in host.failure
    sent_before = cluster.sent_count["n3"]
    # Time passes and the others keep pushing to n3: it neither answers nor campaigns.
    cluster.tick(3 * cluster.core("n3").config.election_ticks)
    assert cluster.sent_count["n3"] == sent_before
    assert (n3.store.last_index, durable(), n3.hard_state, n3.applied) == (durable_before)
    with pytest.raises(GroupFailedError):
        host.propose(b"refused")
    # The rest of the group goes on without it.
    cluster.propose("n2", b"d")
    cluster.tick(2)  # followers learn the new commit index with the next push
    assert cluster.nodes["n1"].data_applied() == [b"a", b"b", b"c", b"d"]
    # A restart (the operator's fix) brings n3 back from what it synced.
    n3.restart()
    cluster.tick(cluster.core("n2").config.append_timeout_ticks + 2)
    assert n3.data_applied() == [b"a", b"b", b"c", b"d"]


def test_a_failing_state_machine_stops_the_leader_and_fails_its_waiters() -> None:
    cluster = Cluster(3)
    cluster.elect("n1")
    leader = cluster.nodes["n1"]

    def apply_fails(index: int, data: bytes) -> int:
        raise OSError("the state machine's disk went away")

    leader.machine.apply = apply_fails  # type: ignore[method-assign]
    host = cluster.host("n1")
    completion = host.propose(b"a")
    with pytest.raises(GroupFailedError) as raised:
        cluster.stabilize()
    assert isinstance(raised.value.__cause__, OSError)
    assert completion.done() and isinstance(completion.exception(), GroupFailedError)
    assert not host.is_leader
    sent_before = cluster.sent_count["n1"]
    cluster.tick(3 * cluster.core("n2").config.election_ticks)
    assert cluster.sent_count["n1"] == sent_before
    [new_leader] = [
        node_id for node_id in ("n2", "n3") if cluster.core(node_id).role is Role.LEADER
    ]
    assert cluster.nodes[new_leader].data_applied() == [b"a"]


def test_a_restart_keeps_the_vote_it_synced_so_no_term_has_two_leaders_5_2() -> None:
    """Figure 2: currentTerm and votedFor are persistent state, written before a vote is
    answered. A node that voted, crashed and came back must not vote again in that term."""
    cluster = Cluster(3, pre_vote=False, check_quorum=False)
    cluster.isolate("n3")
    # n1 wins term 1 with n2's vote, but none of its entries reach anyone: n2's log stays
    # as empty as n3's, so only the vote n2 synced stops it from electing n3 in term 1.
    cluster.drop_filter = lambda message: isinstance(message, Push)
    cluster.elect("n1")
    assert cluster.core("n1").term == 1
    assert cluster.core("n2").log.last_index == 0
    cluster.nodes["n2"].restart()
    cluster.heal()
    cluster.cut.update({("n1", "n3"), ("n3", "n1")})
    cluster.core("n3").campaign()  # term 1 for n3 as well: it never heard of n1's
    cluster.stabilize()
    assert cluster.core("n3").term == 1
    assert cluster.leaders() == ["n1"]


def test_a_restart_loses_what_was_written_but_not_synced() -> None:
    """The harness's disk keeps only what a sync covered: a crash between the host's write
    and its fsync loses the entry, as a real disk may."""
    cluster = Cluster(3)
    cluster.elect("n1")
    n1 = cluster.nodes["n1"]
    last_synced = n1.store.last_index
    old_background = n1.background
    cluster.host("n1").propose(b"unsynced")
    assert n1.scheduler.run_next()  # the host writes the entry and submits its sync
    assert n1.store.last_index == last_synced + 1
    durable = n1.disk.file_system.durable_file_contents()
    assert durable != n1.disk.file_system.file_contents()  # written, not synced
    n1.restart()
    assert n1.store.last_index == last_synced
    assert old_background.jobs_pending == 1  # the sync died with the old process
    cluster.tick(3 * cluster.core("n1").config.election_ticks)
    [leader] = cluster.leaders()
    logs = {node_id: cluster.core(node_id).log.last_index for node_id in cluster.nodes}
    assert set(logs.values()) == {cluster.core(leader).log.last_index}
    data = {node_id: node.data_applied() for node_id, node in cluster.nodes.items()}
    assert len({tuple(applied) for applied in data.values()}) == 1

"""The invariant checker catches each violation it is meant to catch.

Each test builds a healthy cluster, then breaks one fact by hand (as a buggy core would)
and checks that the next check raises InvariantViolation naming it."""

from __future__ import annotations

import pytest

from quorumlog.raft.core import Role
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.cluster import SimCluster, SimOptions


@pytest.fixture
def cluster() -> SimCluster:
    cluster = SimCluster(seed=5, options=SimOptions(node_count=3))
    cluster.wait_for_leader()
    for number in range(5):
        cluster.put("k", str(number))
    cluster.run(ticks=5)
    return cluster


def followers(cluster: SimCluster) -> list[str]:
    return sorted(node for node in cluster.nodes if node != cluster.leader())


def test_two_leaders_in_one_term(cluster: SimCluster) -> None:
    leader = cluster.node(str(cluster.leader()))
    other = cluster.node(followers(cluster)[0])
    other.core.term = leader.core.term
    other.core.role = Role.LEADER
    with pytest.raises(InvariantViolation, match="two leaders in term"):
        cluster.checker.check_node(other)


def test_commit_index_going_back(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    node.core.commit_index -= 1
    with pytest.raises(InvariantViolation, match="commit index went back"):
        cluster.checker.check_node(node)


def test_two_different_entries_applied_at_one_index(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    index = node.applied_index
    forged = LogEntry(index=index, term=99, data=b"forged", type=EntryType.DATA)
    with pytest.raises(InvariantViolation, match="state-machine safety"):
        cluster.checker.on_apply(node, forged)


def test_log_matching_same_index_and_term_different_data(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    last = node.core.log.last_index
    original = node.core.log.entries(last, last + 1)[0]
    forged = LogEntry(index=last, term=original.term, data=b"other", type=original.type)
    node.disk.store.truncate_suffix(last - 1)
    with pytest.raises(InvariantViolation, match="log matching"):
        cluster.checker.on_append(node, [forged])


def test_log_matching_same_entry_after_a_different_predecessor(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    last = node.core.log.last_index
    original = node.core.log.entries(last, last + 1)[0]
    node.disk.store.truncate_suffix(last - 2)
    bridge = LogEntry(index=last - 1, term=original.term + 7, data=b"bridge")
    with pytest.raises(InvariantViolation, match="log matching"):
        cluster.checker.on_append(node, [bridge, original])


def test_truncating_a_committed_entry(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    with pytest.raises(InvariantViolation, match="truncates after"):
        cluster.checker.on_truncate(node, node.core.commit_index - 2)


def test_a_new_leader_without_the_committed_entries(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    committed = cluster.checker.committed_index_max
    node.disk.store.truncate_suffix(committed - 1)
    node.core.log.unstable_offset = committed
    node.core.log.last_index = committed - 1
    node.core.term += 5
    node.core.role = Role.LEADER
    with pytest.raises(InvariantViolation, match="leader completeness"):
        cluster.checker.check_node(node)


def test_diverging_state_machines(cluster: SimCluster) -> None:
    node = cluster.node(followers(cluster)[0])
    node.machine.store.put("k", b"tampered")
    node.machine.store.finish()
    with pytest.raises(InvariantViolation, match="different states"):
        cluster.check_converged()

"""A disk slower than the election timeout does not depose a leader whose followers are all
there: a follower answers a heartbeat at once, claiming only what is durable already
(raft/follower.py `answer_heartbeat`), so the leader's check-quorum hears from them even
while every sync takes longer than its window.

Before, every answer waited for the follower's next sync; with syncs of 700 ms against a
500 ms check-quorum window under a steady stream of writes, the leader stepped down again
and again (found by `quorumlog bench scale`: 1000 partitions on a busy disk elected for
minutes). The nodes run the shipped host; invariants are checked after every event.
"""

from __future__ import annotations

from quorumlog.raft.config import RaftConfig
from quorumlog.testing.sim.cluster import SimCluster, SimOptions

SLOW_SYNC_MS = 700
"""Longer than the election timeout (10 ticks of 50 ms)."""


def test_a_leader_is_not_deposed_by_syncs_slower_than_its_check_quorum_window() -> None:
    options = SimOptions(raft=RaftConfig(node_id="template", election_ticks=10, check_quorum=True))
    for seed in range(3):
        cluster = SimCluster(seed, options)
        leader = cluster.wait_for_leader(ticks_max=400)
        term = cluster.node(leader).core.term
        # The disk slows down once a leader is elected (a vote, answered after its sync,
        # could not arrive within an election timeout on this disk).
        for node in cluster.nodes.values():
            node.background.delay_ms_min = node.background.delay_ms_max = SLOW_SYNC_MS
        for number in range(12):  # about 20 simulated seconds of back-to-back writes
            cluster.put(f"k{number}", "v", ticks_max=400)
        assert cluster.leader() == leader, cluster.describe()
        assert {node.core.term for node in cluster.nodes.values()} == {term}, cluster.describe()
        assert cluster.get("k11", ticks_max=400) == "v"

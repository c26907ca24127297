"""`SimCluster` runs any state machine a `SimApplication` names, as the public test kit
promises: here a counter, under a crash, catch-up by snapshot and a leader change."""

from __future__ import annotations

import pytest

from quorumlog.testing import SimApplication, SimCluster, SimOptions
from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.node import NodeOptions


class Counter:
    """Adds the integers its entries hold; its state is the running total."""

    def __init__(self) -> None:
        self.total = 0
        self.applied_index = 0

    def apply(self, index: int, data: bytes) -> int:
        self.total += int(data)
        self.applied_index = index
        return self.total

    def mark_applied(self, index: int) -> None:
        self.applied_index = index

    def snapshot(self) -> bytes:
        return f"{self.applied_index} {self.total}".encode()

    def restore(self, data: bytes) -> None:
        applied_index, total = data.split()
        self.applied_index, self.total = int(applied_index), int(total)


def counter_cluster(seed: int = 3) -> SimCluster:
    options = SimOptions(
        node_count=3, node=NodeOptions(snapshot_interval_entries=4, snapshot_trailing_entries=0)
    )
    return SimCluster(seed=seed, options=options, application=SimApplication(Counter))


def totals(cluster: SimCluster) -> set[int]:
    return {node.machine.total for node in cluster.nodes.values()}


def test_a_users_machine_is_replicated_through_crashes_and_snapshots() -> None:
    cluster = counter_cluster()
    leader = cluster.wait_for_leader()
    follower = sorted(node for node in cluster.nodes if node != leader)[0]
    cluster.crash(follower)
    for _ in range(12):
        cluster.propose(b"5")
    cluster.run(ticks=10)
    cluster.restart(follower)
    cluster.isolate(leader)
    assert cluster.run_until(lambda: cluster.leader() not in (None, leader), ticks_max=100)
    cluster.propose(b"40")
    cluster.heal()
    assert cluster.run_until(lambda: totals(cluster) == {100}, ticks_max=100), cluster.describe()
    assert cluster.node(follower).disk.snapshot is not None  # caught up by a snapshot
    cluster.check_converged()


def test_without_a_service_or_marker_the_kv_helpers_refuse() -> None:
    cluster = counter_cluster()
    cluster.wait_for_leader()
    with pytest.raises(SimulationError, match="no service"):
        cluster.put("k", "v")
    with pytest.raises(SimulationError, match="marker"):
        cluster.propose()

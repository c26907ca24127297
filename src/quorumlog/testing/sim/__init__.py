"""Deterministic simulation of Raft clusters: virtual time, a seeded faulty network and
disks, the shipped KV machine, service and client logic under a workload with a recorded
history (or your own state machine: `SimApplication`), invariants after every event.

One seed reproduces a whole run exactly: `quorumlog sim raft --seeds N-N --nodes K`.

    from quorumlog.testing.sim import SimCluster, SimOptions

    cluster = SimCluster(seed=1, options=SimOptions(node_count=3))
    leader = cluster.wait_for_leader()
    cluster.isolate(leader)
    cluster.put("k", "v")          # runs virtual time until the write is acknowledged
    cluster.heal()
    assert cluster.get("k") == "v"
    assert cluster.check_linearizable().ok
"""

from quorumlog.testing.sim.application import KV_APPLICATION, SimApplication
from quorumlog.testing.sim.checks import InvariantViolation, SimulationError
from quorumlog.testing.sim.cluster import OperationTimeoutError, SimCluster, SimOptions
from quorumlog.testing.sim.nemesis import Nemesis, NemesisOptions
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.node import NodeOptions
from quorumlog.testing.sim.runner import RunSummary, SeedResult, plan_seed, run_seed, run_seeds
from quorumlog.testing.sim.trace import TraceRecorder
from quorumlog.testing.sim.workload import WorkloadOptions

__all__ = [
    "KV_APPLICATION",
    "InvariantViolation",
    "Nemesis",
    "NemesisOptions",
    "NetworkFaults",
    "NodeOptions",
    "OperationTimeoutError",
    "RunSummary",
    "SeedResult",
    "SimApplication",
    "SimCluster",
    "SimOptions",
    "SimulationError",
    "TraceRecorder",
    "WorkloadOptions",
    "plan_seed",
    "run_seed",
    "run_seeds",
]

"""Deterministic simulation of the sharded KV: a controller Raft group and shard Raft
groups on virtual time with seeded faults, running what ships — the Ready-loop host, the
controller and shard group services, the migrators and preferred leaders, composed as a
node composes them, and the sharded client's rules — with clients whose history is checked
for linearizability.

One seed reproduces a run exactly: `quorumlog sim shardkv --seeds N-N`.

    from quorumlog.testing.sim.shardkv.cluster import ShardCluster

    cluster = ShardCluster(seed=1)
    cluster.join(100, 101)
    cluster.put("k", "v")
    cluster.leave(100)
    assert cluster.get("k") == "v"
"""

from quorumlog.testing.sim.shardkv.cluster import ShardCluster, ShardSimOptions
from quorumlog.testing.sim.shardkv.runner import run_shardkv_seed, run_shardkv_seeds
from quorumlog.testing.sim.shardkv.scenarios import SCENARIOS

__all__ = ["SCENARIOS", "ShardCluster", "ShardSimOptions", "run_shardkv_seed", "run_shardkv_seeds"]

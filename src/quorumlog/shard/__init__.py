"""Sharded KV: the shard controller (configurations of shard → group), shard groups, routing.

The controller is its own Raft group whose state machine (`shard.controller`) keeps the
numbered history of configurations; `shard.balance` decides where shards go when groups join
or leave, and `shard.config` maps keys to shards.
"""

"""Deterministic simulation of Raft clusters: virtual time, a seeded faulty network and
disks, a replicated KV workload with a recorded history, invariants after every event.

One seed reproduces a whole run exactly: `quorumlog sim raft --seeds N-N --nodes K`.
"""

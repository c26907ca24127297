"""Streams: topics of partitions, each partition a Raft group whose log holds record batches.

In DLedger's words, the commit log *is* the Raft log: records are stored once, in the
partition's Raft log entries, and read back from there by offset.
"""

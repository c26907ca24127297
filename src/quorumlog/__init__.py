"""quorumlog: a replicated-log platform.

Segmented write-ahead log stores, Raft groups with DLedger-style replication, a
linearizable replicated KV, streams, ledgers and a Spark pipeline. See README.md.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

"""quorumlog: a replicated-log platform.

Segmented write-ahead log stores, Raft groups with DLedger-style replication, a
linearizable replicated KV, streams, ledgers and a Spark pipeline. See README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from quorumlog.kv.async_client import AsyncKVClient
    from quorumlog.kv.client import KVClient

__all__ = ["AsyncKVClient", "KVClient", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import quorumlog` (the CLI, the node) does not load the clients.
    if name == "KVClient":
        from quorumlog.kv.client import KVClient

        return KVClient
    if name == "AsyncKVClient":
        from quorumlog.kv.async_client import AsyncKVClient

        return AsyncKVClient
    raise AttributeError(f"module 'quorumlog' has no attribute {name!r}")

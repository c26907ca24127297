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
    from quorumlog.ledger.client import LedgerClient, LedgerEntry, LedgerInfo
    from quorumlog.shard.admin import ShardAdmin
    from quorumlog.shard.client import ShardedKVClient
    from quorumlog.stream.client_admin import Admin
    from quorumlog.stream.consumer import Consumer
    from quorumlog.stream.group_admin import GroupAdmin
    from quorumlog.stream.producer import Producer
    from quorumlog.tls.config import TLSConfig

__all__ = [
    "Admin",
    "AsyncKVClient",
    "Consumer",
    "GroupAdmin",
    "KVClient",
    "LedgerClient",
    "LedgerEntry",
    "LedgerInfo",
    "Producer",
    "ShardAdmin",
    "ShardedKVClient",
    "TLSConfig",
    "__version__",
]

_CLIENT_MODULES = {
    "Admin": "quorumlog.stream.client_admin",
    "Consumer": "quorumlog.stream.consumer",
    "GroupAdmin": "quorumlog.stream.group_admin",
    "LedgerClient": "quorumlog.ledger.client",
    "LedgerEntry": "quorumlog.ledger.client",
    "LedgerInfo": "quorumlog.ledger.client",
    "Producer": "quorumlog.stream.producer",
    "ShardAdmin": "quorumlog.shard.admin",
    "ShardedKVClient": "quorumlog.shard.client",
    "TLSConfig": "quorumlog.tls.config",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `import quorumlog` (the CLI, the node) does not load the clients.
    if name == "KVClient":
        from quorumlog.kv.client import KVClient

        return KVClient
    if name == "AsyncKVClient":
        from quorumlog.kv.async_client import AsyncKVClient

        return AsyncKVClient
    if name in _CLIENT_MODULES:
        import importlib

        return getattr(importlib.import_module(_CLIENT_MODULES[name]), name)
    raise AttributeError(f"module 'quorumlog' has no attribute {name!r}")

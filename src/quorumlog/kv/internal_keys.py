"""quorumlog's own path to its internal keys (those starting with "__", kv/reserved.py).

The node refuses writes, deletes and scans of internal keys unless the request is marked
`internal`; the user KV API never marks one. The services that keep their metadata in the
"kv" group (ledger metadata and bookie registrations, managed ledgers and their owners'
leases, topic descriptors and consumer offsets) reach it through `InternalKeys`, a view of
a `KVClient` whose every write and scan is so marked. With authentication on, a request
marked `internal` is one to allow only to the cluster's own identities.
"""

from __future__ import annotations

from typing import TypeVar

from quorumlog.kv.client import KVClient

Store = TypeVar("Store")


class InternalKeys:
    """The KV operations the metadata stores use, on `client`, reaching internal keys."""

    def __init__(self, client: KVClient) -> None:
        self.client = client

    def get(self, key: str, stale: bool = False) -> str | None:
        return self.client.get(key, stale)

    def put(self, key: str, value: str) -> None:
        self.client.write("put", key, value, None, internal=True)

    def delete(self, key: str) -> None:
        self.client.write("delete", key, None, None, internal=True)

    def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        """Set `key` to `new` if it holds `expected` now (None: missing / delete). True if set."""
        return self.client.write("cas", key, new, expected, internal=True).ok

    def scan_prefix(
        self, prefix: str, stale: bool = False, page_keys: int = 1000
    ) -> list[tuple[str, str]]:
        return self.client.scan_prefix(prefix, stale, page_keys, internal=True)


def internal_keys(kv: Store) -> InternalKeys | Store:
    """A `KVClient` as its `InternalKeys` view; any other store (a test's in-memory one,
    a view already) as it is."""
    return InternalKeys(kv) if isinstance(kv, KVClient) else kv


__all__ = ["InternalKeys", "internal_keys"]

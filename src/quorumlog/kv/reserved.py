"""Which keys of the replicated KV are internal: every key that starts with "__".

quorumlog keeps its own metadata in the "kv" group under "__" prefixes (`__topics/`,
`__offsets/`, `__ledgers/`, `__bookies/`, `__managed/`, `__owners/`, and any added later).
The user KV API (KVClient put/append/delete/cas, `quorumlog kv`) may not write, delete or
scan them, so a typo or a script cannot corrupt a topic or a ledger; reading one key by
its name stays allowed (it harms nothing and helps when debugging). The node enforces it
(node/kv_service.py); the services reach these keys through kv/internal_keys.py.
"""

from __future__ import annotations

RESERVED_KEY_PREFIX = "__"


def is_reserved_key(key: str) -> bool:
    return key.startswith(RESERVED_KEY_PREFIX)


__all__ = ["RESERVED_KEY_PREFIX", "is_reserved_key"]

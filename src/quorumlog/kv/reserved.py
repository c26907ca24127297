"""Which keys of the replicated KV are internal: every key that starts with "__".

quorumlog keeps its own metadata in the "kv" group under "__" prefixes (`__topics/`,
`__offsets/`, `__ledgers/`, `__bookies/`, `__managed/`, `__owners/`, and any added later).
The user KV API (KVClient put/append/delete/cas, `quorumlog kv`) may not write, delete or
scan them, so a typo or a script cannot corrupt a topic or a ledger; reading one key by
its name stays allowed (it harms nothing and helps when debugging). The node enforces it
(node/kv_service.py); the services reach these keys through kv/internal_keys.py.
"""

from __future__ import annotations

from quorumlog.codec import kv_v3, wire

RESERVED_KEY_PREFIX = "__"
RESERVED_RANGE_END = "_`"
"""The first key after every reserved key ("_" then the character after "_")."""
RANGE_END_ALL = "\x00"
"""A range end meaning "to the last key" (etcd's "\\0", as codec/kv_v3.py reads it)."""


def is_reserved_key(key: str) -> bool:
    return key.startswith(RESERVED_KEY_PREFIX)


def range_touches_reserved(start: str, end: str | None) -> bool:
    """Whether the range [start, end) (None: `start` alone; "\\0": every key from `start`)
    holds reserved keys. One key is a read by name, which stays allowed: False for it."""
    if end is None:
        return False
    if end == RANGE_END_ALL:
        return start < RESERVED_RANGE_END
    return start < RESERVED_RANGE_END and end > RESERVED_KEY_PREFIX


def user_ranges(start: str, end: str | None) -> list[tuple[str, str | None]]:
    """The range [start, end) without the reserved keys: at most two ranges, in key order
    (what a user's range or scan reads)."""
    if not range_touches_reserved(start, end):
        return [(start, end)]
    pieces: list[tuple[str, str | None]] = []
    if start < RESERVED_KEY_PREFIX:
        pieces.append((start, RESERVED_KEY_PREFIX))
    if end == RANGE_END_ALL:
        pieces.append((max(start, RESERVED_RANGE_END), RANGE_END_ALL))
    elif end is not None and end > RESERVED_RANGE_END:
        pieces.append((max(start, RESERVED_RANGE_END), end))
    return pieces


def v3_reserved_problem(payload: bytes | None) -> str | None:
    """Why a user's v3 write (a txn) may not run, or None: it puts or deletes a reserved
    key, or reads or deletes a range holding reserved keys. (A compare or a get of one
    key by its name is a read, allowed as for `get`.) Payloads that do not decode are the
    machine's to refuse."""
    if payload is None:
        return None
    try:
        command = kv_v3.decode_command(payload)
    except wire.DECODE_ERRORS:
        return None
    if not isinstance(command, kv_v3.Txn):
        return None
    for operation in (*command.success, *command.failure):
        if operation.kind in ("put", "delete") and operation.end is None:
            if is_reserved_key(operation.key):
                return (
                    f"cannot {operation.kind} {operation.key!r}: keys starting with "
                    f"{RESERVED_KEY_PREFIX!r} are internal to quorumlog"
                )
        elif range_touches_reserved(operation.key, operation.end):
            return (
                f"a {operation.kind} of a range from {operation.key!r} would reach keys "
                f"starting with {RESERVED_KEY_PREFIX!r}, which are internal to quorumlog: "
                f"range over the keys before {RESERVED_KEY_PREFIX!r} and after them apart"
            )
    return None


__all__ = [
    "RESERVED_KEY_PREFIX",
    "RESERVED_RANGE_END",
    "is_reserved_key",
    "range_touches_reserved",
    "user_ranges",
    "v3_reserved_problem",
]

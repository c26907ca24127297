"""One page of a v3 range read from an MVCC store, as the KV and the sharded KV answer it."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.kv_v3 import KeyValue
from quorumlog.kv.mvcc import MVCCStore, StoreFailure

RANGE_LIMIT_MAX = 10_000
"""Keys one range answer carries at most (the client pages past it, at one revision)."""


def range_answer(
    request: wire.KVRangeRequest,
    store: MVCCStore,
    ranges: Iterable[tuple[str, str | None]],
) -> wire.KVRangeResult:
    """The keys of `ranges` (in order, each [start, end)) at `request.revision` (0: now),
    at most the request's limit, with how many there are in all."""
    limit = RANGE_LIMIT_MAX if request.limit <= 0 else min(request.limit, RANGE_LIMIT_MAX)
    kvs: list[KeyValue] = []
    count = 0
    try:
        for start, end in ranges:
            piece, piece_count = store.range(start, end, max(limit - len(kvs), 1), request.revision)
            kvs += piece[: limit - len(kvs)]
            count += piece_count
    except StoreFailure as failure:
        return wire.KVRangeResult(
            request_id=request.request_id,
            kvs=[],
            more=False,
            count=0,
            revision=store.revision,
            failure=failure.failure,
        )
    more = count > len(kvs)
    if request.count_only:
        kvs = []
    elif request.keys_only:
        kvs = [msgspec.structs.replace(kv, value=b"") for kv in kvs]
    return wire.KVRangeResult(
        request_id=request.request_id, kvs=kvs, more=more, count=count, revision=store.revision
    )


__all__ = ["RANGE_LIMIT_MAX", "range_answer"]

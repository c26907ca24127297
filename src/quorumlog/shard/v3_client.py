"""The etcd v3-style calls of `ShardedKVClient` that a sharded KV can keep: ranges (within
a shard and across shards) with revisions, and watches of one shard.

    with ShardedKVClient(endpoints) as client:
        result = client.range("service/", prefix=True)  # every shard, merged by key
        result.kvs[0].mod_revision                       # in its own shard's revisions
        shard = client.shard_of("config/colour")
        with client.watch("config/colour") as events:    # one key: its shard
            for event in events:                          # WatchEvent("PUT" | "DELETE", kv)
                ...
        with client.watch("config/", prefix=True, shard=shard) as events:
            ...

Revisions are per shard: each shard counts its own writes (one revision per write), and
the count moves with the shard when it changes groups. A revision therefore means
something only together with its shard, which is why:

* `range` of one key, or with `shard=`, reads that one shard at one revision (`revision=`
  reads the past, as on the plain KV), page by page at the revision of the first page, so
  the answer is one snapshot of the shard;
* `range` of a range or prefix without `shard=` reads every shard, each at its own
  revision (each one snapshot of its shard, not one snapshot of the whole: a write to
  another shard meanwhile may or may not show), and merges them BY KEY: the keys come in
  key order, as from one store. `count` is the sum over the shards, `limit` applies to the
  merged keys, `revision` is 0 and `shard_revisions` holds each shard's. A past revision
  across shards is refused (ValueError): it would name a different moment in each shard;
* `watch` follows one shard: one key (its shard), or a range or prefix within the shard
  named by `shard=`. Events come in the shard's revision order with no gap across leader
  changes of the shard's group (each poll asks from the revision after the last one seen).

When the shard moves to another group, the watch follows it: the shard's revisions and
its history move with it (`shard.shard_store`), so the watch goes on at the new owner from
the revision after the last one it saw, however far behind it was, unless that revision
was compacted (`CompactedError`, as on the plain KV). Only a shard that arrived from a
build that left its history behind ends a watch from before its arrival, with
`ShardMovedError` (a `CompactedError`): read the keys again and watch from a fresh
revision.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

import msgspec

from quorumlog.codec import kv_v3, wire
from quorumlog.codec.kv_v3 import KeyValue
from quorumlog.errors import ShardMovedError
from quorumlog.kv.v3_client import (
    PolledWatch,
    gather_pages,
    next_revision_after,
    raise_failure,
    range_end,
)
from quorumlog.shard.shard_store import SHARD_MOVED

ResponseType = TypeVar("ResponseType")


class ShardedRangeResult(msgspec.Struct, frozen=True):
    """A range of the sharded KV: as the plain KV's `RangeResult`, and each shard's revision."""

    kvs: list[KeyValue]
    more: bool
    count: int
    revision: int
    """The revision read at, when one shard was read; 0 across shards (see
    `shard_revisions`)."""
    shard_revisions: dict[int, int]
    """Each shard read → the revision it was read at."""


def raise_shard_failure(failure: kv_v3.V3Failure) -> None:
    if failure.code == SHARD_MOVED:
        raise ShardMovedError(failure.message)
    raise_failure(failure)


class ShardedV3Operations(ABC):
    """Ranges and watches over a sharded client's routed calls. Mixed into
    ShardedKVClient."""

    @abstractmethod
    def routed(
        self,
        what: str,
        key: str,
        make_request: Callable[[int, str], wire.ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        at_leader: bool = True,
        shard: int | None = None,
    ) -> ResponseType: ...

    @abstractmethod
    def shard_count(self) -> int:
        """The cluster's shard count (fetching the configuration if none is cached)."""

    @abstractmethod
    def shard_of(self, key: str) -> int:
        """The shard `key` belongs to."""

    @abstractmethod
    def watch_client(self) -> ShardedV3Operations:
        """A client of its own for a watch (its long polls must not hold this one)."""

    @abstractmethod
    def close(self) -> None: ...

    # --- ranges ----------------------------------------------------------------------

    def range(
        self,
        key: str,
        end: str | None = None,
        prefix: bool = False,
        limit: int = 0,
        keys_only: bool = False,
        revision: int = 0,
        count_only: bool = False,
        stale: bool = False,
        shard: int | None = None,
    ) -> ShardedRangeResult:
        """The keys in [key, end) (None: `key` alone; "\\0": every key from `key`; or the
        keys starting with `key` if `prefix`), in key order, at most `limit` (0: all).
        Within one shard (one key, or `shard=`) at `revision` (0: now); across shards,
        merged by key, each shard now (see the module docstring). CompactedError if the
        revision was compacted."""
        wire_end = range_end(key, end, prefix)
        if wire_end is None:
            key_shard = self.shard_of(key)
            if shard is not None and shard != key_shard:
                raise ValueError(f"key {key!r} is in shard {key_shard}, not {shard}")
            shard = key_shard
        if shard is not None:
            kvs, count, at_revision = self.range_shard(
                shard, key, wire_end, limit, keys_only, count_only, revision, stale
            )
            more = count > len(kvs) and not count_only
            return ShardedRangeResult(kvs, more, count, at_revision, {shard: at_revision})
        if revision:
            raise ValueError(
                "revisions are per shard: a range at a past revision names its shard (shard=)"
            )
        pieces: list[list[KeyValue]] = []
        count = 0
        revisions: dict[int, int] = {}
        for index in range(self.shard_count()):
            kvs, shard_count, at_revision = self.range_shard(
                index, key, wire_end, limit, keys_only, count_only, 0, stale
            )
            pieces.append(kvs)
            count += shard_count
            revisions[index] = at_revision
        merged = list(heapq.merge(*pieces, key=lambda kv: kv.key))
        kvs = merged[:limit] if limit > 0 else merged
        return ShardedRangeResult(kvs, count > len(kvs) and not count_only, count, 0, revisions)

    def range_shard(
        self,
        shard: int,
        key: str,
        end: str | None,
        limit: int,
        keys_only: bool,
        count_only: bool,
        revision: int,
        stale: bool,
    ) -> tuple[list[KeyValue], int, int]:
        """One shard's keys in range, page by page at the revision of the first page;
        with how many there are in all and that revision."""
        return gather_pages(
            lambda start, page_limit, at: self.range_page(
                shard, start, end, page_limit, keys_only, count_only, at, stale
            ),
            key,
            end,
            limit,
            revision,
        )

    def range_page(
        self,
        shard: int,
        key: str,
        end: str | None,
        limit: int,
        keys_only: bool,
        count_only: bool,
        revision: int,
        stale: bool,
    ) -> wire.KVRangeResult:
        answer = self.routed(
            f"range {key!r} of shard {shard}",
            key,
            lambda request_id, group: wire.KVRangeRequest(
                request_id=request_id,
                key=key,
                end=end,
                limit=limit,
                keys_only=keys_only,
                count_only=count_only,
                revision=revision,
                stale=stale,
                group=group,
                shards=[shard],
            ),
            wire.KVRangeResult,
            side_effects=False,
            at_leader=not stale,
            shard=shard,
        )
        if answer.failure is not None:
            raise_shard_failure(answer.failure)
        return answer

    # --- watches ----------------------------------------------------------------------

    def watch_poll(
        self, shard: int, key: str, end: str | None, from_revision: int, wait_seconds: float
    ) -> wire.WatchPollResult:
        answer = self.routed(
            f"watch {key!r} of shard {shard}",
            key,
            lambda request_id, group: wire.WatchPoll(
                request_id=request_id,
                key=key,
                end=end,
                from_revision=from_revision,
                wait_ms=int(wait_seconds * 1000),
                group=group,
                shards=[shard],
            ),
            wire.WatchPollResult,
            side_effects=False,
            shard=shard,
        )
        if answer.failure is not None:
            raise_shard_failure(answer.failure)
        return answer

    def watch(
        self,
        key: str,
        prefix: bool = False,
        start_revision: int = 0,
        end: str | None = None,
        shard: int | None = None,
    ) -> ShardWatch:
        """Changes of `key` (or of the range or prefix in shard `shard`) from
        `start_revision` of that shard (0: from now), in revision order: a context manager
        and an iterator of WatchEvent. See the module docstring for moves."""
        wire_end = range_end(key, end, prefix)
        if wire_end is None:
            key_shard = self.shard_of(key)
            if shard is not None and shard != key_shard:
                raise ValueError(f"key {key!r} is in shard {key_shard}, not {shard}")
            shard = key_shard
        elif shard is None:
            raise ValueError(
                "a range or prefix spans every shard, and revisions are per shard: watch one "
                "shard of it (shard=, 0 .. shard count - 1)"
            )
        elif not 0 <= shard < self.shard_count():
            raise ValueError(f"shard {shard} is outside 0..{self.shard_count() - 1}")
        return ShardWatch(self.watch_client(), shard, key, wire_end, start_revision)


class ShardWatch(PolledWatch):
    """One watch of one shard, in the shard's revision order, asking whichever group serves
    the shard and whichever of its nodes leads."""

    def __init__(
        self,
        client: ShardedV3Operations,
        shard: int,
        key: str,
        end: str | None,
        start_revision: int,
    ) -> None:
        super().__init__(start_revision)
        self.client = client
        self.shard = shard
        self.key = key
        self.end = end

    def ask(self, from_revision: int, wait_seconds: float) -> wire.WatchPollResult:
        return self.client.watch_poll(self.shard, self.key, self.end, from_revision, wait_seconds)

    def close_client(self) -> None:
        self.client.close()


__all__ = [
    "ShardWatch",
    "ShardedRangeResult",
    "ShardedV3Operations",
    "next_revision_after",
    "raise_shard_failure",
]

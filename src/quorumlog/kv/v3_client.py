"""The etcd v3-style calls of `KVClient`: ranges, txns, leases, watches, compaction.

    with KVClient(endpoints) as client:
        lease = client.lease_grant(10)
        client.put("service/a", b"10.0.0.1", lease=lease)
        result = client.range("service/", prefix=True)
        ok = client.txn(
            [("create", "lock", "==", 0)],
            [("put", "lock", "me", lease)],
            [("get", "lock")],
        ).succeeded
        with client.watch("service/", prefix=True) as events:
            for event in events:  # WatchEvent("PUT" | "DELETE", kv)
                ...

Writes are `KVCommand`s with op "v3" in the client's session (a retry is applied at most
once); reads go through the leader's read barrier, as `get` does. A range bigger than one
answer is read page by page at the revision of the first page, so it is one snapshot.
"""

from __future__ import annotations

import collections
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

import msgspec

from quorumlog.codec import kv_v3, wire
from quorumlog.codec.kv_v3 import RANGE_END_ALL, KeyValue, WatchEvent
from quorumlog.errors import (
    ClientError,
    CompactedError,
    LeaseNotFoundError,
    RequestRejectedError,
    UnavailableError,
)
from quorumlog.kv.connection import ClientSession
from quorumlog.kv.requests import prefix_end, write_request

ResponseType = TypeVar("ResponseType")
CompareTuple = tuple[str, str, str, "bytes | str | int"]
"""("value" | "version" | "create" | "mod", key, "==" | "!=" | "<" | ">", operand)."""
OperationTuple = tuple[Any, ...]
"""("put", key, value[, lease]), ("delete", key[, end]) or ("get", key[, end])."""
WATCH_WAIT_SECONDS = 2.0
"""How long one watch poll is held on the leader while nothing changes."""


class RangeResult(msgspec.Struct, frozen=True):
    kvs: list[KeyValue]
    more: bool
    count: int
    revision: int


class TxnResult(msgspec.Struct, frozen=True):
    succeeded: bool
    responses: list[RangeResult | KeyValue | int | None]
    """Per operation of the branch run: a get's RangeResult, a delete's count, a put's
    key before (None unless asked for with `put(..., prev_kv=True)`)."""
    revision: int = 0


class LeaseTimeToLive(msgspec.Struct, frozen=True):
    lease_id: int
    ttl_seconds: int
    """Seconds left by the leader's clock; -1 if there is no such lease."""
    granted_ttl_seconds: int
    keys: list[str]


def as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def range_end(key: str, end: str | None, prefix: bool) -> str | None:
    """The `end` of a range as the wire carries it (etcd's: None one key, "\\0" all)."""
    if prefix:
        return prefix_end(key) if key else RANGE_END_ALL
    return end


def compare_from(compare: CompareTuple) -> kv_v3.Compare:
    target, key, operator, operand = compare
    if target not in ("value", "version", "create", "mod"):
        raise ValueError(f"unknown compare target {target!r}")
    if operator not in ("==", "!=", "<", ">"):
        raise ValueError(f"unknown compare operator {operator!r}")
    if target == "value":
        if isinstance(operand, int):
            raise ValueError("a value compare needs a str or bytes operand")
        return kv_v3.Compare(target, key, operator, as_bytes(operand))
    if not isinstance(operand, int):
        raise ValueError(f"a {target} compare needs an int operand")
    return kv_v3.Compare(target, key, operator, operand)


def operation_from(operation: OperationTuple) -> kv_v3.RequestOp:
    kind, key, *rest = operation
    if kind == "put":
        value, *lease = rest
        return kv_v3.RequestOp("put", key, value=as_bytes(value), lease=lease[0] if lease else 0)
    if kind in ("delete", "get"):
        return kv_v3.RequestOp(kind, key, end=rest[0] if rest else None)
    raise ValueError(f"unknown txn operation {kind!r}")


def raise_failure(failure: kv_v3.V3Failure) -> None:
    if failure.code == "compacted":
        raise CompactedError(failure.message)
    if failure.code == "lease_not_found":
        raise LeaseNotFoundError(failure.message)
    raise RequestRejectedError(failure.code, failure.message)


V3ResponseType = TypeVar("V3ResponseType", bound=kv_v3.V3Response)


def expect(response: kv_v3.V3Response, expected: type[V3ResponseType]) -> V3ResponseType:
    if not isinstance(response, expected):
        raise ClientError(f"expected {expected.__name__}, the node answered {response!r}")
    return response


def response_value(response: kv_v3.ResponseOp) -> RangeResult | KeyValue | int | None:
    if response.kind == "get":
        return RangeResult(response.kvs, response.more, response.count, 0)
    if response.kind == "delete":
        return response.deleted
    return response.prev_kvs[0] if response.prev_kvs else None


class V3Operations(ABC):
    """The v3 calls, over a client's `call` (request/answer with retries) and its session
    writes. Mixed into `KVClient`."""

    endpoints_for_watch: list[str]

    @abstractmethod
    def call(
        self,
        what: str,
        make_request: Callable[[int], wire.ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        retry_after_delivery: bool = True,
        at_leader: bool = True,
        endpoint: str | None = None,
    ) -> ResponseType: ...

    @abstractmethod
    def session_write(
        self,
        identity: tuple[str, str, str | None, str | None],
        send: Callable[[ClientSession, wire.KVCommand], wire.KVWriteResult],
        answered_by: Callable[[], str],
        payload: bytes | None = None,
    ) -> wire.KVCommandResult: ...

    @abstractmethod
    def answered_by(self) -> str: ...

    @abstractmethod
    def watch_client(self) -> V3Operations:
        """A client of its own for a watch (its long polls must not hold this one)."""

    @abstractmethod
    def close(self) -> None: ...

    # --- writes ------------------------------------------------------------------------

    def v3_write(self, command: kv_v3.V3Command, what: str) -> kv_v3.V3Response:
        payload = kv_v3.encode_command(command)
        # What makes a repeated call "the same call" (it then reuses its sequence after an
        # unknown outcome): the command's bytes, by digest.
        identity = (kv_v3.V3_OP, what, hashlib.sha256(payload).hexdigest(), None)

        def send(session: ClientSession, kv_command: wire.KVCommand) -> wire.KVWriteResult:
            return self.call(
                what,
                lambda request_id: write_request(session, [kv_command], request_id),
                wire.KVWriteResult,
                side_effects=True,
            )

        result = self.session_write(identity, send, self.answered_by, payload=payload)
        if result.payload is None:
            raise ClientError(f"{what}: the node answered without a v3 result")
        response = kv_v3.decode_response(result.payload)
        if isinstance(response, kv_v3.V3Failure):
            raise_failure(response)
        return response

    def put_v3(self, key: str, value: str | bytes, lease: int, prev_kv: bool) -> KeyValue | None:
        operation = kv_v3.RequestOp("put", key, value=as_bytes(value), lease=lease, prev_kv=prev_kv)
        response = self.v3_write(kv_v3.Txn([], [operation], []), f"put {key!r}")
        response = expect(response, kv_v3.TxnResponse)
        prev_kvs = response.responses[0].prev_kvs
        return prev_kvs[0] if prev_kvs else None

    def delete_range(self, key: str, end: str | None = None, prefix: bool = False) -> int:
        """Delete the keys in range (as in `range`); how many there were."""
        operation = kv_v3.RequestOp("delete", key, end=range_end(key, end, prefix))
        response = self.v3_write(kv_v3.Txn([], [operation], []), f"delete range {key!r}")
        response = expect(response, kv_v3.TxnResponse)
        return response.responses[0].deleted

    def txn(
        self,
        compare: list[CompareTuple],
        success: list[OperationTuple],
        failure: list[OperationTuple] | None = None,
    ) -> TxnResult:
        """If every compare holds, run `success`, else `failure`: atomically, one revision."""
        command = kv_v3.Txn(
            [compare_from(item) for item in compare],
            [operation_from(item) for item in success],
            [operation_from(item) for item in failure or []],
        )
        response = self.v3_write(command, "txn")
        response = expect(response, kv_v3.TxnResponse)
        responses = [response_value(item) for item in response.responses]
        return TxnResult(response.succeeded, responses, response.revision)

    def lease_grant(self, ttl_seconds: int) -> int:
        """A new lease of `ttl_seconds`; its id."""
        response = self.v3_write(kv_v3.LeaseGrant(ttl_seconds), f"grant lease {ttl_seconds}s")
        response = expect(response, kv_v3.LeaseResponse)
        return response.lease_id

    def lease_keepalive(self, lease_id: int) -> int:
        """Renew the lease for its whole TTL from now; the TTL. LeaseNotFoundError if gone."""
        response = self.v3_write(kv_v3.LeaseKeepAlive(lease_id), f"keep lease {lease_id}")
        response = expect(response, kv_v3.LeaseResponse)
        return response.ttl_seconds

    def lease_revoke(self, lease_id: int) -> None:
        """Drop the lease and delete its keys. LeaseNotFoundError if it is gone."""
        self.v3_write(kv_v3.LeaseRevoke(lease_id), f"revoke lease {lease_id}")

    def compact(self, revision: int) -> None:
        """Free the history up to `revision` (reads and watches before it then fail)."""
        self.v3_write(kv_v3.Compact(revision), f"compact {revision}")

    # --- reads ---------------------------------------------------------------------------

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
    ) -> RangeResult:
        """The keys in [key, end) (None: `key` alone; "\\0": every key from `key`; or the
        keys starting with `key` if `prefix`), in key order, at most `limit` (0: all), at
        `revision` (0: now). CompactedError if that revision was compacted."""
        wire_end = range_end(key, end, prefix)
        kvs, count, at_revision = gather_pages(
            lambda start, page_limit, at: self.range_page(
                start, wire_end, page_limit, keys_only, count_only, at, stale
            ),
            key,
            wire_end,
            limit,
            revision,
        )
        return RangeResult(
            kvs, more=count > len(kvs) and not count_only, count=count, revision=at_revision
        )

    def range_page(
        self,
        key: str,
        end: str | None,
        limit: int,
        keys_only: bool,
        count_only: bool,
        revision: int,
        stale: bool,
    ) -> wire.KVRangeResult:
        answer = self.call(
            f"range {key!r}",
            lambda request_id: wire.KVRangeRequest(
                request_id=request_id,
                key=key,
                end=end,
                limit=limit,
                keys_only=keys_only,
                count_only=count_only,
                revision=revision,
                stale=stale,
            ),
            wire.KVRangeResult,
            side_effects=False,
            at_leader=not stale,
        )
        if answer.failure is not None:
            raise_failure(answer.failure)
        return answer

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLive:
        answer = self.call(
            f"lease {lease_id} time to live",
            lambda request_id: wire.LeaseTimeToLiveRequest(
                request_id=request_id, lease_id=lease_id, keys=keys
            ),
            wire.LeaseTimeToLiveResult,
            side_effects=False,
        )
        return LeaseTimeToLive(
            answer.lease_id, answer.ttl_seconds, answer.granted_ttl_seconds, answer.keys
        )

    def watch_poll(
        self, key: str, end: str | None, from_revision: int, wait_seconds: float
    ) -> wire.WatchPollResult:
        answer = self.call(
            f"watch {key!r}",
            lambda request_id: wire.WatchPoll(
                request_id=request_id,
                key=key,
                end=end,
                from_revision=from_revision,
                wait_ms=int(wait_seconds * 1000),
            ),
            wire.WatchPollResult,
            side_effects=False,
        )
        if answer.failure is not None:
            raise_failure(answer.failure)
        return answer

    def watch(
        self,
        key: str,
        prefix: bool = False,
        start_revision: int = 0,
        end: str | None = None,
    ) -> Watch:
        """Changes of `key` (or the range, or the prefix) from `start_revision` (0: from
        now) in revision order: a context manager and an iterator of WatchEvent."""
        return Watch(self.watch_client(), key, range_end(key, end, prefix), start_revision)


def gather_pages(
    read_page: Callable[[str, int, int], wire.KVRangeResult],
    key: str,
    end: str | None,
    limit: int,
    revision: int,
) -> tuple[list[KeyValue], int, int]:
    """A range read page by page (`read_page(start, limit, revision)`), every page at the
    revision of the first, up to `limit` keys (0: all): the keys, how many there are in
    all, and that revision."""
    kvs: list[KeyValue] = []
    start, count, more, at_revision = key, -1, True, revision
    while more and (limit <= 0 or len(kvs) < limit):
        page = read_page(start, limit - len(kvs) if limit > 0 else 0, at_revision)
        if count < 0:
            count, at_revision = page.count, at_revision or page.revision
        kvs.extend(page.kvs)
        more = page.more
        if not page.kvs or end is None:
            break
        start = page.kvs[-1].key + "\x00"
    return kvs, count, at_revision


def next_revision_after(next_revision: int, answer: wire.WatchPollResult) -> int:
    """Where a watch's next poll starts after `answer`: after its last event, or, with
    none, after the revision it answered at (nothing in range changed up to it, nor, asking
    from "now", since the poll started)."""
    if answer.events:
        return answer.events[-1].kv.mod_revision + 1
    return max(next_revision, answer.revision + 1)


class PolledWatch(ABC):
    """A watch made of long polls: iterate it for events (it blocks until there are some);
    `close` ends it (the iteration then stops). Each event comes once, in revision order,
    with no gap: every poll asks from the revision after the last one seen. Subclasses say
    whom to ask (`ask`) and what to close (`close_client`)."""

    def __init__(self, start_revision: int) -> None:
        self.next_revision = start_revision
        """The first revision not yet seen (0: from now, until the first answer)."""
        self.buffered: collections.deque[WatchEvent] = collections.deque()
        self.closed = False

    @abstractmethod
    def ask(self, from_revision: int, wait_seconds: float) -> wire.WatchPollResult: ...

    @abstractmethod
    def close_client(self) -> None: ...

    def poll(self, wait_seconds: float = WATCH_WAIT_SECONDS) -> list[WatchEvent]:
        """One long poll: the events it brought (none if nothing changed in the wait)."""
        answer = self.ask(self.next_revision, wait_seconds)
        self.next_revision = next_revision_after(self.next_revision, answer)
        return answer.events

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while not self.buffered:
            if self.closed:
                raise StopIteration
            try:
                self.buffered.extend(self.poll())
            except UnavailableError:
                if self.closed:  # closed from another thread under a poll
                    raise StopIteration from None
                # Nobody answered for a whole client timeout (a leader change, a shard on
                # the move): a watch outlasts outages (as etcd's does) and asks again from
                # the same revision.
                continue
            except ClientError:
                if self.closed:
                    raise StopIteration from None
                raise
        return self.buffered.popleft()

    def close(self) -> None:
        self.closed = True
        self.close_client()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class Watch(PolledWatch):
    """One watch of a key or range, asking whichever node leads."""

    def __init__(
        self, client: V3Operations, key: str, end: str | None, start_revision: int
    ) -> None:
        super().__init__(start_revision)
        self.client = client
        self.key = key
        self.end = end

    def ask(self, from_revision: int, wait_seconds: float) -> wire.WatchPollResult:
        return self.client.watch_poll(self.key, self.end, from_revision, wait_seconds)

    def close_client(self) -> None:
        self.client.close()


__all__ = [
    "LeaseTimeToLive",
    "PolledWatch",
    "RangeResult",
    "TxnResult",
    "V3Operations",
    "Watch",
    "WatchEvent",
    "gather_pages",
    "next_revision_after",
]

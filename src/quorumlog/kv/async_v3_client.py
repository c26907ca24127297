"""The etcd v3-style calls of `AsyncKVClient` (the blocking ones are `kv.v3_client`, whose
request building and answer reading these share): ranges, txns, leases, watches, compact.

    async with AsyncKVClient(endpoints) as client:
        await client.put("service/a", b"10.0.0.1", lease=await client.lease_grant(10))
        result = await client.range("service/", prefix=True)
        async with client.watch("service/", prefix=True) as watch:
            async for event in watch:
                ...
"""

from __future__ import annotations

import collections
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from quorumlog.codec import kv_v3, wire
from quorumlog.codec.kv_v3 import KeyValue, WatchEvent
from quorumlog.errors import ClientError
from quorumlog.kv.v3_client import (
    CompareTuple,
    LeaseTimeToLive,
    OperationTuple,
    RangeResult,
    TxnResult,
    as_bytes,
    compare_from,
    expect,
    operation_from,
    raise_failure,
    range_end,
    response_value,
)

ResponseType = TypeVar("ResponseType")
WATCH_WAIT_FRACTION = 0.5
"""A watch poll is held at most this fraction of one attempt's timeout (a longer hold would
look like a lost answer)."""


class AsyncV3Operations(ABC):
    attempt_timeout_seconds: float

    @abstractmethod
    async def call(
        self,
        what: str,
        make_request: Callable[[int], wire.ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        retry_after_delivery: bool = True,
        at_leader: bool = True,
        endpoint: str | None = None,
        timeout_seconds: float | None = None,
    ) -> ResponseType: ...

    @abstractmethod
    async def write(
        self,
        op: str,
        key: str,
        value: str | None,
        expected: str | None,
        payload: bytes | None = None,
    ) -> wire.KVCommandResult: ...

    async def v3_write(self, command: kv_v3.V3Command, what: str) -> kv_v3.V3Response:
        payload = kv_v3.encode_command(command)
        # The digest names the call, so a retry after an unknown outcome reuses its sequence.
        digest = hashlib.sha256(payload).hexdigest()
        result = await self.write(kv_v3.V3_OP, what, digest, None, payload)
        if result.payload is None:
            raise ClientError(f"{what}: the node answered without a v3 result")
        response = kv_v3.decode_response(result.payload)
        if isinstance(response, kv_v3.V3Failure):
            raise_failure(response)
        return response

    async def put_v3(
        self, key: str, value: str | bytes, lease: int, prev_kv: bool
    ) -> KeyValue | None:
        operation = kv_v3.RequestOp("put", key, value=as_bytes(value), lease=lease, prev_kv=prev_kv)
        response = expect(
            await self.v3_write(kv_v3.Txn([], [operation], []), f"put {key!r}"), kv_v3.TxnResponse
        )
        prev_kvs = response.responses[0].prev_kvs
        return prev_kvs[0] if prev_kvs else None

    async def delete_range(self, key: str, end: str | None = None, prefix: bool = False) -> int:
        operation = kv_v3.RequestOp("delete", key, end=range_end(key, end, prefix))
        response = expect(
            await self.v3_write(kv_v3.Txn([], [operation], []), f"delete range {key!r}"),
            kv_v3.TxnResponse,
        )
        return response.responses[0].deleted

    async def txn(
        self,
        compare: list[CompareTuple],
        success: list[OperationTuple],
        failure: list[OperationTuple] | None = None,
    ) -> TxnResult:
        command = kv_v3.Txn(
            [compare_from(item) for item in compare],
            [operation_from(item) for item in success],
            [operation_from(item) for item in failure or []],
        )
        response = expect(await self.v3_write(command, "txn"), kv_v3.TxnResponse)
        responses = [response_value(item) for item in response.responses]
        return TxnResult(response.succeeded, responses, response.revision)

    async def lease_grant(self, ttl_seconds: int) -> int:
        response = await self.v3_write(kv_v3.LeaseGrant(ttl_seconds), "grant lease")
        return expect(response, kv_v3.LeaseResponse).lease_id

    async def lease_keepalive(self, lease_id: int) -> int:
        response = await self.v3_write(kv_v3.LeaseKeepAlive(lease_id), f"keep lease {lease_id}")
        return expect(response, kv_v3.LeaseResponse).ttl_seconds

    async def lease_revoke(self, lease_id: int) -> None:
        await self.v3_write(kv_v3.LeaseRevoke(lease_id), f"revoke lease {lease_id}")

    async def compact(self, revision: int) -> None:
        await self.v3_write(kv_v3.Compact(revision), f"compact {revision}")

    async def range(
        self,
        key: str,
        end: str | None = None,
        prefix: bool = False,
        limit: int = 0,
        keys_only: bool = False,
        revision: int = 0,
        count_only: bool = False,
    ) -> RangeResult:
        """As `KVClient.range`: page by page at the first page's revision."""
        wire_end = range_end(key, end, prefix)
        kvs: list[KeyValue] = []
        start, count, more, at_revision = key, -1, True, revision
        while more and (limit <= 0 or len(kvs) < limit):
            page = await self.call(
                f"range {start!r}",
                range_request(
                    start,
                    wire_end,
                    limit - len(kvs) if limit > 0 else 0,
                    keys_only,
                    count_only,
                    at_revision,
                ),
                wire.KVRangeResult,
                side_effects=False,
            )
            if page.failure is not None:
                raise_failure(page.failure)
            if count < 0:
                count, at_revision = page.count, at_revision or page.revision
            kvs.extend(page.kvs)
            more = page.more
            if not page.kvs or wire_end is None:
                break
            start = page.kvs[-1].key + "\x00"
        more = count > len(kvs) and not count_only
        return RangeResult(kvs, more=more, count=count, revision=at_revision)

    async def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLive:
        answer = await self.call(
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

    async def watch_poll(
        self, key: str, end: str | None, from_revision: int
    ) -> wire.WatchPollResult:
        wait_ms = int(self.attempt_timeout_seconds * WATCH_WAIT_FRACTION * 1000)
        answer = await self.call(
            f"watch {key!r}",
            lambda request_id: wire.WatchPoll(
                request_id=request_id,
                key=key,
                end=end,
                from_revision=from_revision,
                wait_ms=wait_ms,
            ),
            wire.WatchPollResult,
            side_effects=False,
        )
        if answer.failure is not None:
            raise_failure(answer.failure)
        return answer

    def watch(
        self, key: str, prefix: bool = False, start_revision: int = 0, end: str | None = None
    ) -> AsyncWatch:
        return AsyncWatch(self, key, range_end(key, end, prefix), start_revision)


def range_request(
    key: str, end: str | None, limit: int, keys_only: bool, count_only: bool, revision: int
) -> Callable[[int], wire.KVRangeRequest]:
    def make(request_id: int) -> wire.KVRangeRequest:
        return wire.KVRangeRequest(
            request_id=request_id,
            key=key,
            end=end,
            limit=limit,
            keys_only=keys_only,
            count_only=count_only,
            revision=revision,
        )

    return make


class AsyncWatch:
    """`async for event in watch`; `async with` closes it. Events come once, in revision
    order, with no gap (each poll asks from the revision after the last one seen)."""

    def __init__(
        self, client: AsyncV3Operations, key: str, end: str | None, start_revision: int
    ) -> None:
        self.client = client
        self.key = key
        self.end = end
        self.next_revision = start_revision
        self.buffered: collections.deque[WatchEvent] = collections.deque()
        self.closed = False

    async def poll(self) -> list[WatchEvent]:
        answer = await self.client.watch_poll(self.key, self.end, self.next_revision)
        if answer.events:
            self.next_revision = answer.events[-1].kv.mod_revision + 1
        else:
            self.next_revision = max(self.next_revision, answer.revision + 1)
        return answer.events

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self.buffered:
            if self.closed:
                raise StopAsyncIteration
            self.buffered.extend(await self.poll())
        return self.buffered.popleft()

    def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["AsyncV3Operations", "AsyncWatch"]

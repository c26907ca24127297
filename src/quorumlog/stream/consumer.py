"""Consumer: read committed records by offset, and keep consumer-group offsets in the cluster.

    from quorumlog import Consumer

    with Consumer(["127.0.0.1:2379"], group="billing") as consumer:
        records = consumer.read("events", 0, offset=0, max_records=1000)
        for record in consumer.poll("events"):
            ...
        consumer.commit_positions()

`read` asks one replica of the partition (the leader if known, else any: followers serve
what they have committed). A replica behind the leader may not have an offset yet that
the leader has; such a read is retried at the leader before it is called out of range.
An offset deleted by retention raises OffsetOutOfRangeError naming the first offset kept.

Group offsets live in the replicated KV under "__offsets/<group>/<topic>/<partition>"; an
offset committed is the next one to read (as Kafka counts).
"""

from __future__ import annotations

import asyncio
import time
from itertools import count

import msgspec

from quorumlog.codec.wire import ErrorCode, Fetch, FetchResult
from quorumlog.errors import ClientError, RequestRejectedError
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.stream.client_common import (
    BlockingClient,
    OffsetOutOfRangeError,
    StreamTransport,
    leader_status,
)
from quorumlog.stream.records import Record
from quorumlog.tls.config import TLSConfig

FETCH_BYTES_MAX_DEFAULT = 4 * 1024 * 1024
READ_RECORDS_MAX_DEFAULT = 10_000
POLL_INTERVAL_SECONDS = 0.01
"""How often poll(timeout_seconds=...) asks again while there is nothing new: nodes do not
hold fetches open (no long polling), so waiting means asking."""
OFFSETS_PREFIX = "__offsets/"
OFFSET_RESETS = ("earliest", "latest")


class FetchedRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`codec.wire.Record`'s layout, decoded without garbage-collector tracking: a fetch
    makes tens of thousands of these at once, and tracked ones cost more in collections
    than in decoding (measured). They hold no references back, so they form no cycles."""

    value: bytes
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: list[tuple[str, bytes]] = []


class FetchedRecordBatch(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """`codec.wire.RecordBatch`'s layout (a test checks the two decode alike)."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[FetchedRecord]


batch_decoder = msgspec.msgpack.Decoder(FetchedRecordBatch)


def offset_key(group: str, topic: str, partition: int) -> str:
    return f"{OFFSETS_PREFIX}{group}/{topic}/{partition}"


class Consumer(BlockingClient):
    """Reads records; with `group`, also commits and reads group offsets.

    `auto_offset_reset`: where poll() starts a partition with no committed offset (or whose
    position was deleted by retention): "earliest" or "latest". Thread-safe for `read`
    and the offset calls; `poll` keeps positions, so give each polling thread its own.
    """

    def __init__(
        self,
        endpoints: list[str],
        group: str | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes_max: int = FETCH_BYTES_MAX_DEFAULT,
        timeout: float = 10.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        attempt_timeout_seconds: float | None = None,
        read_from_followers: bool = False,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`read_from_followers`: let any replica answer reads (spreads load; a follower may
        trail the leader by a moment). By default the leader answers, as in Kafka, so a
        read sees every record a producer had acknowledged."""
        self.read_from_followers = read_from_followers
        if auto_offset_reset not in OFFSET_RESETS:
            raise ValueError(
                f"auto_offset_reset is one of {', '.join(OFFSET_RESETS)}, not {auto_offset_reset!r}"
            )
        if fetch_bytes_max < 1:
            raise ValueError(f"fetch_bytes_max must be positive, got {fetch_bytes_max}")
        if group is not None and (not group or "/" in group):
            raise ValueError(f"a group name is not empty and has no '/', got {group!r}")
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.fetch_bytes_max = fetch_bytes_max
        self.positions: dict[tuple[str, int], int] = {}
        """Where poll() reads next in each partition it has read."""
        self.next_poll_start = 0
        super().__init__(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            thread_name="quorumlog-consumer",
            user=user,
            password=password,
            tls=tls,
        )

    # --- reads --------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = READ_RECORDS_MAX_DEFAULT,
    ) -> list[Record]:
        """Up to `max_records` committed records from `offset` on; [] at the end.

        OffsetOutOfRangeError below the first retained offset or past the end."""
        check_read(offset, max_records)
        result = self.run(
            fetch(
                self.transport,
                topic,
                partition,
                offset,
                max_records,
                self.fetch_bytes_max,
                leader_only=not self.read_from_followers,
            )
        )
        return decode_records(topic, partition, offset, result, max_records)

    def begin_offset(self, topic: str, partition: int) -> int:
        """The first offset still retained."""
        return self.run(leader_status(self.transport, topic, partition)).begin_offset

    def end_offset(self, topic: str, partition: int) -> int:
        """One past the last committed offset (the high watermark), as the leader knows it."""
        return self.run(leader_status(self.transport, topic, partition)).end_offset

    def partitions(self, topic: str) -> list[int]:
        descriptor = self.run(self.transport.topic(topic))
        return list(range(len(descriptor.replicas)))

    # --- group offsets ------------------------------------------------------------------

    def commit(self, topic: str, partition: int, offset: int) -> None:
        """Store `offset` (the next one to read) as the group's offset of the partition."""
        group = self.require_group()
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self.run(self.transport.kv.put(offset_key(group, topic, partition), str(offset)))

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition, or None if it never committed."""
        group = self.require_group()
        text = self.run(self.transport.kv.get(offset_key(group, topic, partition)))
        if text is None:
            return None
        if not text.isdigit():
            raise ClientError(f"the committed offset of {topic}/{partition} is {text!r}")
        return int(text)

    def commit_positions(self, topic: str | None = None) -> None:
        """Commit where poll() stands in every partition it has read (of `topic`, if given)."""
        group = self.require_group()
        positions = [
            (key, position)
            for key, position in self.positions.items()
            if topic is None or key[0] == topic
        ]

        async def commit_all() -> None:
            await asyncio.gather(
                *(
                    self.transport.kv.put(offset_key(group, name, partition), str(position))
                    for (name, partition), position in positions
                )
            )

        self.run(commit_all())

    def require_group(self) -> str:
        if self.group is None:
            raise ClientError("this consumer has no group: pass group=... to Consumer")
        return self.group

    # --- poll ---------------------------------------------------------------------------

    def position(self, topic: str, partition: int) -> int:
        """Where poll() reads next: its position, else the committed offset, else the
        earliest or latest offset (`auto_offset_reset`)."""
        key = (topic, partition)
        position = self.positions.get(key)
        if position is None:
            committed = self.committed(topic, partition) if self.group is not None else None
            position = committed if committed is not None else self.reset_position(key)
            self.positions[key] = position
        return position

    def seek(self, topic: str, partition: int, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self.positions[(topic, partition)] = offset

    def reset_position(self, key: tuple[str, int]) -> int:
        topic, partition = key
        if self.auto_offset_reset == "earliest":
            return self.begin_offset(topic, partition)
        return self.end_offset(topic, partition)

    def poll(
        self,
        topic: str,
        partitions: list[int] | None = None,
        max_records: int = READ_RECORDS_MAX_DEFAULT,
        timeout_seconds: float = 0.0,
    ) -> list[Record]:
        """Up to `max_records` new records from the partitions (default: all), reading from
        each one's position and moving it past what is returned. Waits up to
        `timeout_seconds` for something new; [] if nothing came."""
        check_read(0, max_records)
        chosen = self.partitions(topic) if partitions is None else list(partitions)
        if not chosen:
            return []
        deadline = time.monotonic() + timeout_seconds
        while True:
            records = self.poll_once(topic, chosen, max_records)
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(POLL_INTERVAL_SECONDS)  # no long polling on the nodes: ask again soon

    def poll_once(self, topic: str, partitions: list[int], max_records: int) -> list[Record]:
        # Rotate the starting partition so one busy partition cannot starve the others.
        start = self.next_poll_start % len(partitions)
        self.next_poll_start += 1
        ordered = partitions[start:] + partitions[:start]
        records: list[Record] = []
        for partition in ordered:
            wanted = max_records - len(records)
            if wanted <= 0:
                break
            position = self.position(topic, partition)
            try:
                found = self.read(topic, partition, position, wanted)
            except OffsetOutOfRangeError as error:
                if position >= error.begin_offset:
                    raise
                # Retention deleted our position: start again where `auto_offset_reset` says.
                self.positions[(topic, partition)] = self.reset_position((topic, partition))
                continue
            if found:
                self.positions[(topic, partition)] = found[-1].offset + 1
                records.extend(found)
        return records


def check_read(offset: int, max_records: int) -> None:
    if offset < 0:
        raise ValueError(f"offset must not be negative, got {offset}")
    if max_records < 1:
        raise ValueError(f"max_records must be positive, got {max_records}")


async def fetch(
    transport: StreamTransport,
    topic: str,
    partition: int,
    offset: int,
    records_max: int,
    bytes_max: int,
    leader_only: bool = False,
) -> FetchResult:
    """Fetch from any replica (or only the leader); an out-of-range answer is checked with
    the leader."""

    def make_request(request_id: int) -> Fetch:
        return Fetch(
            request_id=request_id,
            topic=topic,
            partition=partition,
            offset=offset,
            records_max=records_max,
            bytes_max=bytes_max,
            leader_only=leader_only,
        )

    what = f"fetch of {topic!r} partition {partition} at {offset}"
    try:
        return await transport.partition_call(
            topic, partition, what, make_request, FetchResult, side_effects=False, at_leader=False
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.OUT_OF_RANGE.value:
            raise
    status = await leader_status(transport, topic, partition)
    leader = status.leader
    descriptor = await transport.topic(topic)
    leader_address = transport.address_of(descriptor, leader) if leader is not None else None
    if not status.begin_offset <= offset <= status.end_offset or leader_address is None:
        raise OffsetOutOfRangeError(
            topic, partition, offset, status.begin_offset, status.end_offset
        )
    # A follower behind the leader answered: the leader has the offset.
    try:
        return await transport.partition_call(
            topic,
            partition,
            what,
            make_request,
            FetchResult,
            side_effects=False,
            at_leader=False,
            fixed_endpoint=leader_address,
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.OUT_OF_RANGE.value:
            raise
        raise OffsetOutOfRangeError(
            topic, partition, offset, status.begin_offset, status.end_offset
        ) from None


def decode_records(
    topic: str, partition: int, offset: int, result: FetchResult, max_records: int
) -> list[Record]:
    """The records of the fetched batches from `offset` on, at most `max_records`.

    Per record only what the result needs is done: one msgspec decode of the batch, one
    Record built per record (the hot loop of a consumer)."""
    records: list[Record] = []
    for fetched in result.batches:
        wanted = max_records - len(records)
        if wanted <= 0:
            break
        batch = batch_decoder.decode(fetched.data)
        skip = max(offset - fetched.base_offset, 0)
        items = batch.records[skip : skip + wanted]
        stamp = batch.timestamp_ms
        records += [
            Record(
                topic,
                partition,
                record_offset,
                item.key,
                item.value,
                item.timestamp_ms or stamp,
                item.headers,
            )
            for record_offset, item in zip(count(fetched.base_offset + skip), items)
        ]
    return records


__all__ = ["Consumer", "offset_key"]

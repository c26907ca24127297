"""The few requests the Spark source and sink send, through the stream clients' transport.

`StreamTransport` (shared with Admin, Producer and Consumer) already routes a request to
a partition's replicas, follows NOT_LEADER hints, retries a replica that does not host a
new partition yet, checks a topic missing from a stale list with a linearizable read, and
tells "unavailable" from "unknown outcome". The Spark side uses it at the wire level: a
Fetch answer stays as encoded record batches until `arrow.py` turns them into columns
(no per-record client objects), and the sink sends its own Produce requests so that it,
not a background batcher, decides where requests are cut (see `sink.py`).

One `ClusterAccess` (one I/O thread) lives in one Python process: the driver's planner,
or one executor task; it is closed when that work ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from quorumlog.codec import wire
from quorumlog.errors import ClientError, UnavailableError
from quorumlog.spark.errors import OptionError
from quorumlog.spark.offsets import PartitionBounds, TopicPartition
from quorumlog.spark.options import ConnectionOptions
from quorumlog.spark.topic_selection import TopicSelection
from quorumlog.stream.client_common import BlockingClient, TopicNotFoundError, leader_status
from quorumlog.stream.consumer import fetch
from quorumlog.stream.offsets_for_times import offset_for_time

BOUNDS_CONCURRENCY_MAX = 64
"""Partition status requests in flight at once while planning."""

ResultType = TypeVar("ResultType")


async def gather_bounded(
    coroutines: list[Coroutine[Any, Any, ResultType]], concurrency_max: int
) -> list[ResultType]:
    """The coroutines' results in order, at most `concurrency_max` running at once. The
    first error is raised as it is (not in an ExceptionGroup: callers catch the typed
    errors) and the rest are cancelled."""
    limit = asyncio.Semaphore(concurrency_max)

    async def bounded(coroutine: Coroutine[Any, Any, ResultType]) -> ResultType:
        async with limit:
            return await coroutine

    tasks = [asyncio.ensure_future(bounded(coroutine)) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


class ClusterAccess(BlockingClient):
    """Blocking access to one cluster; see the module docstring."""

    def __init__(self, connection: ConnectionOptions, client_name: str = "spark") -> None:
        super().__init__(
            list(connection.endpoints),
            timeout=connection.timeout_seconds,
            cluster_id=connection.cluster_id,
            thread_name=f"quorumlog-{client_name}",
            user=connection.user,
            password=connection.password,
            tls=connection.tls,
        )
        self.connection = connection

    def unreachable(self, error: ClientError) -> OptionError:
        return OptionError(
            "endpoints",
            f"no node of cluster {self.connection.cluster_id!r} answered at "
            f"{','.join(self.connection.endpoints)} ({error})",
        )

    def check_reachable(self) -> None:
        """OptionError naming `endpoints` unless some node answers a status request."""
        try:
            self.run(self.transport.kv.status())
        except UnavailableError as error:
            raise self.unreachable(error) from None

    # --- topics -----------------------------------------------------------------------

    def list_topics(self) -> dict[str, wire.TopicDescriptor]:
        """Every topic, as the metadata leader lists it; OptionError naming `endpoints`
        when no node answers."""
        try:
            return dict(self.run(self.transport.refresh_topics(fresh=True)))
        except UnavailableError as error:
            raise self.unreachable(error) from None

    def describe_topics(self, topics: list[str], option: str) -> dict[str, wire.TopicDescriptor]:
        """The named topics; OptionError naming `option` if one does not exist."""
        known = self.list_topics()
        described: dict[str, wire.TopicDescriptor] = {}
        missing: list[str] = []
        for topic in topics:
            try:
                # A miss in the list is checked linearizably (a topic created a moment ago).
                described[topic] = known.get(topic) or self.run(self.transport.topic(topic))
            except TopicNotFoundError:
                missing.append(topic)
        if missing:
            existing = ", ".join(sorted(known)) or "none"
            raise OptionError(
                option, f"no topic named {', '.join(missing)} (existing topics: {existing})"
            )
        return described

    def topic_partitions(self, topics: list[str], option: str) -> list[TopicPartition]:
        described = self.describe_topics(topics, option)
        return [
            (topic, partition)
            for topic in topics
            for partition in range(described[topic].settings.partitions)
        ]

    def selected_partitions(self, selection: TopicSelection) -> list[TopicPartition]:
        """The partitions `selection` reads now, sorted; OptionError naming its option for
        a topic (or assigned partition) that does not exist. A pattern that matches no
        topic selects nothing, as in Kafka (a stream waits for one to appear)."""
        if selection.pattern is not None:
            listed = self.list_topics()
            return sorted(
                (topic, partition)
                for topic, descriptor in listed.items()
                if selection.matches(topic)
                for partition in range(descriptor.settings.partitions)
            )
        described = self.describe_topics(selection.topics, selection.option)
        if not selection.assigned:
            return sorted(
                (topic, partition)
                for topic in selection.topics
                for partition in range(described[topic].settings.partitions)
            )
        missing = [
            f"{topic}/{partition}"
            for topic, partition in selection.assigned
            if partition >= described[topic].settings.partitions
        ]
        if missing:
            raise OptionError(selection.option, f"no such partitions: {', '.join(missing)}")
        return list(selection.assigned)

    # --- partitions ---------------------------------------------------------------------

    def bounds(self, topic_partition: TopicPartition) -> PartitionBounds:
        """[begin, end) as the partition's leader sees it (a replica's if the leader cannot
        be reached: never past the committed high watermark either way)."""
        return self.bounds_of([topic_partition])[topic_partition]

    def bounds_of(
        self, topic_partitions: list[TopicPartition]
    ) -> dict[TopicPartition, PartitionBounds]:
        """`bounds` of every partition, asked concurrently (a topic of a thousand
        partitions is planned in a few round trips, not a thousand)."""
        statuses = self.run(
            gather_bounded(
                [
                    leader_status(self.transport, topic, partition)
                    for topic, partition in topic_partitions
                ],
                BOUNDS_CONCURRENCY_MAX,
            )
        )
        return {
            key: PartitionBounds(status.begin_offset, status.end_offset)
            for key, status in zip(topic_partitions, statuses, strict=True)
        }

    def offsets_for_times(
        self,
        times_ms: dict[TopicPartition, int],
        bounds: dict[TopicPartition, PartitionBounds],
    ) -> dict[TopicPartition, int | None]:
        """For each partition, the earliest offset whose record time is at or after its
        time (None: every record is older); partitions searched concurrently."""
        keys = sorted(times_ms)
        found = self.run(
            gather_bounded(
                [
                    offset_for_time(
                        self.transport,
                        topic,
                        partition,
                        times_ms[(topic, partition)],
                        (bounds[(topic, partition)].begin, bounds[(topic, partition)].end),
                    )
                    for topic, partition in keys
                ],
                BOUNDS_CONCURRENCY_MAX,
            )
        )
        return dict(zip(keys, found, strict=True))

    def fetch(
        self, topic_partition: TopicPartition, offset: int, records_max: int, bytes_max: int
    ) -> wire.FetchResult:
        """Committed batches from `offset`; OffsetOutOfRangeError outside [begin, end]."""
        return self.fetch_soon(topic_partition, offset, records_max, bytes_max).result()

    def fetch_soon(
        self, topic_partition: TopicPartition, offset: int, records_max: int, bytes_max: int
    ) -> Future[wire.FetchResult]:
        """`fetch`, started on the I/O thread: the caller works while the answer comes
        (the future's result raises what `fetch` raises; its own deadlines bound it)."""
        if self.closed:
            raise ClientError("the client is closed")
        topic, partition = topic_partition
        return self.io.submit(
            fetch(self.transport, topic, partition, offset, records_max, bytes_max)
        )

    def produce(
        self,
        topic_partition: TopicPartition,
        producer_id: str,
        base_sequence: int,
        records: list[wire.Record],
    ) -> wire.ProduceResult:
        """Append `records` at the leader; the same (producer id, base sequence) again is
        deduplicated by the partition, so retrying is safe."""
        topic, partition = topic_partition
        return self.run(
            self.transport.partition_call(
                topic,
                partition,
                f"produce {len(records)} records to {topic}/{partition}",
                lambda request_id: wire.Produce(
                    request_id=request_id,
                    topic=topic,
                    partition=partition,
                    producer_id=producer_id,
                    base_sequence=base_sequence,
                    records=records,
                ),
                wire.ProduceResult,
                side_effects=True,
                at_leader=True,
            )
        )

    # --- the KV table -------------------------------------------------------------------

    def scan(self, start: str, end: str | None, limit: int, stale: bool) -> wire.KVScanResult:
        return self.run(
            self.transport.kv.call(
                f"scan from {start!r}",
                lambda request_id: wire.KVScan(
                    request_id=request_id, start=start, end=end, limit=limit, stale=stale
                ),
                wire.KVScanResult,
                side_effects=False,
                at_leader=not stale,
            )
        )

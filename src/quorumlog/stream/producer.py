"""Producer: batched, idempotent writes of records to topic partitions.

    from quorumlog import Producer

    with Producer(["127.0.0.1:2379"]) as producer:
        future = producer.send("events", b"hello", key=b"user-7")
        future.result().offset  # once the record is committed

How it works:

- `send` only appends the record to its partition's queue (under one lock) and returns a
  `concurrent.futures.Future`. The partition is the caller's, else crc32c(key) % P, else
  a sticky partition for unkeyed records that moves on with every batch taken.
- An asyncio loop in a background thread runs one sender per partition. A sender waits
  until its queue holds a full batch (`batch_records_max` / `batch_bytes_max`) or its
  oldest record has waited `linger_ms`, takes one batch, and sends it to the partition's
  leader; one batch per partition is in flight at a time, so batches land in order.
- Many partitions (Kafka's per-broker drain): the batches of one loop turn bound for one
  node leave in one ProduceMany frame, each part answered on its own (a NOT_LEADER for
  one part re-routes that part only). The producer learns every partition's leader with
  the topic listing (ListTopics.with_leaders), so first sends go to leaders. A produce
  attempt waits for a node that keeps answering on its connection until the delivery
  timeout, and gives a silent one `ATTEMPT_TIMEOUT_SECONDS_DEFAULT` (unless
  `attempt_timeout_seconds` is given): giving up on a busy node dropped its connection
  and sent every batch in flight on it again.
- What a batch costs besides its records (at a thousand partitions a batch holds a few
  dozen): its first attempt goes straight to the known leader's open connection
  (`produce_first_attempt`), the general retry path taking over only when that attempt
  is not answered with a result; the loop takes the producer's lock once a batch, and
  releases buffer room without it (waking blocked senders and flushes once a loop turn);
  a send wakes a partition's sender only while that sender waits; a batch's futures are
  settled in one pass; nothing a batch allocates forms a reference cycle.
- Idempotence: each partition numbers records from 0 (the sequence); a batch carries its
  first record's sequence. A batch is retried (at whichever node leads now) with the SAME
  base sequence until the partition answers, and the partition answers a batch it has
  already applied with the original offsets, so a retry after a leader change never
  writes a record twice.
- A batch unanswered for `delivery_timeout_seconds` fails its futures with
  UnknownOutcomeError, but stays at the head of its partition and is still retried (with
  no one waiting on it): until the partition answers for it, the next batch's sequence
  cannot be known. Records queued behind it meanwhile fail with UnavailableError once they
  waited that long, never having been sent.
- Deterministic batches (for a caller with a fixed `producer_id` that may replay the same
  records after a crash, such as Spark's exactly-once sink): with `linger_ms=math.inf` a
  batch leaves only when full (`batch_records_max`, or `batch_bytes_max` by record sizes)
  or at flush(), so the same sends and flushes make the same batches, and a replay by a
  new Producer with the same id is answered with the original offsets (the partition
  dedups a batch only if its base sequence and record count match).
- Bounds: at most `buffer_bytes_max` of records are waiting or in flight; `send` blocks
  for room up to `max_block_seconds`, then raises BufferFullError.
- Kafka's choices: `key_serializer`/`value_serializer` turn what `send` is given into
  bytes; `value=None` is a tombstone (a record without a value, which compacting readers
  take as a delete); `RecordMetadata.timestamp` is the record's own stamp, else the
  leader's. `acks`: "all" (the default, and -1) waits for the partition's acknowledgement
  as its storage defines it (a raft partition's majority, a ledger topic's ack quorum,
  an HA topic's in-sync replicas); 0 completes each future as soon as its batch is
  handed to the sender, with offset -1, and reports no failure (the batch is still sent,
  and retried, idempotently). acks=1 (the leader alone) is not offered: no storage here
  acknowledges a write that its quorum may still lose. `compression` ("none", "zstd" or
  "lz4") compresses each batch once, on its first send, on every storage mode (the log,
  the ledger entry or the HA commit log keeps the compressed bytes; readers decompress).

Futures complete on the producer's I/O thread: keep their callbacks short.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, cast

import msgspec

from quorumlog.codec.compression import CODECS, NONE, compress
from quorumlog.codec.wire import ErrorCode, Produce, ProduceResult
from quorumlog.codec.wire import Record as WireRecord
from quorumlog.errors import (
    ClientError,
    RequestRejectedError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.stream.client_common import BlockingClient, partition_for_key
from quorumlog.stream.produce_first_attempt import produce_at_known_leader
from quorumlog.stream.record_futures import RecordFuture, resolve_all, resolve_batch
from quorumlog.stream.records import RecordMetadata
from quorumlog.tls.config import TLSConfig

LINGER_MS_DEFAULT = 5.0
BATCH_RECORDS_MAX_DEFAULT = 16_384
BATCH_BYTES_MAX_DEFAULT = 1024 * 1024
BUFFER_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
DELIVERY_TIMEOUT_SECONDS_DEFAULT = 30.0
MAX_BLOCK_SECONDS_DEFAULT = 60.0
RECORD_OVERHEAD_BYTES = 16
"""What a record costs besides its key, value and headers (framing, timestamp), roughly."""
ACKS_ALL = "all"
records_encoder = msgspec.msgpack.Encoder()
"""Encodes a batch's records for compression (the layout of RecordBatch.records)."""
RESEND_BACKOFF_SECONDS = 0.05
"""Pause before resending a batch whose previous round of attempts timed out."""
ATTEMPT_TIMEOUT_SECONDS_DEFAULT = 5.0
"""Unless `attempt_timeout_seconds` is given: how long a produce attempt waits for a node
that says nothing at all (to connect, or on a silent connection; a node answering others
is waited for until the delivery timeout). The other clients' 1 s is too short here: a
node busy with a thousand partitions on a loaded machine is silent for over a second, and
each give-up drops the connection, failing every batch in flight on it, each then sent
again (measured at 1,000 partitions, load 21: 41,351 lost attempts for 901 produce
answers). Kafka waits 30 s (request.timeout.ms)."""

Headers = Mapping[str, bytes] | Iterable[tuple[str, bytes]]
NO_HEADERS = cast(list[tuple[str, bytes]], ())
"""What a record without headers carries: an empty tuple, which encodes as the empty list
does, but leaves the record untracked by the garbage collector (a list would not; records
wait in queues by the hundred thousand). Never mutated: records are only encoded."""


class BufferFullError(ClientError):
    """send() waited `max_block_seconds` for buffer room and found none."""


class ProducerClosedError(ClientError):
    """The producer was closed before the record could be sent."""


class Batch:
    """Records taken from a partition queue, sent together with one base sequence."""

    __slots__ = (
        "base_sequence",
        "buffered_bytes",
        "compressed",
        "futures",
        "producer_id",
        "records",
    )

    def __init__(
        self,
        records: list[WireRecord],
        futures: list[RecordFuture],
        buffered_bytes: int,
    ) -> None:
        self.records = records
        self.futures = futures
        self.buffered_bytes = buffered_bytes
        self.producer_id = ""
        self.base_sequence = -1
        """Assigned when the batch is first sent, and kept for every retry."""
        self.compressed: bytes | None = None
        """The records compressed (once, on the first send), when the producer compresses."""


class ProduceRequests:
    """Makes a batch's Produce request for each attempt (and names it for errors).

    One object, not closures: two closures over a batch were seven objects for the
    garbage collector to walk while the batch is in flight, a thousand batches at a time
    at a thousand partitions."""

    __slots__ = ("batch", "codec", "partition", "topic")

    def __init__(self, queue: PartitionQueue, batch: Batch, codec: str) -> None:
        self.topic = queue.topic
        self.partition = queue.partition
        self.batch = batch
        self.codec = codec

    def __call__(self, request_id: int) -> Produce:
        batch = self.batch
        compressed = batch.compressed if self.codec != NONE else None
        return Produce(
            request_id=request_id,
            topic=self.topic,
            partition=self.partition,
            producer_id=batch.producer_id,
            base_sequence=batch.base_sequence,
            records=[] if compressed is not None else batch.records,
            compression=self.codec,
            compressed=compressed or b"",
            record_count=len(batch.records) if compressed is not None else 0,
        )

    def what(self) -> str:
        count = len(self.batch.records)
        return f"produce of {count} records to {self.topic!r} partition {self.partition}"


class PartitionQueue:
    """One partition's records waiting to be batched, and its sequence state.

    The record lists and counters are guarded by the producer's lock; the sequence state
    and `signal` belong to the I/O loop."""

    def __init__(self, topic: str, partition: int, producer_id: str) -> None:
        self.topic = topic
        self.partition = partition
        self.records: list[WireRecord] = []
        self.futures: list[RecordFuture] = []
        self.buffered_bytes = 0
        self.first_record_seconds = 0.0
        """time.monotonic() when the oldest queued record arrived."""
        self.full_signalled = False
        self.sender_waiting = True
        """The loop's sender of this partition waits on `signal` (for a first record, a
        full batch or the end of a linger): only then does a send wake it. A sender with
        a batch in flight looks at the queue when the partition answers; waking it for
        every batch cost a thread-safe call (and a loop wake-up) per batch."""
        self.accepted_count = 0
        self.completed_count = 0
        """Written by the I/O loop only (read by flush under the lock)."""
        # Loop side.
        self.producer_id = producer_id
        self.epoch = 0
        self.next_sequence = 0
        self.signal: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.in_flight: Batch | None = None


class Producer(BlockingClient):
    """Batched, idempotent producer. See the module docstring.

    Thread-safe: many threads may call `send` on one producer.
    """

    def __init__(
        self,
        endpoints: list[str],
        producer_id: str | None = None,
        linger_ms: float = LINGER_MS_DEFAULT,
        batch_records_max: int = BATCH_RECORDS_MAX_DEFAULT,
        batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
        buffer_bytes_max: int = BUFFER_BYTES_MAX_DEFAULT,
        delivery_timeout_seconds: float = DELIVERY_TIMEOUT_SECONDS_DEFAULT,
        max_block_seconds: float = MAX_BLOCK_SECONDS_DEFAULT,
        timeout: float = 10.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        attempt_timeout_seconds: float | None = None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
        key_serializer: Callable[[Any], bytes] | None = None,
        value_serializer: Callable[[Any], bytes] | None = None,
        acks: int | str = ACKS_ALL,
        compression: str = NONE,
    ) -> None:
        self.acks_wait = check_acks(acks)
        if compression not in CODECS:
            raise ValueError(f"compression is one of {', '.join(CODECS)}, not {compression!r}")
        self.compression = compression
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        check_producer_settings(
            linger_ms, batch_records_max, batch_bytes_max, buffer_bytes_max, max_block_seconds
        )
        if not delivery_timeout_seconds > 0:
            raise ValueError(
                f"delivery_timeout_seconds must be positive, got {delivery_timeout_seconds}"
            )
        if producer_id is not None and not producer_id:
            raise ValueError("producer_id must not be empty")
        self.producer_id = producer_id or uuid.uuid4().hex
        self.linger_seconds = linger_ms / 1000
        self.batch_records_max = batch_records_max
        self.batch_bytes_max = batch_bytes_max
        self.buffer_bytes_max = buffer_bytes_max
        self.delivery_timeout_seconds = delivery_timeout_seconds
        self.max_block_seconds = max_block_seconds
        self.lock = threading.Lock()
        """Guards the partition queues and buffer counts (`with self.lock` on the send path:
        entering the Condition built on it costs a Python call more)."""
        self.condition = threading.Condition(self.lock)
        self.futures_condition = threading.Condition()
        """Shared by every RecordFuture of this producer (reentrant, as a Future's is)."""
        self.queues: dict[tuple[str, int], PartitionQueue] = {}
        self.partition_counts: dict[str, int] = {}
        self.sticky_partitions: dict[str, int] = {}
        self.accepted_bytes = 0
        """Bytes of records ever accepted (under the lock)."""
        self.released_bytes = 0
        """Bytes of records ever acknowledged or failed: written by the I/O loop only, so it
        releases room without the lock (which the sending thread holds for every send)."""
        self.room_waiters = 0
        """Senders blocked for buffer room (under the lock)."""
        self.flush_requests = 0
        self.notify_scheduled = False
        """A wake-up of the threads waiting on `condition` is due this loop turn (loop only)."""
        self.closing = False
        self.random = random.Random()
        self.produce_attempt_timeout_seconds = (
            ATTEMPT_TIMEOUT_SECONDS_DEFAULT
            if attempt_timeout_seconds is None
            else attempt_timeout_seconds
        )
        """A produce attempt's (metadata requests keep the clients' default)."""
        self.batches_sent = 0
        """Produce requests answered, retries not counted (for tests and figures)."""
        super().__init__(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            client_id=self.producer_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            thread_name="quorumlog-producer",
            user=user,
            password=password,
            tls=tls,
        )
        self.transport.leaders_wanted = True

    # --- the caller's side --------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; the future gives its RecordMetadata once it is committed.

        Raises at once for bad arguments, an unknown topic or partition, a closed producer,
        or BufferFullError; every failure after that is reported through the future.
        """
        if self.closing:
            raise ProducerClosedError("the producer is closed")
        if self.value_serializer is not None and value is not None:
            value = self.value_serializer(value)
        if self.key_serializer is not None and key is not None:
            key = self.key_serializer(key)
        # Each test once, the common case (bytes value, no headers) first: this runs per
        # record, and every branch and loop over nothing costs tens of nanoseconds.
        if value is None:
            size = RECORD_OVERHEAD_BYTES
        else:
            if value.__class__ is not bytes:
                value = as_bytes(value, "value")
            size = len(value) + RECORD_OVERHEAD_BYTES
        if key is not None:
            if key.__class__ is not bytes:
                key = as_bytes(key, "key")
            size += len(key)
        if headers:
            header_list = check_headers(headers)
            for name, header_value in header_list:
                size += len(name) + len(header_value)
        else:
            header_list = NO_HEADERS
        record = WireRecord(value, key, timestamp_ms or 0, header_list)
        if partition is not None or key is not None:
            partition = self.choose_partition(topic, key, partition)
        else:
            partition = self.sticky_partitions.get(topic)  # None until the first choice
            if partition is None:
                partition = self.choose_partition(topic, None, None)
        future = RecordFuture(self.futures_condition)
        self.enqueue(topic, partition, record, future, size)
        return future

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        count = self.partition_counts.get(topic)
        if count is None:
            count = self.partition_count(topic)
        if partition is not None:
            if not 0 <= partition < count:
                raise ValueError(
                    f"topic {topic!r} has partitions 0 to {count - 1}, not {partition}"
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        sticky = self.sticky_partitions.get(topic)
        if sticky is None:
            sticky = self.sticky_partitions[topic] = self.random.randrange(count)
        return sticky

    def partition_count(self, topic: str) -> int:
        """The topic's partition count, asking the cluster when it is not cached."""
        descriptor = self.run(self.transport.topic(topic))
        count = len(descriptor.replicas)
        self.partition_counts[topic] = count
        return count

    def enqueue(
        self,
        topic: str,
        partition: int,
        record: WireRecord,
        future: RecordFuture,
        size: int,
    ) -> None:
        with self.lock:
            buffered_bytes = self.accepted_bytes - self.released_bytes
            if buffered_bytes + size > self.buffer_bytes_max and buffered_bytes:
                self.wait_for_room(size)
            queue = self.queues.get((topic, partition))
            if queue is None:
                queue = PartitionQueue(topic, partition, self.producer_id)
                self.queues[(topic, partition)] = queue
            records = queue.records
            was_empty = not records
            if was_empty:
                queue.first_record_seconds = time.monotonic()
            records.append(record)
            queue.futures.append(future)
            queue_bytes = queue.buffered_bytes = queue.buffered_bytes + size
            queue.accepted_count += 1
            self.accepted_bytes += size
            now_full = not queue.full_signalled and (
                len(records) >= self.batch_records_max or queue_bytes >= self.batch_bytes_max
            )
            if now_full:
                queue.full_signalled = True
            wake = queue.sender_waiting and (was_empty or now_full)
        if wake:
            # Once per batch at most, not per record: a wake-up through the loop costs
            # microseconds. (A sender with a batch in flight needs none: see sender_waiting.)
            self.io.call_soon(functools.partial(self.wake, queue))

    def wait_for_room(self, size: int) -> None:
        """Called with the lock held: block until the buffer has room for `size` bytes."""
        deadline = time.monotonic() + self.max_block_seconds
        # Counted before the room is looked at: the loop releases room without the lock,
        # and then notifies if it sees a waiter (one of the two sees the other's write).
        self.room_waiters += 1
        try:
            while True:
                buffered_bytes = self.accepted_bytes - self.released_bytes
                if buffered_bytes + size <= self.buffer_bytes_max or not buffered_bytes:
                    return
                remaining = deadline - time.monotonic()
                if self.closing:
                    raise ProducerClosedError("the producer is closed")
                if remaining <= 0:
                    raise BufferFullError(
                        f"{buffered_bytes} bytes of records wait to be sent "
                        f"(buffer_bytes_max={self.buffer_bytes_max}); none freed in "
                        f"{self.max_block_seconds:g}s"
                    )
                self.condition.wait(remaining)
        finally:
            self.room_waiters -= 1

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records waiting or in flight."""
        return self.accepted_bytes - self.released_bytes

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent before this call is acknowledged or failed.

        TimeoutError if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.condition:
            targets = [(queue, queue.accepted_count) for queue in self.queues.values()]
            self.flush_requests += 1
        try:
            for queue, _ in targets:
                self.io.call_soon(functools.partial(self.wake, queue))
            with self.condition:
                for queue, target in targets:
                    while queue.completed_count < target:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise TimeoutError(f"flush did not finish in {timeout:g}s")
                        self.condition.wait(remaining)
        finally:
            with self.condition:
                self.flush_requests -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the I/O thread. Records still unsent after `timeout` seconds
        fail with ProducerClosedError."""
        if self.closed:
            return
        try:
            if not self.io.loop.is_closed():
                with contextlib.suppress(TimeoutError):
                    self.flush(timeout)
        finally:
            with self.condition:
                self.closing = True
                self.condition.notify_all()
            with contextlib.suppress(Exception):
                self.io.run(self.stop_senders())
            super().close()

    # --- the I/O loop's side ------------------------------------------------------------

    def wake(self, queue: PartitionQueue) -> None:
        signal = queue.signal
        if signal is None:
            signal = queue.signal = asyncio.Event()
        signal.set()
        if queue.task is None and not self.closing:
            queue.task = asyncio.get_running_loop().create_task(self.run_partition(queue, signal))

    async def run_partition(self, queue: PartitionQueue, signal: asyncio.Event) -> None:
        while True:
            # One acquisition of the lock a batch: the sending thread holds it for every
            # send, and each acquisition the loop makes may wait for a switch of the GIL.
            with self.lock:
                wait_seconds = self.seconds_until_ready(queue)
                batch = self.take_batch(queue) if wait_seconds == 0 else None
                queue.sender_waiting = batch is None
            if batch is None:
                # A wake (run on this loop, so never between the lock and this clear) comes
                # from a send, flush or close once the lock is released.
                signal.clear()
                if math.isinf(wait_seconds):
                    await signal.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_seconds):
                            await signal.wait()
                continue
            queue.in_flight = batch
            await self.deliver(queue, batch)
            queue.in_flight = None

    def seconds_until_ready(self, queue: PartitionQueue) -> float:
        """Called with the lock held: 0 if a batch should leave now, else how long it may
        linger (math.inf: an empty queue, or linger_ms=math.inf, waits for a wake)."""
        if not queue.records:
            return math.inf
        if queue.full_signalled or self.flush_requests or self.closing:
            return 0.0
        waited_seconds = time.monotonic() - queue.first_record_seconds
        return max(self.linger_seconds - waited_seconds, 0.0)

    def take_batch(self, queue: PartitionQueue) -> Batch:
        """Called with the lock held: the next batch of the (non-empty) queue."""
        count = 0
        batch_bytes = 0
        records = queue.records
        records_max = min(len(records), self.batch_records_max)
        # Sizes are not kept per record (that would cost every send); recompute them
        # for the batch only when the queue may exceed the byte bound.
        if queue.buffered_bytes <= self.batch_bytes_max:
            count = records_max
            batch_bytes = queue.buffered_bytes if count == len(records) else -1
        if batch_bytes < 0 or count == 0:
            count, batch_bytes = self.fit_batch(records, records_max)
        batch = Batch(records[:count], queue.futures[:count], batch_bytes)
        del records[:count]
        del queue.futures[:count]
        queue.buffered_bytes -= batch_bytes
        # Records left behind keep the oldest arrival time: they waited at least as long
        # as this batch took to fill, so they go next without lingering.
        queue.full_signalled = (
            len(records) >= self.batch_records_max or queue.buffered_bytes >= self.batch_bytes_max
        )
        if self.sticky_partitions.get(queue.topic) == queue.partition:
            count_of_topic = self.partition_counts.get(queue.topic, 1)
            self.sticky_partitions[queue.topic] = (queue.partition + 1) % count_of_topic
        return batch

    def fit_batch(self, records: list[WireRecord], records_max: int) -> tuple[int, int]:
        """How many leading records fit in batch_bytes_max (at least one), and their bytes."""
        count = 0
        total = 0
        for record in records[:records_max]:
            size = record_size(record)
            if count and total + size > self.batch_bytes_max:
                break
            count += 1
            total += size
        return count, total

    async def deliver(self, queue: PartitionQueue, batch: Batch) -> None:
        """Send `batch` until the partition answers for it; settle its futures."""
        batch.producer_id = queue.producer_id
        batch.base_sequence = queue.next_sequence
        if not self.acks_wait:
            # acks=0: the callers are told now; the batch is still delivered as any other.
            unknown = RecordMetadata(queue.topic, queue.partition, -1, -1)
            resolve_all(self.futures_condition, batch.futures, [unknown] * len(batch.futures))
        outcome_unknown = False
        while True:
            try:
                result = await self.produce(queue, batch)
            except UnknownOutcomeError as error:
                # It may be in the log: its sequence stays taken until the partition answers.
                outcome_unknown = True
                self.fail(queue, batch, error)
                self.expire_queued(queue)
                if self.closing:
                    return
                await asyncio.sleep(RESEND_BACKOFF_SECONDS)
                continue
            except RequestRejectedError as error:
                self.rejected(queue, batch, error)
                return
            except ClientError as error:
                if outcome_unknown and not self.closing:
                    # This call was not written (NotEnoughReplicasUnavailableError, say), but
                    # an earlier one may have been: the sequence stays taken.
                    self.expire_queued(queue)
                    await asyncio.sleep(RESEND_BACKOFF_SECONDS)
                    continue
                # Certainly not written (UnavailableError, a closed client): the sequence is
                # free for the next batch.
                self.fail(queue, batch, error)
                return
            self.acknowledged(queue, batch, result)
            return

    async def produce(self, queue: PartitionQueue, batch: Batch) -> ProduceResult:
        codec = self.compression  # every storage mode keeps compressed batches
        if codec != NONE and batch.compressed is None:
            batch.compressed = compress(codec, records_encoder.encode(batch.records))
        make_request = ProduceRequests(queue, batch, codec)
        what = make_request.what
        first = await produce_at_known_leader(
            self.transport,
            queue.topic,
            queue.partition,
            what,
            make_request,
            self.delivery_timeout_seconds,
            self.produce_attempt_timeout_seconds,
        )
        if isinstance(first, ProduceResult):
            result = first
        elif first is None:
            result = await self.transport.partition_call(
                queue.topic,
                queue.partition,
                what(),
                make_request,
                ProduceResult,
                side_effects=True,
                at_leader=True,
                timeout_seconds=self.delivery_timeout_seconds,
                attempt_timeout_seconds=self.produce_attempt_timeout_seconds,
                # A leader answering others on the connection is busy, not gone: a resend
                # would only add a proposal to its queue.
                patient=True,
            )
        else:  # the first attempt was not answered with a result: the retry loop goes on
            result = await self.transport.call_with(
                first,
                make_request,
                ProduceResult,
                mark_leader=True,
                partition=(queue.topic, queue.partition),
                patient=True,
            )
        self.batches_sent += 1
        return result

    def acknowledged(self, queue: PartitionQueue, batch: Batch, result: ProduceResult) -> None:
        count = len(batch.records)
        if result.count != count or (result.base_offset < 0 and not result.duplicate):
            self.fail(
                queue,
                batch,
                ClientError(
                    f"{queue.topic!r} partition {queue.partition} answered a batch of {count} "
                    f"records with {result.count} at offset {result.base_offset}"
                ),
            )
            return
        queue.next_sequence = batch.base_sequence + count
        resolve_batch(
            self.futures_condition,
            batch.futures,
            batch.records,
            queue.topic,
            queue.partition,
            result.base_offset,
            result.timestamp_ms,
        )
        self.completed(queue, batch)

    def rejected(self, queue: PartitionQueue, batch: Batch, error: RequestRejectedError) -> None:
        """The partition refused the batch; it was not written, so its sequence is free."""
        if error.code == ErrorCode.OUT_OF_RANGE.value:
            # The partition does not know our sequence (it forgot this producer, or another
            # producer shares its id). Continue this partition under a fresh identity, so
            # later batches are not refused too.
            queue.epoch += 1
            queue.producer_id = f"{self.producer_id}.{queue.epoch}"
            queue.next_sequence = 0
        self.fail(queue, batch, error)

    def fail(self, queue: PartitionQueue, batch: Batch, error: BaseException) -> None:
        for future in batch.futures:
            if not future.done():
                future.set_exception(error)
        self.completed(queue, batch)

    def completed(self, queue: PartitionQueue, batch: Batch) -> None:
        """Called on the loop: release the batch's room and count its records as done,
        without the lock; the threads waiting (for room, or in flush) are woken once a loop
        turn, not once a batch (a thousand partitions answer in the same turn)."""
        if batch.buffered_bytes < 0:
            return  # already counted (a resent batch whose futures failed before)
        queue.completed_count += len(batch.futures)
        self.released_bytes += batch.buffered_bytes
        batch.buffered_bytes = -1
        # Read after the writes above; a waiter counts itself before it looks (Dekker's
        # order, which the GIL keeps), so a waiter either sees the release or is seen.
        if (self.room_waiters or self.flush_requests) and not self.notify_scheduled:
            self.notify_scheduled = True
            self.io.loop.call_soon(self.notify_waiters)

    def notify_waiters(self) -> None:
        self.notify_scheduled = False
        with self.condition:
            self.condition.notify_all()

    def expire_queued(self, queue: PartitionQueue) -> None:
        """Fail records queued behind a stuck batch once they waited the delivery timeout."""
        with self.condition:
            waited_seconds = time.monotonic() - queue.first_record_seconds
            if not queue.records or waited_seconds < self.delivery_timeout_seconds:
                return
            futures = queue.futures
            expired_bytes = queue.buffered_bytes
            queue.records = []
            queue.futures = []
            queue.buffered_bytes = 0
            queue.full_signalled = False
        error = UnavailableError(
            f"{queue.topic!r} partition {queue.partition} accepted nothing for "
            f"{self.delivery_timeout_seconds:g}s; the records were never sent"
        )
        self.fail(queue, Batch([], futures, expired_bytes), error)

    async def stop_senders(self) -> None:
        tasks = [queue.task for queue in self.queues.values() if queue.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closed = ProducerClosedError("the producer was closed before the record was sent")
        with self.condition:
            leftovers = [(queue, queue.futures) for queue in self.queues.values()]
            leftovers += [
                (queue, queue.in_flight.futures)
                for queue in self.queues.values()
                if queue.in_flight is not None
            ]
            for queue in self.queues.values():
                queue.records = []
                queue.futures = []
                queue.completed_count = queue.accepted_count
                queue.buffered_bytes = 0
            self.released_bytes = self.accepted_bytes
            self.condition.notify_all()
        for _, futures in leftovers:
            for future in futures:
                if not future.done():
                    future.set_exception(closed)


# --- checks and sizes ----------------------------------------------------------------------


def check_producer_settings(
    linger_ms: float,
    batch_records_max: int,
    batch_bytes_max: int,
    buffer_bytes_max: int,
    max_block_seconds: float,
) -> None:
    if linger_ms < 0:
        raise ValueError(f"linger_ms must not be negative, got {linger_ms}")
    if batch_records_max < 1:
        raise ValueError(f"batch_records_max must be positive, got {batch_records_max}")
    if batch_bytes_max < 1:
        raise ValueError(f"batch_bytes_max must be positive, got {batch_bytes_max}")
    if buffer_bytes_max < batch_bytes_max:
        raise ValueError(
            f"buffer_bytes_max ({buffer_bytes_max}) must hold at least one batch "
            f"(batch_bytes_max={batch_bytes_max})"
        )
    if max_block_seconds < 0:
        raise ValueError(f"max_block_seconds must not be negative, got {max_block_seconds}")


def check_acks(acks: int | str) -> bool:
    """Whether the producer waits for acknowledgements (see the module docstring)."""
    if acks in (ACKS_ALL, -1):
        return True
    if acks == 0:
        return False
    raise ValueError(
        f"acks is 'all' (or -1) or 0, not {acks!r}: acks=1 would acknowledge a write that "
        "the partition's quorum may still lose, which no storage mode here does"
    )


def as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)  # a copy: the caller may reuse its buffer before we send
    raise TypeError(f"a record {what} is bytes, not {type(data).__name__}")


def check_headers(headers: Headers) -> list[tuple[str, bytes]]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    checked: list[tuple[str, bytes]] = []
    for item in items:
        name, value = item
        if not isinstance(name, str):
            raise TypeError(f"a header name is str, not {type(name).__name__}")
        checked.append((name, as_bytes(value, f"header {name!r} value")))
    return checked


def record_size(record: WireRecord) -> int:
    size = len(record.value or b"") + RECORD_OVERHEAD_BYTES
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers:
        size += len(name) + len(value)
    return size


__all__ = ["BufferFullError", "Producer", "ProducerClosedError"]

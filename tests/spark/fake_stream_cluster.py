"""A one-node stand-in for a quorumlog cluster's stream and KV-scan service, over the real
wire protocol, for Spark tests that need no real cluster.

It keeps each partition as a list of log entries (encoded RecordBatches, as the real log
holds them), assigns offsets on append, decides each Produce with the partitions' own
`admit_batch` (duplicates, gaps and straddling batches as a real partition does), answers
Fetch with whole entries from the one holding the asked offset, and refuses offsets
outside [begin, end) with OUT_OF_RANGE. Tests can remove a partition's head (retention)
and count Produce requests (and those refused as out of order). It runs on its own event loop in
a thread, listening on a loopback port the OS picks; Spark's Python workers dial it like a
real node.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from quorumlog.codec import wire
from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.stream.partition import (
    PRODUCER_COUNT_MAX_DEFAULT,
    OutOfOrderSequenceError,
    ProduceOutcome,
    ProducerState,
    admit_batch,
)
from quorumlog.stream.topics import encode_descriptor, topic_key

NODE_ID = "n1"


class FakePartition:
    def __init__(self) -> None:
        self.entries: list[tuple[int, bytes, int]] = []
        """(base offset, encoded batch, record count), in offset order."""
        self.begin = 0
        self.end = 0
        self.producers: OrderedDict[str, ProducerState] = OrderedDict()
        self.out_of_order = 0
        """Produce requests refused as out of order (a gap, or a batch straddling what the
        producer sent before)."""

    def append(self, produce: wire.Produce) -> wire.Frame:
        count = len(produce.records)
        outcome = admit_batch(
            self.producers,
            produce.producer_id,
            produce.base_sequence,
            count,
            self.end,
            PRODUCER_COUNT_MAX_DEFAULT,
        )
        if isinstance(outcome, OutOfOrderSequenceError):
            self.out_of_order += 1
            return wire.ErrorResponse(produce.request_id, wire.ErrorCode.OUT_OF_RANGE, str(outcome))
        if not isinstance(outcome, ProduceOutcome):
            return wire.ErrorResponse(produce.request_id, wire.ErrorCode.INTERNAL, str(outcome))
        if outcome.duplicate:
            return wire.ProduceResult(produce.request_id, outcome.base_offset, count, True)
        batch = wire.RecordBatch(
            producer_id=produce.producer_id,
            base_sequence=produce.base_sequence,
            timestamp_ms=int(time.time() * 1000),
            records=produce.records,
        )
        base_offset = self.end
        self.entries.append((base_offset, wire.encode_record_batch(batch), len(produce.records)))
        self.end += len(produce.records)
        return wire.ProduceResult(produce.request_id, base_offset, len(produce.records))

    def fetch(self, fetch: wire.Fetch) -> wire.Frame:
        if not self.begin <= fetch.offset <= self.end:
            return wire.ErrorResponse(
                fetch.request_id,
                wire.ErrorCode.OUT_OF_RANGE,
                f"offset {fetch.offset} is outside [{self.begin}, {self.end}]",
            )
        batches: list[wire.FetchedBatch] = []
        records = 0
        size = 0
        for base_offset, data, count in self.entries:
            if base_offset + count <= fetch.offset:
                continue
            if batches and (records >= fetch.records_max or size + len(data) > fetch.bytes_max):
                break
            batches.append(wire.FetchedBatch(base_offset, data))
            records += count
            size += len(data)
        return wire.FetchResult(fetch.request_id, self.begin, self.end, batches)

    def remove_before(self, offset: int) -> None:
        """Retention: drop whole entries that end at or before `offset`."""
        kept = [entry for entry in self.entries if entry[0] + entry[2] > offset]
        self.entries = kept
        self.begin = kept[0][0] if kept else self.end


class FakeStreamCluster:
    def __init__(self, cluster_id: str = "quorumlog") -> None:
        self.cluster_id = cluster_id
        self.address = ""
        self.topics: dict[str, wire.TopicDescriptor] = {}
        self.partitions: dict[tuple[str, int], FakePartition] = {}
        self.kv: dict[str, str] = {}
        self.produce_requests = 0
        self.before_produce: Callable[[wire.Produce], wire.Frame | None] | None = None
        """A test's hook: return a frame to answer a Produce with it instead (not applied)."""
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoints(self) -> str:
        return self.address

    # --- lifetime -----------------------------------------------------------------------

    def start(self) -> FakeStreamCluster:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.listen(), self.loop).result(timeout=10)
        return self

    async def listen(self) -> None:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()
        if self.server is not None:
            await self.server.wait_closed()

    # --- what tests call ----------------------------------------------------------------

    def create_topic(self, name: str, partitions: int) -> None:
        with self.lock:
            self.topics[name] = wire.TopicDescriptor(
                name=name,
                settings=wire.TopicSettings(partitions=partitions, replication=1),
                replicas=[[NODE_ID] for _ in range(partitions)],
                addresses={NODE_ID: self.address},
                created_ms=int(time.time() * 1000),
            )
            for partition in range(partitions):
                self.partitions[(name, partition)] = FakePartition()
            self.kv[topic_key(name)] = encode_descriptor(self.topics[name])

    def remove_before(self, topic: str, partition: int, offset: int) -> None:
        with self.lock:
            self.partitions[(topic, partition)].remove_before(offset)

    def out_of_order(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.partitions[(topic, partition)].out_of_order

    def end_offset(self, topic: str, partition: int) -> int:
        with self.lock:
            return self.partitions[(topic, partition)].end

    # --- serving ------------------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        decoder = FrameDecoder()

        def reply(frame: wire.Frame) -> None:
            if not writer.is_closing():
                writer.write(encode_frame(wire.encode(frame)))

        try:
            handshaken = False
            while data := await reader.read(1 << 20):
                for payload in decoder.feed(data):
                    frame = wire.decode(payload)
                    if not handshaken:
                        if not isinstance(frame, wire.Hello):
                            return
                        if frame.cluster_id != self.cluster_id:
                            reply(wire.Refused(reason=f"cluster id {frame.cluster_id!r}"))
                            return
                        reply(wire.Welcome(node_id=NODE_ID))
                        handshaken = True
                        continue
                    with self.lock:
                        reply(self.handle(frame))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    def handle(self, frame: Any) -> wire.Frame:
        if isinstance(frame, wire.ListTopics):
            return wire.TopicList(frame.request_id, list(self.topics.values()))
        if isinstance(frame, wire.KVScan):
            return self.scan(frame)
        if isinstance(frame, wire.StatusRequest):
            return self.status(frame.request_id)
        if isinstance(frame, wire.KVRead):
            # Topic descriptors live in the KV under __topics/<name> (the linearizable lookup).
            values = [self.kv.get(key) for key in frame.keys]
            return wire.KVReadResult(frame.request_id, values)
        if isinstance(frame, wire.Produce | wire.Fetch | wire.PartitionStatusRequest):
            partition = self.partitions.get((frame.topic, frame.partition))
            if partition is None:
                return wire.ErrorResponse(
                    frame.request_id,
                    wire.ErrorCode.NOT_FOUND,
                    f"no partition {frame.topic}/{frame.partition}",
                )
            if isinstance(frame, wire.Produce):
                self.produce_requests += 1
                if self.before_produce is not None:
                    answer = self.before_produce(frame)
                    if answer is not None:
                        return answer
                return partition.append(frame)
            if isinstance(frame, wire.Fetch):
                return partition.fetch(frame)
            return wire.PartitionStatus(
                request_id=frame.request_id,
                topic=frame.topic,
                partition=frame.partition,
                node_id=NODE_ID,
                leader=NODE_ID,
                replicas=[NODE_ID],
                in_sync=[NODE_ID],
                begin_offset=partition.begin,
                end_offset=partition.end,
                term=1,
                commit_index=partition.end,
            )
        return wire.ErrorResponse(
            getattr(frame, "request_id", 0),
            wire.ErrorCode.BAD_REQUEST,
            f"the fake cluster does not serve {type(frame).__name__}",
        )

    def scan(self, frame: wire.KVScan) -> wire.Frame:
        keys = sorted(
            key for key in self.kv if key >= frame.start and (frame.end is None or key < frame.end)
        )
        page = keys[: frame.limit]
        next_start = keys[frame.limit] if len(keys) > frame.limit else None
        items = [(key, self.kv[key]) for key in page]
        return wire.KVScanResult(frame.request_id, items, next_start)

    def status(self, request_id: int) -> wire.StatusResponse:
        return wire.StatusResponse(
            request_id=request_id,
            node_id=NODE_ID,
            group="kv",
            role="leader",
            is_leader=True,
            leader=NODE_ID,
            term=1,
            commit_index=0,
            applied_index=0,
            first_index=1,
            last_index=0,
            voters=[NODE_ID],
            learners=[],
            addresses={NODE_ID: self.address},
        )

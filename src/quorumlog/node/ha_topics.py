"""Serves HA-replicated topics on a node (issue 12, reference 003's controller mode).

- Placement: each partition of a topic created with storage "ha" is a broker group (named
  like the partition's Raft group, `stream.topics.group_id`: the topic's incarnation and
  the partition) of the partition's replicas; broker id = node id. Each replica runs one
  `BrokerHost` (ha/broker_host.py) over the partition's commit log (`MmapCommitLog` in
  `data_dir/ha/<group>/log`) and epoch file, on the node's event loop.
- The HA controller ("ha-controller" group) names the master; brokers reach it through
  `RequestControllerAccess` (the code the simulator runs too). Replication between brokers
  runs on the node's HA listener (node/ha_links.py; its own port, registered with the
  controller as the broker address).
- Records: one commit log message per produce batch (ha/partition_index.py for the
  layout). The master keeps an in-memory index from record offsets to log offsets and the
  producer table, built by reading the log when it becomes master; record offsets are
  contiguous record numbers, as on Raft topics, and duplicates get the same answers
  (`stream.partition.admit_batch`, shared by every storage mode).
- Syncs of the commit logs run on a thread pool of this service (`BatchedBackground`), so
  the event loop takes produces, transfers and acks while a broker's msync runs; what the
  pool made durable counts only once its report is back on the loop (ha/broker_host.py).
- Produce at the master only (NOT_LEADER naming the master's node elsewhere); acknowledged
  once every SyncStateSet member has it (refused with NOT_ENOUGH_REPLICAS, nothing
  written, if the set is smaller than `min_in_sync`). Fetch and PartitionStatus at the
  master only, up to confirmOffset (a slave's view of confirmOffset lags, and only the
  master's index is kept), so a consumer reads only what every SyncStateSet member holds.
- A failed sync steps the broker out (ha/broker_host.py): its waiting produces are answered
  UNAVAILABLE (outcome unknown; the producer retries with the same sequence and the next
  master deduplicates), the controller elects another master, and every other partition of
  the node goes on. After a full disk (like the Raft host's ENOSPC retry) the partition is
  reopened every `disk_full_reopen_seconds`: a new host over the log reopened from disk,
  which registers and rejoins (as a restart would); a sync failing again steps it out
  again. After an I/O error the broker stays out until the node restarts: the kernel may
  have dropped pages it reported written (the Raft host stops its group likewise).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import (
    HASyncFailedError,
    MasterFencedError,
    NotEnoughReplicasError,
    QuorumLogError,
)
from quorumlog.ha.broker_host import BrokerHost, BrokerHostConfig
from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.partition_index import HAPartitionIndex, decode_message, encode_message
from quorumlog.ha.replication_actions import HAReplicationConfig
from quorumlog.node.ha_controller_access import RequestControllerAccess
from quorumlog.node.ha_links import AsyncioHALinks
from quorumlog.node.peer_requests import AsyncioPeerRequests, PeerRequester
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.group import AsyncioScheduler
from quorumlog.runtime.sync_batch import BatchedBackground
from quorumlog.runtime.transport import Replier, format_address
from quorumlog.storage.base import SyncPolicy
from quorumlog.stream.partition import OffsetOutOfRangeError, OutOfOrderSequenceError
from quorumlog.stream.topics import group_id
from quorumlog.tls.config import NodeTLS

log = logging.getLogger("quorumlog.ha_topics")

MIN_IN_SYNC_DEFAULT = 2
FETCH_RECORDS_MAX = 100_000
DATA_FILE_BYTES = 64 * 1024 * 1024

HA_TOPIC_CONFIG = BrokerHostConfig(
    replication=HAReplicationConfig(
        heartbeat_interval_ms=200,
        ha_max_time_slave_not_catch_up_ms=3_000,
        alter_retry_interval_ms=1_000,
    ),
)
"""A dead slave leaves the SyncStateSet (and stops holding produces) within 3 s."""
SYNC_THREADS = 4
"""Threads syncing commit logs at once: each broker has at most one sync in flight, and a
file system commits concurrent syncs together (runtime/sync_batch.py)."""
DISK_FULL_REOPEN_SECONDS = 5.0
"""After a sync failed on a full disk, the partition's log is reopened this long after (and
as often, while opening fails): longer than the controller's broker timeout (1.5 s), so a
failed master's group has elected another before the reopened broker registers."""
SLAVE_INDEX_INTERVAL_SECONDS = 0.2
SLAVE_INDEX_MESSAGES_PER_STEP = 2_048
"""A slave indexes what it received this often, at most this many messages per partition
a step (so a slave far behind never holds the event loop long): becoming master then reads
only the tail, whatever the log's length."""


@dataclass
class HAPartition:
    descriptor: wire.TopicDescriptor
    partition: int
    group: str
    host: BrokerHost
    index: HAPartitionIndex
    commit_log: MmapCommitLog
    indexed_for_epoch: int = -1
    """The MasterEpoch the index was last caught up for (catch-up once per mastership)."""


class HATopicService:
    def __init__(
        self,
        node_id: str,
        cluster_id: str,
        data_dir: str,
        listen_host: str,
        fsync: bool,
        metadata_endpoints: Callable[[], list[str]],
        address_of: Callable[[str | None], str | None],
        config: BrokerHostConfig = HA_TOPIC_CONFIG,
        tls: NodeTLS | None = None,
        advertised_host: str = "",
    ) -> None:
        self.node_id = node_id
        self.tls = tls or NodeTLS()
        self.cluster_id = cluster_id
        self.data_dir = Path(data_dir)
        self.listen_host = listen_host
        """The host the HA listener binds (a wildcard binds every interface)."""
        self.advertised_host = advertised_host or listen_host
        """The host brokers are told to dial (the node's `--advertise` host, else its
        listen host; never a wildcard: the node refuses to start with one)."""
        self.fsync = fsync
        self.metadata_endpoints = metadata_endpoints
        self.address_of = address_of
        self.config = config
        self.partitions: dict[tuple[str, int], HAPartition] = {}
        self.links: AsyncioHALinks | None = None
        self.controller: RequestControllerAccess | None = None
        self.controller_requests: AsyncioPeerRequests | None = None
        self.ha_address: str | None = None
        self.listening: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.syncs = BatchedBackground(SYNC_THREADS)
        self.disk_full_reopen_seconds = DISK_FULL_REOPEN_SECONDS
        self.reopens = 0
        """Partitions reopened after a full disk (for tests and status)."""

    # --- hosting ---------------------------------------------------------------------------

    def host(self, descriptor: wire.TopicDescriptor) -> None:
        """Start a broker for every partition this node is a replica of (once listening)."""
        wanted = [
            partition
            for partition, replicas in enumerate(descriptor.replicas)
            if self.node_id in replicas
        ]
        if not wanted or self.stopping:
            return
        loop = asyncio.get_running_loop()
        if self.listening is None:
            self.listening = loop.create_task(self.listen())

        async def start_brokers() -> None:
            assert self.listening is not None
            await self.listening
            for partition in wanted:
                if not self.stopping:
                    self.start_broker(descriptor, partition)

        task = loop.create_task(start_brokers())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def listen(self) -> None:
        loop = asyncio.get_running_loop()
        self.links = AsyncioHALinks(loop, self.cluster_id, self.tls)
        port = await self.links.listen(self.listen_host)
        self.ha_address = format_address(self.advertised_host, port)
        requester = PeerRequester(
            self.cluster_id, f"ha-broker-{self.node_id}", tls=self.tls.dialing_tls()
        )
        scheduler = AsyncioScheduler(loop)
        self.controller_requests = AsyncioPeerRequests(requester, scheduler)
        self.controller = RequestControllerAccess(
            self.controller_requests, scheduler, self.metadata_endpoints()
        )
        indexing = loop.create_task(self.index_slaves_forever())
        self.tasks.add(indexing)
        indexing.add_done_callback(self.tasks.discard)
        log.info("node %s: HA replication listens on %s", self.node_id, self.ha_address)

    def start_broker(self, descriptor: wire.TopicDescriptor, partition: int) -> None:
        links, controller, address = self.links, self.controller, self.ha_address
        assert links is not None and controller is not None and address is not None
        name = group_id(descriptor, partition)
        directory = self.partition_directory(name)
        commit_log = MmapCommitLog.open(
            directory / "log",
            data_file_bytes=DATA_FILE_BYTES,
            sync_policy=SyncPolicy.EXPLICIT if self.fsync else SyncPolicy.NEVER,
        )
        index = HAPartitionIndex()
        try:
            epoch_file = EpochFile(directory / "epochs")
            replication = min(MIN_IN_SYNC_DEFAULT, len(descriptor.replicas[partition]))
            config = msgspec.structs.replace(
                self.config,
                replication=msgspec.structs.replace(
                    self.config.replication, min_in_sync=replication
                ),
            )
            host = BrokerHost(
                scheduler=AsyncioScheduler(asyncio.get_running_loop()),
                links=links.for_group(name),
                controller=controller,
                commit_log=commit_log,
                epoch_file=epoch_file,
                group=name,
                broker_id=self.node_id,
                address=address,
                config=config,
                on_truncated=lambda _offset: index.reset(),
                background=self.syncs,
            )
        except BaseException:
            # The log holds its directory's lock: a reopen trying again must find it free.
            commit_log.close()
            raise
        part = HAPartition(descriptor, partition, name, host, index, commit_log)
        host.on_failed = lambda failure: self.broker_failed(part, failure)
        self.partitions[(descriptor.name, partition)] = part
        links.attach(host)
        host.start()
        log.info("broker of %s partition %d (group %s)", descriptor.name, partition, name)

    def broker_failed(self, part: HAPartition, failure: HASyncFailedError) -> None:
        """A broker stepped out after a failed sync (see the module docstring)."""
        if not failure.disk_full:
            log.error(
                "HA %s: the broker stays out until the node restarts (after an I/O error the "
                "kernel may have dropped what it reported written)",
                part.group,
            )
            return
        log.error(
            "HA %s: disk full; the log is reopened in %.1f s",
            part.group,
            self.disk_full_reopen_seconds,
        )
        loop = asyncio.get_running_loop()
        loop.call_later(self.disk_full_reopen_seconds, self.reopen, part)

    def reopen(self, part: HAPartition) -> None:
        """Replace a broker that stepped out by one over its log reopened from disk."""
        key = (part.descriptor.name, part.partition)
        if self.stopping or self.partitions.get(key) is not part:
            return  # dropped or stopped meanwhile
        del self.partitions[key]
        self.close_partition(part)
        try:
            self.start_broker(part.descriptor, part.partition)
        except (QuorumLogError, OSError) as error:
            log.error("HA %s: reopening failed, trying again: %s", part.group, error)
            self.partitions[key] = part  # closed: it refuses everything until replaced
            loop = asyncio.get_running_loop()
            loop.call_later(self.disk_full_reopen_seconds, self.reopen, part)
            return
        self.reopens += 1
        log.warning("HA %s: the broker's log is reopened after a full disk", part.group)

    def drop(self, descriptor: wire.TopicDescriptor) -> None:
        for partition in range(len(descriptor.replicas)):
            part = self.partitions.get((descriptor.name, partition))
            if part is None or part.descriptor.created_ms != descriptor.created_ms:
                continue
            del self.partitions[(descriptor.name, partition)]
            self.close_partition(part)
            # The topic is gone from the metadata: its commit log and epoch file go with it.
            shutil.rmtree(self.partition_directory(part.group), ignore_errors=True)

    def partition_directory(self, name: str) -> Path:
        return self.data_dir / "ha" / name.replace("/", "-")

    def close_partition(self, part: HAPartition) -> None:
        part.host.close()
        if self.links is not None:
            self.links.detach(part.group)
        part.commit_log.close()

    async def index_slaves_forever(self) -> None:
        while not self.stopping:
            await asyncio.sleep(SLAVE_INDEX_INTERVAL_SECONDS)  # a period, not a condition
            for part in list(self.partitions.values()):
                if self.stopping:
                    return
                if self.partitions.get((part.descriptor.name, part.partition)) is not part:
                    continue  # dropped meanwhile: its log is closed
                if not part.host.is_master and part.host.slave is not None:
                    try:
                        part.index.catch_up(part.commit_log, SLAVE_INDEX_MESSAGES_PER_STEP)
                    except QuorumLogError as error:
                        # Becoming master reads the log again and fails there, typed.
                        log.error("HA %s: indexing as a slave failed: %s", part.group, error)
                        part.index.reset()
                    await asyncio.sleep(0)

    def serves(self, topic: str, partition: int) -> HAPartition | None:
        return self.partitions.get((topic, partition))

    def by_group(self, group: str) -> HAPartition | None:
        for part in self.partitions.values():
            if part.group == group:
                return part
        return None

    async def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()
        for part in list(self.partitions.values()):
            self.close_partition(part)
        self.partitions.clear()
        if self.links is not None:
            self.links.close()
        if self.controller is not None:
            self.controller.close()
        if self.controller_requests is not None:
            await self.controller_requests.close()
        # Jobs handed out run to their end (on descriptors of their own, so closing the
        # logs did not hurt them); their reports go nowhere now.
        await asyncio.to_thread(self.syncs.shutdown)

    # --- requests --------------------------------------------------------------------------

    def ready_master(self, part: HAPartition) -> bool:
        """Is this broker master with its index caught up (reading the log if needed)?"""
        host = part.host
        if not host.is_master:
            return False
        if part.indexed_for_epoch != host.role_epoch or part.index.indexed_end is None:
            part.index.catch_up(part.commit_log)
            part.indexed_for_epoch = host.role_epoch
        return True

    def refuse_not_master(self, part: HAPartition, request_id: int, reply: Replier) -> None:
        view = part.host.view
        master = view.master_id if view is not None else None
        if master == self.node_id:
            master = None  # still becoming master (or fenced): no better hint
        reply(
            wire.ErrorResponse(
                request_id=request_id,
                code=wire.ErrorCode.NOT_LEADER,
                message=(
                    f"node {self.node_id} is not the master of {part.descriptor.name}/"
                    f"{part.partition}" + (f"; {master} is" if master else "")
                ),
                leader_hint=self.address_of(master),
            )
        )

    def produce(self, part: HAPartition, request: wire.Produce, reply: Replier) -> None:
        """Admit, append and wait for the SyncStateSet (the caller checked the batch)."""
        if not self.ready_master(part):
            self.refuse_not_master(part, request.request_id, reply)
            return
        host, index = part.host, part.index
        refusal = host.append_refusal()
        if refusal is not None:
            refuse(reply, request.request_id, refusal_code(refusal), str(refusal))
            return
        count = len(request.records) if request.compression == "none" else request.record_count
        outcome = index.admit(request.producer_id, request.base_sequence, count)
        if isinstance(outcome, OutOfOrderSequenceError):
            refuse(reply, request.request_id, wire.ErrorCode.OUT_OF_RANGE, str(outcome))
            return
        if isinstance(outcome, QuorumLogError):
            refuse(reply, request.request_id, wire.ErrorCode.UNAVAILABLE, str(outcome))
            return
        timestamp_ms = int(time.time() * 1000)
        if outcome.duplicate:
            end = index.end_of_records(outcome.base_offset) if outcome.base_offset >= 0 else 0
            waiting = host.wait_acknowledged(end or 0)
        else:
            batch = stored_batch(request, timestamp_ms)
            message = encode_message(outcome.base_offset, count, wire.encode_record_batch(batch))
            start = part.commit_log.max_offset
            try:
                end = host.append([message])
            except HASyncFailedError as error:
                # The write failed and the broker stepped out: this index, whose producer
                # table admitted the batch, is dropped with it (a reopen builds a new one
                # from the log), so a retry is never taken for a batch that was written.
                refuse(reply, request.request_id, wire.ErrorCode.UNAVAILABLE, str(error))
                return
            index.appended(start, end, outcome.base_offset, count)
            waiting = host.wait_acknowledged(end)

        def answer(done: Completion[int]) -> None:
            problem = done.exception()
            if problem is None:
                reply(
                    wire.ProduceResult(
                        request_id=request.request_id,
                        base_offset=outcome.base_offset,
                        count=outcome.count,
                        duplicate=outcome.duplicate,
                        timestamp_ms=timestamp_ms,
                    )
                )
            elif isinstance(problem, MasterFencedError):
                self.refuse_not_master(part, request.request_id, reply)
            elif isinstance(problem, QuorumLogError):
                # Written, not acknowledged: the outcome is open (a retry is deduplicated).
                refuse(reply, request.request_id, wire.ErrorCode.UNAVAILABLE, str(problem))
            else:
                raise problem

        waiting.add_done_callback(answer)

    def fetch(self, part: HAPartition, request: wire.Fetch, reply: Replier) -> None:
        if not self.ready_master(part):
            self.refuse_not_master(part, request.request_id, reply)
            return
        confirm = part.host.confirm_offset
        index = part.index
        try:
            position = index.locate(request.offset, confirm)
        except OffsetOutOfRangeError as problem:
            refuse(reply, request.request_id, wire.ErrorCode.OUT_OF_RANGE, str(problem))
            return
        batches = self.read_batches(part, position, confirm, request)
        reply(
            wire.FetchResult(
                request_id=request.request_id,
                begin_offset=index.begin_offset,
                end_offset=index.confirmed_end(confirm),
                batches=batches,
            )
        )

    def read_batches(
        self, part: HAPartition, position: int, confirm: int, request: wire.Fetch
    ) -> list[wire.FetchedBatch]:
        """Whole messages from `position` that end by `confirm`, within the request's
        bounds (one at least: a large batch still gets through)."""
        index = part.index
        last = index.confirmed_count(confirm)
        records_max = max(1, min(request.records_max, FETCH_RECORDS_MAX))
        batches: list[wire.FetchedBatch] = []
        records = size = 0
        while (
            position < last and records < records_max and (not batches or size < request.bytes_max)
        ):
            read = part.host.read(index.starts[position], request.bytes_max)
            if read is None:
                break
            for message in read.messages:
                if position >= last:
                    break
                base_offset, count, data = decode_message(message)
                batches.append(wire.FetchedBatch(base_offset=base_offset, data=data))
                records += base_offset + count - max(base_offset, request.offset)
                size += len(data)
                position += 1
                if records >= records_max or size >= request.bytes_max:
                    break
        return batches

    def partition_status(
        self, part: HAPartition, request: wire.PartitionStatusRequest, reply: Replier
    ) -> None:
        """Only the master answers with offsets (its index and confirmOffset); any other
        replica names the master."""
        if not self.ready_master(part):
            self.refuse_not_master(part, request.request_id, reply)
            return
        host, index = part.host, part.index
        master = host.master
        assert master is not None
        confirm = host.confirm_offset
        reply(
            wire.PartitionStatus(
                request_id=request.request_id,
                topic=request.topic,
                partition=request.partition,
                node_id=self.node_id,
                leader=self.node_id,
                replicas=list(part.descriptor.replicas[part.partition]),
                in_sync=sorted(master.sync_state_set),
                begin_offset=index.begin_offset,
                end_offset=index.confirmed_end(confirm),
                term=host.role_epoch,
                commit_index=confirm,
            )
        )

    def broker_status(self, request: wire.HABrokerStatusRequest, reply: Replier) -> None:
        part = self.by_group(request.group)
        if part is None:
            refuse(
                reply,
                request.request_id,
                wire.ErrorCode.NOT_FOUND,
                f"node {self.node_id} runs no broker of group {request.group!r}",
            )
            return
        status = msgspec.json.encode(part.host.status())
        reply(wire.HABrokerStatusResponse(request_id=request.request_id, status=status))


def stored_batch(request: wire.Produce, timestamp_ms: int) -> wire.RecordBatch:
    """The commit log message's batch: the records, or the producer's compressed bytes as
    they came (RecordBatch version 2, which every reader since compression decodes; the
    message layout around it is unchanged)."""
    if request.compression == "none":
        return wire.RecordBatch(
            request.producer_id, request.base_sequence, timestamp_ms, request.records
        )
    return wire.RecordBatch(
        producer_id=request.producer_id,
        base_sequence=request.base_sequence,
        timestamp_ms=timestamp_ms,
        records=[],
        compression=request.compression,
        compressed=request.compressed,
        record_count=request.record_count,
    )


def refusal_code(refusal: QuorumLogError) -> wire.ErrorCode:
    """A produce refused before anything was written: NOT_ENOUGH_REPLICAS when the
    SyncStateSet is too small (clients back off and retry, then raise it typed), else
    UNAVAILABLE (fenced, too many produces pending: retried likewise). The producer
    retries with the same sequence either way."""
    if isinstance(refusal, NotEnoughReplicasError):
        return wire.ErrorCode.NOT_ENOUGH_REPLICAS
    return wire.ErrorCode.UNAVAILABLE


def refuse(reply: Replier, request_id: int, code: wire.ErrorCode, message: str) -> None:
    reply(wire.ErrorResponse(request_id=request_id, code=code, message=message))


__all__ = ["HA_TOPIC_CONFIG", "HAPartition", "HATopicService"]

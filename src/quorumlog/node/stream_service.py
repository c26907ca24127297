"""Serves streams on a node: topic admin through the metadata group, and the partitions
(one Raft group each) this node replicates.

Every node learns topics the same way: descriptors are KV entries under "__topics/", so
when the metadata group applies one, each node starts (or stops) the partition groups it
is a replica of. Produce goes to a partition's leader; fetch is served by any replica up
to what it has applied (only committed records are ever readable).

Topics created with storage "ledger" are served by `LedgerTopicService`
(node/ledger_topics.py): their partitions are managed ledgers on bookies, not Raft groups.
Topics with storage "ha" by `HATopicService` (node/ha_topics.py): each partition a broker
group whose master the HA controller elects (reference 003).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError, QuorumLogError
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine
from quorumlog.node.addresses import host_of
from quorumlog.node.compressed_batches import compressed_batch_problem
from quorumlog.node.errors_to_wire import error_code
from quorumlog.node.ha_topics import HATopicService
from quorumlog.node.ledger_topics import LedgerTopicService, LedgerTopicSettings
from quorumlog.node.long_poll import NotifyingPartitionMachine, hold_fetch
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.runtime.group import GroupRunner, GroupSettings, open_log_stores
from quorumlog.runtime.transport import Replier
from quorumlog.stream.partition import (
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProduceOutcome,
)
from quorumlog.stream.topics import (
    TOPIC_PREFIX,
    assign_replicas,
    check_settings,
    decode_descriptor,
    encode_descriptor,
    group_id,
    is_ha_topic,
    is_ledger_topic,
    topic_key,
)

if TYPE_CHECKING:
    from quorumlog.node.server import Node
    from quorumlog.storage.base import LogStore

log = logging.getLogger("quorumlog.streams")

PRODUCE_RECORDS_MAX = 100_000
PRODUCE_BYTES_MAX = 32 * 1024 * 1024
FETCH_RECORDS_MAX = 100_000
PRODUCE_PARTS_MAX = 10_000
"""Batches in one ProduceMany frame (the frame's bytes are bounded by the transport too)."""
RETENTION_CHECK_SECONDS = 1.0
NEVER_SNAPSHOT_ENTRIES = 10**15
HOST_PARTITIONS_PER_TURN = 16
"""Partition groups opened per event-loop turn when a topic is hosted."""


class HostedPartition:
    def __init__(
        self,
        descriptor: wire.TopicDescriptor,
        partition: int,
        group: GroupRunner,
        machine: NotifyingPartitionMachine,
        directory: Path,
    ) -> None:
        self.descriptor = descriptor
        self.partition = partition
        self.group = group
        self.machine = machine
        self.directory = directory


class TopicWatchingMachine:
    """The metadata KV machine, noticing when a topic descriptor may have changed."""

    def __init__(self, machine: KVStateMachine, changed: Callable[[], None]) -> None:
        self.machine = machine
        self.changed = changed
        self.marker = TOPIC_PREFIX.encode()

    def apply(self, index: int, data: bytes) -> Any:
        result = self.machine.apply(index, data)
        if self.marker in data:
            self.changed()
        return result

    def mark_applied(self, index: int) -> None:
        self.machine.mark_applied(index)

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        self.machine.restore(data)
        self.changed()


class StreamService:
    def __init__(
        self, node: Node, metadata_group: Callable[[], GroupRunner], metadata: KVStateMachine
    ) -> None:
        self.node = node
        self.metadata_group = metadata_group
        self.metadata = metadata
        self.topics: dict[str, wire.TopicDescriptor] = {}
        self.partitions: dict[tuple[str, int], HostedPartition] = {}
        self.sync_scheduled = False
        self.retention_task: asyncio.Task[None] | None = None
        self.stopping = False
        self.last_created_ms = 0
        """The newest topic stamp this node issued: each create gets a later one, so a topic
        deleted and created again within a millisecond is still another incarnation (its
        partitions' group and ledger names differ, and the old one's cleanup cannot reach
        the new one's data)."""
        settings = node.settings
        self.ledger_topics = LedgerTopicService(
            node.node_id,
            settings.cluster_id,
            LedgerTopicSettings(
                renew_seconds=settings.ledger_owner_renew_ms / 1000,
                stale_seconds=settings.ledger_owner_stale_ms / 1000,
                rollover_records_max=settings.ledger_rollover_records,
                sweep_seconds=settings.ledger_sweep_interval_ms / 1000,
            ),
            metadata.data.get,
            node.metadata_endpoints,
            node.address_of,
            node.node_credentials,
            tls=settings.tls.dialing_tls(),
            sweeps=lambda: self.metadata_group().core.is_leader,
            on_swept=node.observability.metrics.collected_by_sweep,
        )
        self.ha_topics = HATopicService(
            node.node_id,
            settings.cluster_id,
            settings.data_dir,
            host_of(settings.listen),
            settings.fsync,
            node.metadata_endpoints,
            node.address_of,
            tls=settings.tls,
            advertised_host=host_of(settings.advertise or settings.listen),
        )

    # --- topic life cycle ---------------------------------------------------------------

    def start(self) -> None:
        self.retention_task = asyncio.create_task(self.enforce_retention_forever())
        self.ledger_topics.start()
        self.schedule_sync()

    async def release_ledger_topics(self) -> None:
        """Close the ledger topic partitions this node owns and hand their leases on."""
        await self.ledger_topics.stop()

    async def stop(self) -> None:
        self.stopping = True
        await self.ledger_topics.stop()
        await self.ha_topics.stop()
        if self.retention_task is not None:
            self.retention_task.cancel()
        for hosted in list(self.partitions.values()):
            await hosted.group.stop()
        self.partitions.clear()

    def schedule_sync(self) -> None:
        if not self.sync_scheduled and not self.stopping:
            self.sync_scheduled = True
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self.sync_topics()))

    async def sync_topics(self) -> None:
        """Bring the hosted partition groups in line with the applied topic descriptors."""
        self.sync_scheduled = False
        if self.stopping:
            # Scheduled before `stop` and run after it: a group hosted now would outlive
            # the node and keep its directory locked from the node's next start.
            return
        current: dict[str, wire.TopicDescriptor] = {}
        for key, value in self.metadata.data.items():
            if key.startswith(TOPIC_PREFIX):
                descriptor = decode_descriptor(value)
                current[descriptor.name] = descriptor
        for name in sorted(set(self.topics) - set(current)):
            await self.drop_topic(self.topics.pop(name))
        for name, descriptor in sorted(current.items()):
            known = self.topics.get(name)
            if known is not None and known.created_ms != descriptor.created_ms:
                await self.drop_topic(known)  # deleted and created again meanwhile
                known = None
            if known is None:
                self.topics[name] = descriptor
                await self.host_topic(descriptor)

    async def host_topic(self, descriptor: wire.TopicDescriptor) -> None:
        node = self.node
        node.learn_addresses(descriptor.addresses)
        if is_ledger_topic(descriptor):
            self.ledger_topics.host(descriptor)
            return
        if is_ha_topic(descriptor):
            self.ha_topics.host(descriptor)
            return
        settings = GroupSettings(
            tick_seconds=node.settings.tick_ms / 1000,
            snapshot_entries=NEVER_SNAPSHOT_ENTRIES,
            snapshot_trailing_entries=0,
            fsync=node.settings.fsync,
        )
        hosted_here = [
            (partition, replicas)
            for partition, replicas in enumerate(descriptor.replicas)
            if node.node_id in replicas
        ]
        for first in range(0, len(hosted_here), HOST_PARTITIONS_PER_TURN):
            chunk = hosted_here[first : first + HOST_PARTITIONS_PER_TURN]
            directories = [
                self.partition_directory(descriptor, partition) for partition, _ in chunk
            ]
            # Opening a group's files creates and syncs them: a thousand partitions would hold
            # the event loop for seconds, and every other group (the metadata group too)
            # would miss its heartbeats meanwhile. So a worker thread opens them, a chunk at
            # a time, and the loop only starts the groups.
            stores = await asyncio.to_thread(open_log_stores, directories, settings)
            if self.stopping or self.topics.get(descriptor.name) is not descriptor:
                for store in stores:
                    store.close()
                return
            for (partition, replicas), directory, store in zip(
                chunk, directories, stores, strict=True
            ):
                self.start_partition(descriptor, partition, replicas, directory, store, settings)

    def partition_directory(self, descriptor: wire.TopicDescriptor, partition: int) -> Path:
        gid = group_id(descriptor, partition)
        return Path(self.node.settings.data_dir) / "streams" / gid.replace("/", "-")

    def start_partition(
        self,
        descriptor: wire.TopicDescriptor,
        partition: int,
        replicas: list[str],
        directory: Path,
        store: LogStore,
        settings: GroupSettings,
    ) -> None:
        node = self.node
        machine = NotifyingPartitionMachine()
        gid = group_id(descriptor, partition)
        group = GroupRunner(
            gid,
            node.raft_config(),
            directory,
            machine,
            node.send,
            Configuration(voters=tuple(sorted(replicas))),
            node.executor,
            settings,
            node.ticker,
            hooks=node.observability.hooks_for(gid),
            store=store,
            background=node.sync_background,
        )
        hosted = HostedPartition(descriptor, partition, group, machine, directory)
        group.on_snapshot_saved = self.cut_done_callback(hosted)
        node.register_group(gid, group)
        self.partitions[(descriptor.name, partition)] = hosted
        group.start()
        if replicas[0] == node.node_id and len(replicas) > 1:
            # The first replica campaigns at once: a new topic's partitions elect in a
            # round trip or two, not in an election storm of every group at once.
            group.campaign()
        log.info("hosting %s partition %d (group %s)", descriptor.name, partition, gid)

    async def drop_topic(self, descriptor: wire.TopicDescriptor) -> None:
        if is_ledger_topic(descriptor):
            self.ledger_topics.drop(descriptor)
            return
        if is_ha_topic(descriptor):
            self.ha_topics.drop(descriptor)
            return
        for partition in range(len(descriptor.replicas)):
            hosted = self.partitions.get((descriptor.name, partition))
            if hosted is None or hosted.descriptor.created_ms != descriptor.created_ms:
                continue
            del self.partitions[(descriptor.name, partition)]
            self.node.groups.pop(hosted.group.group_id, None)
            self.node.observability.forget(hosted.group.group_id, descriptor.name)
            await hosted.group.stop()
            await asyncio.get_running_loop().run_in_executor(
                None, shutil.rmtree, hosted.directory, True
            )
            log.info("dropped %s partition %d", descriptor.name, partition)

    def partition_count(self, topic: str) -> int:
        """The topic's partitions as this node knows them; 0 for a topic it does not know."""
        descriptor = self.topics.get(topic)
        return 0 if descriptor is None else len(descriptor.replicas)

    # --- retention ----------------------------------------------------------------------

    async def enforce_retention_forever(self) -> None:
        while not self.stopping:
            await asyncio.sleep(RETENTION_CHECK_SECONDS)
            now_ms = int(time.time() * 1000)
            self.ledger_topics.trim()
            for hosted in list(self.partitions.values()):
                settings = hosted.descriptor.settings
                if settings.retention_bytes < 0 and settings.retention_ms < 0:
                    continue
                checkpoint = hosted.machine.retention_cut(
                    now_ms, settings.retention_bytes, settings.retention_ms
                )
                if checkpoint is not None:
                    hosted.group.snapshot_at(
                        checkpoint.index, hosted.machine.encode_checkpoint(checkpoint)
                    )

    def cut_done_callback(self, hosted: HostedPartition) -> Callable[[SnapshotMeta], None]:
        def cut_done(meta: SnapshotMeta) -> None:
            hosted.machine.forget_below(hosted.machine.checkpoint_at_or_below(meta.index))

        return cut_done

    # --- requests -----------------------------------------------------------------------

    def handle(self, request: wire.ClientRequest, reply: Replier) -> None:
        if isinstance(request, wire.CreateTopic):
            self.create_topic(request, reply)
        elif isinstance(request, wire.DeleteTopic):
            self.delete_topic(request, reply)
        elif isinstance(request, wire.ListTopics):
            reply(
                wire.TopicList(
                    request_id=request.request_id,
                    topics=[self.topics[n] for n in sorted(self.topics)],
                    leaders=self.partition_leaders() if request.with_leaders else {},
                )
            )
        elif isinstance(request, wire.Produce):
            self.produce(request, reply)
        elif isinstance(request, wire.ProduceMany):
            self.produce_many(request, reply)
        elif isinstance(request, wire.Fetch):
            self.fetch(request, reply)
        elif isinstance(request, wire.PartitionStatusRequest):
            self.partition_status(request, reply)
        elif isinstance(request, wire.HABrokerStatusRequest):
            self.ha_topics.broker_status(request, reply)
        else:
            error(
                reply,
                request.request_id,
                wire.ErrorCode.BAD_REQUEST,
                f"{type(request).__name__} is not a stream request",
            )

    def metadata_leader_or_refuse(self, request_id: int, reply: Replier) -> GroupRunner | None:
        group = self.metadata_group()
        if not group.core.is_leader:
            reply(
                wire.ErrorResponse(
                    request_id=request_id,
                    code=wire.ErrorCode.NOT_LEADER,
                    message=f"node {self.node.node_id} does not lead the metadata group",
                    leader_hint=self.node.address_of(group.core.leader_id),
                )
            )
            return None
        return group

    def propose_metadata(
        self,
        group: GroupRunner,
        command: wire.KVCommand,
        done: Callable[[wire.KVCommandResult], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        entry = KVEntry(
            timestamp_ms=int(time.time() * 1000),
            batches=[
                ClientBatch(
                    client_id=f"admin/{self.node.node_id}/{uuid.uuid4().hex}",
                    first_unacknowledged=0,
                    commands=[command],
                )
            ],
        )
        try:
            future = group.propose(encode_entry(entry))
        except QuorumLogError as refusal:
            failed(refusal)
            return

        def answer(result: asyncio.Future[Any]) -> None:
            problem = result.exception()
            if problem is not None:
                failed(problem)
            else:
                done(result.result()[0][0])

        future.add_done_callback(answer)

    def create_topic(self, request: wire.CreateTopic, reply: Replier) -> None:
        group = self.metadata_leader_or_refuse(request.request_id, reply)
        if group is None:
            return
        voters = list(group.core.configuration.voters)
        problem = check_settings(request.name, request.settings, len(voters))
        if problem is not None:
            error(reply, request.request_id, wire.ErrorCode.BAD_REQUEST, problem)
            return
        descriptor = wire.TopicDescriptor(
            name=request.name,
            settings=request.settings,
            replicas=assign_replicas(
                voters, request.settings.partitions, request.settings.replication
            ),
            addresses={v: a for v, a in self.node.addresses.items() if v in voters},
            created_ms=self.next_created_ms(),
        )
        command = wire.KVCommand(
            sequence=1,
            op="cas",
            key=topic_key(request.name),
            value=encode_descriptor(descriptor),
            expected=None,
        )

        def done(result: wire.KVCommandResult) -> None:
            if result.ok:
                reply(
                    wire.Done(request_id=request.request_id, detail=f"created topic {request.name}")
                )
            else:
                error(
                    reply,
                    request.request_id,
                    wire.ErrorCode.ALREADY_EXISTS,
                    f"topic {request.name!r} already exists",
                )

        self.propose_metadata(
            group, command, done, lambda problem: self.refuse(reply, request.request_id, problem)
        )

    def next_created_ms(self) -> int:
        self.last_created_ms = max(int(time.time() * 1000), self.last_created_ms + 1)
        return self.last_created_ms

    def delete_topic(self, request: wire.DeleteTopic, reply: Replier) -> None:
        group = self.metadata_leader_or_refuse(request.request_id, reply)
        if group is None:
            return
        command = wire.KVCommand(sequence=1, op="delete", key=topic_key(request.name))

        def done(result: wire.KVCommandResult) -> None:
            if result.value is None:
                error(
                    reply,
                    request.request_id,
                    wire.ErrorCode.NOT_FOUND,
                    f"topic {request.name!r} does not exist",
                )
            else:
                reply(
                    wire.Done(request_id=request.request_id, detail=f"deleted topic {request.name}")
                )

        self.propose_metadata(
            group, command, done, lambda problem: self.refuse(reply, request.request_id, problem)
        )

    def hosted_or_refuse(
        self, request_id: int, topic: str, partition: int, reply: Replier
    ) -> HostedPartition | None:
        hosted = self.partitions.get((topic, partition))
        if hosted is not None:
            return hosted
        descriptor = self.topics.get(topic)
        if descriptor is None:
            error(reply, request_id, wire.ErrorCode.NOT_FOUND, f"topic {topic!r} does not exist")
        elif not 0 <= partition < len(descriptor.replicas):
            error(
                reply,
                request_id,
                wire.ErrorCode.NOT_FOUND,
                f"topic {topic!r} has no partition {partition}",
            )
        else:
            replicas = descriptor.replicas[partition]
            error(
                reply,
                request_id,
                wire.ErrorCode.NOT_FOUND,
                f"node {self.node.node_id} does not host {topic}/{partition}; "
                f"its replicas are {', '.join(replicas)}",
            )
        return None

    def partition_leaders(self) -> dict[str, list[str]]:
        """Topic → the leader of each partition this node hosts a Raft replica of ("" where
        it hosts none or knows no leader): ListTopics.with_leaders."""
        leaders: dict[str, list[str]] = {}
        for name, descriptor in self.topics.items():
            known = []
            for partition in range(len(descriptor.replicas)):
                hosted = self.partitions.get((name, partition))
                leader_id = None if hosted is None else hosted.group.core.leader_id
                known.append(leader_id or "")
            leaders[name] = known
        return leaders

    def produce(self, request: wire.Produce, reply: Replier) -> None:
        size = batch_bytes(request.records)  # once: it costs about what encoding does
        reply = self.counting_produce(request, reply, size)
        ledger_partition = self.ledger_topics.serves(request.topic, request.partition)
        if ledger_partition is not None:
            if not refuse_batch(request, reply, size):
                self.ledger_topics.produce(ledger_partition, request, reply)
            return
        ha_partition = self.ha_topics.serves(request.topic, request.partition)
        if ha_partition is not None:
            if not refuse_batch(request, reply, size):
                self.ha_topics.produce(ha_partition, request, reply)
            return
        hosted = self.hosted_or_refuse(request.request_id, request.topic, request.partition, reply)
        if hosted is None:
            return
        group = hosted.group
        if not group.core.is_leader:
            self.refuse(
                reply,
                request.request_id,
                NotLeaderError(self.node.node_id, group.core.leader_id),
                group,
            )
            return
        if refuse_batch(request, reply, size):
            return
        batch = wire.RecordBatch(
            producer_id=request.producer_id,
            base_sequence=request.base_sequence,
            timestamp_ms=int(time.time() * 1000),
            records=request.records,
            compression=request.compression,
            compressed=request.compressed,
            record_count=request.record_count if request.compression != "none" else -1,
        )
        try:
            future = group.propose(wire.encode_record_batch(batch))
        except QuorumLogError as refusal:
            self.refuse(reply, request.request_id, refusal, group)
            return

        def answer(result: asyncio.Future[Any]) -> None:
            problem = result.exception()
            if problem is not None:
                self.refuse(reply, request.request_id, problem, group)
                return
            outcome = result.result()
            if isinstance(outcome, OutOfOrderSequenceError):
                error(reply, request.request_id, wire.ErrorCode.OUT_OF_RANGE, str(outcome))
            elif isinstance(outcome, ProduceOutcome):
                reply(
                    wire.ProduceResult(
                        request_id=request.request_id,
                        base_offset=outcome.base_offset,
                        count=outcome.count,
                        duplicate=outcome.duplicate,
                        timestamp_ms=batch.timestamp_ms,
                    )
                )
            else:
                error(reply, request.request_id, wire.ErrorCode.INTERNAL, str(outcome))

        future.add_done_callback(answer)

    def produce_many(self, request: wire.ProduceMany, reply: Replier) -> None:
        """Serve every part as a Produce of its own; each answers under its own request id."""
        if len(request.parts) > PRODUCE_PARTS_MAX:
            error(
                reply,
                request.request_id,
                wire.ErrorCode.BAD_REQUEST,
                f"{len(request.parts)} batches in one frame; at most {PRODUCE_PARTS_MAX}",
            )
            return
        for part in request.parts:
            self.produce(part, reply)

    def fetch(self, request: wire.Fetch, reply: Replier) -> None:
        ledger_partition = self.ledger_topics.serves(request.topic, request.partition)
        if ledger_partition is not None:
            self.ledger_topics.fetch(ledger_partition, request, reply)
            return
        ha_partition = self.ha_topics.serves(request.topic, request.partition)
        if ha_partition is not None:
            self.ha_topics.fetch(ha_partition, request, reply)
            return
        hosted = self.hosted_or_refuse(request.request_id, request.topic, request.partition, reply)
        if hosted is None:
            return
        if request.leader_only and not hosted.group.core.is_leader:
            core = hosted.group.core
            self.refuse(
                reply,
                request.request_id,
                NotLeaderError(core.node_id, core.leader_id),
                hosted.group,
            )
            return
        machine = hosted.machine
        if (
            request.max_wait_ms > 0
            and request.offset == machine.next_offset
            and hold_fetch(
                machine, request.max_wait_ms, lambda: self.answer_fetch(hosted, request, reply)
            )
        ):
            return  # held: answered when records arrive or the wait ends
        self.answer_fetch(hosted, request, reply)

    def answer_fetch(self, hosted: HostedPartition, request: wire.Fetch, reply: Replier) -> None:
        machine = hosted.machine
        records_max = max(1, min(request.records_max, FETCH_RECORDS_MAX))
        try:
            located = machine.batches_from(request.offset, records_max, request.bytes_max)
            store = hosted.group.store
            batches = [
                wire.FetchedBatch(base_offset=base, data=store.entry(index).data)
                for index, base in located
            ]
        except OffsetOutOfRangeError as problem:
            error(reply, request.request_id, wire.ErrorCode.OUT_OF_RANGE, str(problem))
            return
        except QuorumLogError as problem:  # the store refused a read: corruption, say so
            error(reply, request.request_id, wire.ErrorCode.INTERNAL, str(problem))
            return
        reply(
            wire.FetchResult(
                request_id=request.request_id,
                begin_offset=machine.begin_offset,
                end_offset=machine.next_offset,
                batches=batches,
            )
        )
        if located:
            # Records from the offset asked to the end of the last batch (once per fetch).
            last_base = located[-1][1]
            last_end = last_base + machine.batch_counts[machine.locate(last_base)]
            self.node.observability.topic_traffic.fetched(
                request.topic,
                last_end - max(request.offset, machine.begin_offset),
                sum(len(batch.data) for batch in batches),
            )

    def counting_produce(self, request: wire.Produce, reply: Replier, size: int) -> Replier:
        """`reply`, counting an acknowledged batch into the node's topic metrics (every
        storage mode answers a produce with a `ProduceResult`)."""
        traffic = self.node.observability.topic_traffic

        def counted(frame: wire.Frame) -> None:
            if isinstance(frame, wire.ProduceResult) and not frame.duplicate:
                traffic.produced(request.topic, frame.count, size)
            reply(frame)

        return counted

    def partition_status(self, request: wire.PartitionStatusRequest, reply: Replier) -> None:
        ledger_partition = self.ledger_topics.serves(request.topic, request.partition)
        if ledger_partition is not None:
            self.ledger_topics.partition_status(ledger_partition, request, reply)
            return
        ha_partition = self.ha_topics.serves(request.topic, request.partition)
        if ha_partition is not None:
            self.ha_topics.partition_status(ha_partition, request, reply)
            return
        hosted = self.hosted_or_refuse(request.request_id, request.topic, request.partition, reply)
        if hosted is None:
            return
        core = hosted.group.core
        replicas = hosted.descriptor.replicas[hosted.partition]
        in_sync: list[str] = []
        if core.leader is not None:
            in_sync = [core.node_id] + [
                peer
                for peer, progress in sorted(core.leader.progress.items())
                if progress.match_index >= core.commit_index
            ]
        reply(
            wire.PartitionStatus(
                request_id=request.request_id,
                topic=request.topic,
                partition=request.partition,
                node_id=self.node.node_id,
                leader=core.leader_id,
                replicas=list(replicas),
                in_sync=sorted(in_sync),
                begin_offset=hosted.machine.begin_offset,
                end_offset=hosted.machine.next_offset,
                term=core.term,
                commit_index=core.commit_index,
            )
        )

    def refuse(
        self,
        reply: Replier,
        request_id: int,
        problem: BaseException,
        group: GroupRunner | None = None,
    ) -> None:
        code = error_code(problem)
        hint = None
        if code is wire.ErrorCode.NOT_LEADER:
            group = group or self.metadata_group()
            hint = self.node.address_of(group.core.leader_id)
        reply(
            wire.ErrorResponse(
                request_id=request_id, code=code, message=str(problem), leader_hint=hint
            )
        )


def refuse_batch(request: wire.Produce, reply: Replier, size: int | None = None) -> bool:
    """Refuse an empty or oversized batch (True: refused); `size`: its `batch_bytes`, if
    the caller measured it already."""
    if request.compression != "none":
        problem = compressed_batch_problem(request, PRODUCE_RECORDS_MAX, PRODUCE_BYTES_MAX)
        if problem is not None:
            error(reply, request.request_id, *problem)
        return problem is not None
    if not request.records:
        error(reply, request.request_id, wire.ErrorCode.BAD_REQUEST, "no records to produce")
        return True
    if size is None:
        size = batch_bytes(request.records)
    if len(request.records) > PRODUCE_RECORDS_MAX or size > PRODUCE_BYTES_MAX:
        error(
            reply,
            request.request_id,
            wire.ErrorCode.TOO_LARGE,
            f"{len(request.records)} records of {size} bytes; at most "
            f"{PRODUCE_RECORDS_MAX} records and {PRODUCE_BYTES_MAX} bytes per batch",
        )
        return True
    return False


def batch_bytes(records: list[wire.Record]) -> int:
    """Bytes of the records' values and keys. Summed by C loops (map, filter): this runs
    for every record produced, and a generator expression cost twice as much."""
    values = sum(map(len, filter(None, map(RECORD_VALUE, records))))  # None: a tombstone
    return values + sum(map(len, filter(None, map(RECORD_KEY, records))))


RECORD_VALUE = operator.attrgetter("value")
RECORD_KEY = operator.attrgetter("key")


def error(reply: Replier, request_id: int, code: wire.ErrorCode, message: str) -> None:
    reply(wire.ErrorResponse(request_id=request_id, code=code, message=message))

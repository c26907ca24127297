"""An in-process stand-in for a cluster serving streams, speaking the real wire protocol.

It extends the KV fake (tests/unit/kv/fake_cluster.py). Consumer groups are served by the
real `GroupCoordinatorMachine` at the leader, one entry per request.

Each partition is one real `PartitionMachine` (so sequence dedup is the real
rule) plus a dict of its encoded batches; every node replicates every partition and reads
the same state, and one node per partition is its leader. Knobs let a test move a
partition's leader, make the leader apply a produce without answering, inject error codes,
or cut a partition by retention.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import FEATURE_LEVEL
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    QUERY_TYPES,
    GroupEntry,
    JoinGroup,
    decode_commands,
    encode_entry,
    encode_results,
)
from quorumlog.stream.partition import (
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionMachine,
    ProduceOutcome,
)
from quorumlog.stream.topics import TOPIC_PREFIX, encode_descriptor
from tests.unit.kv.fake_cluster import FakeCluster, FakeNode


class FakePartition:
    def __init__(self, leader_id: str | None) -> None:
        self.machine = PartitionMachine(checkpoint_entries=1)
        self.entries: dict[int, bytes] = {}
        self.next_index = 1
        self.leader_id = leader_id

    def append(self, batch: wire.RecordBatch) -> ProduceOutcome | Exception:
        index = self.next_index
        self.next_index += 1
        data = wire.encode_record_batch(batch)
        self.entries[index] = data
        return self.machine.apply(index, data)

    def cut(self, retention_bytes: int) -> None:
        checkpoint = self.machine.retention_cut(int(time.time() * 1000), retention_bytes, -1)
        if checkpoint is not None:
            self.machine.forget_below(checkpoint)


class FakeStreamNode(FakeNode):
    cluster: FakeStreamCluster

    def __init__(self, cluster: FakeStreamCluster, node_id: str) -> None:
        super().__init__(cluster, node_id)
        self.produce_many = True
        self.unanswered_produces = 0
        """Apply this many next produces without answering them."""
        self.produce_errors: list[wire.ErrorCode | None] = []
        """Answer the next produces with these codes in turn; None: apply it, answer nothing."""
        self.stale_topic_list = False
        """Answer ListTopics as a follower that has not applied any topic yet."""
        self.refuse_produce_frames: wire.ErrorCode | None = None
        """Refuse every ProduceMany as a whole with this code (as auth would)."""
        self.lists_leaders = True
        """Answer ListTopics.with_leaders (False: as a node from before it, which ignores it)."""
        self.produce_answer_delays: dict[tuple[str, int], float] = {}
        """Answer the next produce to this (topic, partition) only after so many seconds
        (as a busy leader would); it is applied at once. One produce each."""

    def produces(self) -> list[wire.Produce]:
        """Every produce received, those that came as parts of a ProduceMany included."""
        found: list[wire.Produce] = []
        for frame in self.requests:
            if isinstance(frame, wire.Produce):
                found.append(frame)
            elif isinstance(frame, wire.ProduceMany):
                found += frame.parts
        return found

    def handle(self, frame: wire.Frame, reply: Any) -> None:
        if isinstance(frame, wire.CreateTopic | wire.DeleteTopic):
            if not self.is_leader:
                reply(self.not_leader(frame.request_id))
            else:
                reply(self.cluster.change_topic(frame))
        elif isinstance(frame, wire.ListTopics):
            topics = [] if self.stale_topic_list else list(self.cluster.topics.values())
            leaders = self.cluster.leaders() if frame.with_leaders and self.lists_leaders else {}
            reply(wire.TopicList(request_id=frame.request_id, topics=topics, leaders=leaders))
        elif isinstance(frame, wire.Produce):
            self.produce(frame, reply)
        elif isinstance(frame, wire.ProduceMany):
            if self.refuse_produce_frames is not None:
                reply(wire.ErrorResponse(frame.request_id, self.refuse_produce_frames, "refused"))
                return
            for part in frame.parts:
                self.produce(part, reply)
        elif isinstance(frame, wire.Fetch):
            self.fetch(frame, reply)
        elif isinstance(frame, wire.PartitionStatusRequest):
            self.status_of(frame, reply)
        elif isinstance(frame, wire.GroupCoordinatorRequest):
            if not self.is_leader:
                reply(self.not_leader(frame.request_id))
            else:
                reply(self.cluster.coordinate(frame))
        elif isinstance(frame, wire.KVRead) and (frame.stale or self.is_leader):
            # Topic descriptors live in the KV, as the real metadata group keeps them.
            values = [self.cluster.read_key(key) for key in frame.keys]
            reply(wire.KVReadResult(request_id=frame.request_id, values=values))
        else:
            super().handle(frame, reply)

    def partition_or_refuse(
        self, request_id: int, topic: str, partition: int, reply: Any
    ) -> FakePartition | None:
        found = self.cluster.partitions.get((topic, partition))
        if found is None:
            reply(
                wire.ErrorResponse(request_id, wire.ErrorCode.NOT_FOUND, f"no {topic}/{partition}")
            )
        return found

    def produce(self, frame: wire.Produce, reply: Any) -> None:
        found = self.partition_or_refuse(frame.request_id, frame.topic, frame.partition, reply)
        if found is None:
            return
        if found.leader_id != self.node_id:
            leader = self.cluster.nodes.get(found.leader_id or "")
            reply(
                wire.ErrorResponse(
                    frame.request_id,
                    wire.ErrorCode.NOT_LEADER,
                    f"{self.node_id} does not lead {frame.topic}/{frame.partition}",
                    leader_hint=None if leader is None else leader.address,
                )
            )
            return
        answer = True
        if self.produce_errors:
            code = self.produce_errors.pop(0)
            if code is not None:
                reply(wire.ErrorResponse(frame.request_id, code, f"injected {code.value}"))
                return
            answer = False
        batch = wire.RecordBatch(
            frame.producer_id, frame.base_sequence, self.cluster.clock_ms, frame.records
        )
        outcome = found.append(batch)
        if self.unanswered_produces:
            self.unanswered_produces -= 1
            return
        if not answer:
            return
        if isinstance(outcome, OutOfOrderSequenceError):
            reply(wire.ErrorResponse(frame.request_id, wire.ErrorCode.OUT_OF_RANGE, str(outcome)))
        elif isinstance(outcome, ProduceOutcome):
            result = wire.ProduceResult(
                frame.request_id,
                outcome.base_offset,
                outcome.count,
                outcome.duplicate,
                batch.timestamp_ms,
            )
            delay_seconds = self.produce_answer_delays.pop((frame.topic, frame.partition), None)
            if delay_seconds is None:
                reply(result)
            else:
                asyncio.get_running_loop().call_later(delay_seconds, reply, result)
        else:
            reply(wire.ErrorResponse(frame.request_id, wire.ErrorCode.INTERNAL, str(outcome)))

    def fetch(self, frame: wire.Fetch, reply: Any) -> None:
        found = self.partition_or_refuse(frame.request_id, frame.topic, frame.partition, reply)
        if found is None:
            return
        machine = found.machine
        try:
            located = machine.batches_from(frame.offset, frame.records_max, frame.bytes_max)
        except OffsetOutOfRangeError as problem:
            reply(wire.ErrorResponse(frame.request_id, wire.ErrorCode.OUT_OF_RANGE, str(problem)))
            return
        reply(
            wire.FetchResult(
                request_id=frame.request_id,
                begin_offset=machine.begin_offset,
                end_offset=machine.next_offset,
                batches=[wire.FetchedBatch(base, found.entries[index]) for index, base in located],
            )
        )

    def status_of(self, frame: wire.PartitionStatusRequest, reply: Any) -> None:
        found = self.partition_or_refuse(frame.request_id, frame.topic, frame.partition, reply)
        if found is None:
            return
        replicas = list(self.cluster.nodes)
        reply(
            wire.PartitionStatus(
                request_id=frame.request_id,
                topic=frame.topic,
                partition=frame.partition,
                node_id=self.node_id,
                leader=found.leader_id,
                replicas=replicas,
                in_sync=replicas,
                begin_offset=found.machine.begin_offset,
                end_offset=found.machine.next_offset,
                term=1,
                commit_index=found.next_index - 1,
            )
        )


class FakeStreamCluster(FakeCluster):
    nodes: dict[str, FakeStreamNode]  # type: ignore[assignment]

    def __init__(self, node_count: int = 3) -> None:
        super().__init__(node_count)
        self.nodes = {
            f"n{number}": FakeStreamNode(self, f"n{number}") for number in range(1, node_count + 1)
        }
        self.topics: dict[str, wire.TopicDescriptor] = {}
        self.partitions: dict[tuple[str, int], FakePartition] = {}
        self.clock_ms = 1_700_000_000_000
        self.coordinator = GroupCoordinatorMachine()
        self.coordinator.raise_level(FEATURE_LEVEL)  # every node runs this release
        self.coordinator_index = 0

    def coordinate(self, frame: wire.GroupCoordinatorRequest) -> wire.Frame:
        commands = decode_commands(frame.commands)
        if all(isinstance(command, QUERY_TYPES) for command in commands):
            results = [self.coordinator.execute(command) for command in commands]
        else:
            filled = [
                msgspec.structs.replace(
                    command,
                    partition_counts={
                        t: len(self.topics[t].replicas) for t in command.topics if t in self.topics
                    },
                )
                if isinstance(command, JoinGroup)
                else command
                for command in commands
            ]
            self.coordinator_index += 1
            entry = encode_entry(GroupEntry(self.clock_ms, [filled]))
            [results] = self.coordinator.apply(self.coordinator_index, entry)
        return wire.GroupCoordinatorResponse(frame.request_id, encode_results(results))

    def leaders(self) -> dict[str, list[str]]:
        return {
            name: [
                self.partitions[(name, partition)].leader_id or ""
                for partition in range(len(descriptor.replicas))
            ]
            for name, descriptor in self.topics.items()
        }

    def node(self, node_id: str) -> FakeStreamNode:
        return self.nodes[node_id]

    def partition(self, topic: str, partition: int) -> FakePartition:
        return self.partitions[(topic, partition)]

    def read_key(self, key: str) -> str | None:
        if key.startswith(TOPIC_PREFIX):
            descriptor = self.topics.get(key.removeprefix(TOPIC_PREFIX))
            return None if descriptor is None else encode_descriptor(descriptor)
        [value] = self.machine.read([key])
        return value

    def change_topic(self, frame: wire.CreateTopic | wire.DeleteTopic) -> wire.Frame:
        name = frame.name
        if isinstance(frame, wire.DeleteTopic):
            if self.topics.pop(name, None) is None:
                return wire.ErrorResponse(frame.request_id, wire.ErrorCode.NOT_FOUND, name)
            for key in [key for key in self.partitions if key[0] == name]:
                del self.partitions[key]
            return wire.Done(frame.request_id)
        if name in self.topics:
            return wire.ErrorResponse(frame.request_id, wire.ErrorCode.ALREADY_EXISTS, name)
        node_ids = list(self.nodes)
        replicas = [
            [node_ids[(p + shift) % len(node_ids)] for shift in range(frame.settings.replication)]
            for p in range(frame.settings.partitions)
        ]
        self.topics[name] = wire.TopicDescriptor(
            name=name,
            settings=frame.settings,
            replicas=replicas,
            addresses={node.node_id: node.address for node in self.nodes.values()},
            created_ms=self.clock_ms,
        )
        for partition in range(frame.settings.partitions):
            self.partitions[(name, partition)] = FakePartition(replicas[partition][0])
        return wire.Done(frame.request_id)

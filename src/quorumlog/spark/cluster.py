"""The few requests the Spark source and sink send, over the KV client's request loop.

`KVClient.call` is a general request loop (find the leader, follow NOT_LEADER hints, back
off, retry until the deadline, tell "unavailable" from "unknown outcome"), so the Spark
side speaks the wire protocol through it instead of building per-record client objects:
a Fetch answer stays as encoded record batches until `arrow.py` turns them into columns.

Each topic partition has its own leader, so each gets its own client (its own leader
cache), dialling the partition's replicas first. One `ClusterAccess` lives in one Python
process (the driver's planner, or one executor task) and is closed when that work ends.
"""

from __future__ import annotations

import time
from types import TracebackType

from quorumlog.codec import wire
from quorumlog.errors import RequestRejectedError, UnavailableError
from quorumlog.kv.client import KVClient
from quorumlog.spark.errors import OptionError
from quorumlog.spark.offsets import PartitionBounds, TopicPartition
from quorumlog.spark.options import ConnectionOptions

NO_LEADER_PAUSE_SECONDS = 0.05
"""How long to wait before asking again when a partition has no leader (an election)."""


class ClusterAccess:
    """Blocking access to one cluster; see the module docstring."""

    def __init__(self, connection: ConnectionOptions, client_name: str = "spark") -> None:
        self.connection = connection
        self.client_name = client_name
        self.general = self.new_client(connection.endpoints)
        self.partition_clients: dict[TopicPartition, KVClient] = {}
        self.descriptors: dict[str, wire.TopicDescriptor] = {}

    def new_client(self, endpoints: list[str]) -> KVClient:
        return KVClient(
            endpoints,
            timeout=self.connection.timeout_seconds,
            cluster_id=self.connection.cluster_id,
            client_id=f"{self.client_name}-{time.monotonic_ns()}",
        )

    def check_reachable(self) -> None:
        """OptionError naming `endpoints` unless some node answers a status request."""
        try:
            self.general.status()
        except UnavailableError as error:
            raise OptionError("endpoints", self.unreachable(error)) from None

    def unreachable(self, error: UnavailableError) -> str:
        return (
            f"no node of cluster {self.connection.cluster_id!r} answered at "
            f"{','.join(self.connection.endpoints)} ({error})"
        )

    # --- topics -----------------------------------------------------------------------

    def list_topics(self) -> dict[str, wire.TopicDescriptor]:
        """Every topic; OptionError naming `endpoints` when no node answers."""
        try:
            answer = self.general.call(
                "list topics",
                lambda request_id: wire.ListTopics(request_id=request_id),
                wire.TopicList,
                side_effects=False,
                at_leader=False,
            )
        except UnavailableError as error:
            raise OptionError("endpoints", self.unreachable(error)) from None
        self.descriptors = {topic.name: topic for topic in answer.topics}
        return dict(self.descriptors)

    def describe_topics(self, topics: list[str], option: str) -> dict[str, wire.TopicDescriptor]:
        """The named topics; OptionError naming `option` if one does not exist."""
        known = self.list_topics()
        missing = [topic for topic in topics if topic not in known]
        if missing:
            existing = ", ".join(sorted(known)) or "none"
            raise OptionError(
                option, f"no topic named {', '.join(missing)} (existing topics: {existing})"
            )
        return {topic: known[topic] for topic in topics}

    def topic_partitions(self, topics: list[str], option: str) -> list[TopicPartition]:
        described = self.describe_topics(topics, option)
        return [
            (topic, partition)
            for topic in topics
            for partition in range(described[topic].settings.partitions)
        ]

    # --- partitions ---------------------------------------------------------------------

    def partition_client(self, topic_partition: TopicPartition) -> KVClient:
        client = self.partition_clients.get(topic_partition)
        if client is None:
            client = self.new_client(self.partition_endpoints(topic_partition))
            self.partition_clients[topic_partition] = client
        return client

    def partition_endpoints(self, topic_partition: TopicPartition) -> list[str]:
        """The partition's replicas first (one of them leads it), then the given endpoints."""
        topic, partition = topic_partition
        descriptor = self.descriptors.get(topic)
        endpoints: list[str] = []
        if descriptor is not None and partition < len(descriptor.replicas):
            for node_id in descriptor.replicas[partition]:
                address = descriptor.addresses.get(node_id)
                if address is not None:
                    endpoints.append(address)
        endpoints += [known for known in self.connection.endpoints if known not in endpoints]
        return endpoints

    def bounds(self, topic_partition: TopicPartition) -> PartitionBounds:
        """[begin, end) as the partition's leader sees it; end is the high watermark."""
        topic, partition = topic_partition
        client = self.partition_client(topic_partition)
        deadline = time.monotonic() + self.connection.timeout_seconds
        endpoint: str | None = None
        while True:
            status = client.call(
                f"status of {topic}/{partition}",
                lambda request_id: wire.PartitionStatusRequest(
                    request_id=request_id, topic=topic, partition=partition
                ),
                wire.PartitionStatus,
                side_effects=False,
                endpoint=endpoint,
            )
            if status.leader == status.node_id:
                return PartitionBounds(status.begin_offset, status.end_offset)
            # A follower's watermark may lag the leader's: ask the leader itself.
            leader_address = self.leader_address(topic, status.leader)
            if leader_address is not None and leader_address != endpoint:
                endpoint = leader_address
                continue
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"{topic}/{partition} has no leader (asked {status.node_id})"
                )
            endpoint = None
            time.sleep(NO_LEADER_PAUSE_SECONDS)  # an election is under way

    def leader_address(self, topic: str, leader: str | None) -> str | None:
        descriptor = self.descriptors.get(topic)
        if leader is None or descriptor is None:
            return None
        return descriptor.addresses.get(leader)

    def fetch(
        self, topic_partition: TopicPartition, offset: int, records_max: int, bytes_max: int
    ) -> wire.FetchResult:
        """Committed batches from `offset`; RequestRejectedError "out_of_range" below begin."""
        topic, partition = topic_partition
        return self.partition_client(topic_partition).call(
            f"fetch {topic}/{partition} at {offset}",
            lambda request_id: wire.Fetch(
                request_id=request_id,
                topic=topic,
                partition=partition,
                offset=offset,
                records_max=records_max,
                bytes_max=bytes_max,
            ),
            wire.FetchResult,
            side_effects=False,
        )

    def produce(
        self,
        topic_partition: TopicPartition,
        producer_id: str,
        base_sequence: int,
        records: list[wire.Record],
    ) -> wire.ProduceResult:
        """Append `records`; resending the same (producer id, base sequence) is deduplicated."""
        topic, partition = topic_partition
        return self.partition_client(topic_partition).call(
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
        )

    # --- the KV table -------------------------------------------------------------------

    def scan(self, start: str, end: str | None, limit: int, stale: bool) -> wire.KVScanResult:
        return self.general.call(
            f"scan from {start!r}",
            lambda request_id: wire.KVScan(
                request_id=request_id, start=start, end=end, limit=limit, stale=stale
            ),
            wire.KVScanResult,
            side_effects=False,
            at_leader=not stale,
        )

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        self.general.close()
        for client in self.partition_clients.values():
            client.close()
        self.partition_clients.clear()

    def __enter__(self) -> ClusterAccess:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def is_out_of_range(error: BaseException) -> bool:
    return isinstance(error, RequestRejectedError) and error.code == "out_of_range"

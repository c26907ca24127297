"""Admin: create, list, describe and delete topics.

    from quorumlog import Admin

    with Admin(["127.0.0.1:2379"]) as admin:
        admin.create_topic("events", partitions=3, replication=3)
        admin.describe_topic("events").partitions[0].leader

Topic changes go through the metadata group (any node takes them and a follower names
the leader); describe_topic asks each partition's replicas for their status.
"""

from __future__ import annotations

import asyncio

from quorumlog.codec.wire import (
    CreateTopic,
    DeleteTopic,
    Done,
    ErrorCode,
    TopicDescriptor,
    TopicSettings,
)
from quorumlog.errors import ClientError, RequestRejectedError
from quorumlog.stream.client_common import (
    BlockingClient,
    StreamTransport,
    TopicExistsError,
    TopicNotFoundError,
    leader_status,
)
from quorumlog.stream.records import PartitionDescription, TopicDescription
from quorumlog.stream.topics import PARTITIONS_MAX, STORAGE_LEDGER, TOPIC_NAME, storage_problem
from quorumlog.tls.config import TLSConfig


def check_topic_name(name: str) -> None:
    """The server's rule, checked here too so a bad name fails before any I/O."""
    if not TOPIC_NAME.match(name):
        raise ValueError(f"topic name {name!r} must be 1-200 of A-Z a-z 0-9 . _ -")


def check_topic_settings(settings: TopicSettings) -> None:
    if not 1 <= settings.partitions <= PARTITIONS_MAX:
        raise ValueError(f"partitions must be in [1, {PARTITIONS_MAX}], got {settings.partitions}")
    if settings.replication < 1:
        raise ValueError(f"replication must be at least 1, got {settings.replication}")
    for name, value in (
        ("retention_bytes", settings.retention_bytes),
        ("retention_ms", settings.retention_ms),
    ):
        if value < -1:
            raise ValueError(f"{name} must be -1 (unbounded) or at least 0, got {value}")
    problem = storage_problem(settings)
    if problem is not None:
        raise ValueError(problem)


class Admin(BlockingClient):
    """Topic administration. Blocking; safe to share between threads."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 10.0,
        cluster_id: str = "quorumlog",
        attempt_timeout_seconds: float | None = None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            thread_name="quorumlog-admin",
            user=user,
            password=password,
            tls=tls,
        )

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication: int = 3,
        retention_bytes: int = -1,
        retention_ms: int = -1,
        storage: str = "raft",
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
    ) -> None:
        """Create a topic. TopicExistsError if the name is taken (by a different topic).

        Retention: per partition, by size (`retention_bytes`) and by age (`retention_ms`);
        -1 leaves that bound off. Whole segments are cut, so a partition may keep a little
        more than the bound.

        `storage="raft"` (the default) makes each partition a Raft group of `replication`
        nodes. `storage="ledger"` makes each partition a list of ledgers on bookies
        (`ensemble`, `write_quorum`, `ack_quorum`: E, Qw, Qa), written by one owner node
        among `replication` candidates; retention drops whole ledgers."""
        check_topic_name(name)
        ledger = storage == STORAGE_LEDGER
        settings = TopicSettings(
            partitions=partitions,
            replication=replication,
            retention_bytes=retention_bytes,
            retention_ms=retention_ms,
            storage=storage,
            # Raft topics store the defaults, so equal settings compare equal on a retry.
            ensemble=ensemble if ledger else 3,
            write_quorum=write_quorum if ledger else 2,
            ack_quorum=ack_quorum if ledger else 2,
        )
        check_topic_settings(settings)
        self.run(create_topic(self.transport, name, settings))

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records. TopicNotFoundError if there is none."""
        self.run(delete_topic(self.transport, name))

    def list_topics(self) -> list[str]:
        """The names of all topics, sorted."""
        return sorted(self.run(self.transport.refresh_topics(fresh=True)))

    def topic_descriptor(self, name: str) -> TopicDescriptor:
        """The stored descriptor (settings, replicas and their addresses)."""
        return self.run(self.transport.topic(name, refresh=True))

    def describe_topic(self, name: str) -> TopicDescription:
        """Settings and, per partition, leader, replicas, in-sync replicas and offsets."""
        return self.run(describe_topic(self.transport, name))


async def create_topic(transport: StreamTransport, name: str, settings: TopicSettings) -> None:
    attempts = transport.attempts(f"create topic {name!r}", transport.kv.selector, True)
    try:
        await transport.call_with(
            attempts,
            lambda request_id: CreateTopic(request_id=request_id, name=name, settings=settings),
            Done,
            mark_leader=True,
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.ALREADY_EXISTS.value:
            raise
        # An earlier attempt of ours may have created it (its answer lost): then the topic
        # is there with exactly the settings asked for.
        existing = await transport.lookup_topic(name)
        if not attempts.earlier_maybe_delivered or existing is None:
            raise TopicExistsError(name) from None
        if existing.settings != settings:
            raise TopicExistsError(name) from None
    await transport.lookup_topic(name)


async def delete_topic(transport: StreamTransport, name: str) -> None:
    attempts = transport.attempts(f"delete topic {name!r}", transport.kv.selector, True)
    try:
        await transport.call_with(
            attempts,
            lambda request_id: DeleteTopic(request_id=request_id, name=name),
            Done,
            mark_leader=True,
        )
    except RequestRejectedError as error:
        if error.code != ErrorCode.NOT_FOUND.value:
            raise
        # NOT_FOUND after an attempt that may have deleted it: that was our delete.
        if not attempts.earlier_maybe_delivered:
            raise TopicNotFoundError(name) from None
    transport.topics.pop(name, None)
    for key in [key for key in transport.selectors if key[0] == name]:
        del transport.selectors[key]


async def describe_partition(
    transport: StreamTransport, descriptor: TopicDescriptor, partition: int
) -> PartitionDescription:
    replicas = list(descriptor.replicas[partition])
    try:
        status = await leader_status(transport, descriptor.name, partition)
    except ClientError as error:
        return PartitionDescription(partition, None, replicas, [], None, None, error=str(error))
    return PartitionDescription(
        partition=partition,
        leader=status.leader,
        replicas=replicas,
        in_sync=list(status.in_sync),
        begin_offset=status.begin_offset,
        end_offset=status.end_offset,
    )


async def describe_topic(transport: StreamTransport, name: str) -> TopicDescription:
    descriptor = await transport.topic(name, refresh=True)
    partitions = await asyncio.gather(
        *(
            describe_partition(transport, descriptor, partition)
            for partition in range(len(descriptor.replicas))
        )
    )
    settings = descriptor.settings
    ledger = settings.storage == STORAGE_LEDGER
    return TopicDescription(
        name=descriptor.name,
        partition_count=len(descriptor.replicas),
        replication=settings.replication,
        retention_bytes=settings.retention_bytes,
        retention_ms=settings.retention_ms,
        partitions=list(partitions),
        storage=settings.storage,
        ensemble=settings.ensemble if ledger else 0,
        write_quorum=settings.write_quorum if ledger else 0,
        ack_quorum=settings.ack_quorum if ledger else 0,
    )


__all__ = ["Admin", "check_topic_name"]

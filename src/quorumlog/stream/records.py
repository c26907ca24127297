"""What stream users see: records read back, metadata of records written, topic descriptions.

These are frozen msgspec structs: cheap to build (a consumer builds hundreds of thousands a
second) and safe to share between threads.
"""

from __future__ import annotations

import msgspec


class Record(msgspec.Struct, frozen=True, gc=False):
    """One committed record, as a consumer reads it.

    `timestamp` is in milliseconds since the Unix epoch: the producer's, if it set one,
    else the partition leader's clock when it appended the batch. (The field keeps the
    name outside tools read; the unit is milliseconds, as in Kafka.)

    Records are not tracked by the garbage collector (a consumer holds hundreds of
    thousands; tracking them made collections cost more than reading): do not put a
    record inside its own `headers`.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    """None for a tombstone (a record sent with value=None)."""
    timestamp: int
    headers: list[tuple[str, bytes]]


class RecordMetadata(msgspec.Struct, frozen=True, gc=False):
    """Where an acknowledged (committed) record landed.

    Not tracked by the garbage collector (a producer resolves one per record, hundreds of
    thousands a second): it holds a str and ints only, so it can be part of no cycle."""

    topic: str
    partition: int
    offset: int
    timestamp: int = -1
    """Milliseconds since the Unix epoch: the producer's stamp if it set one (Kafka's
    CreateTime), else the partition leader's (LogAppendTime); -1 if unknown (acks=0, or
    a storage that does not say)."""


class PartitionDescription(msgspec.Struct, frozen=True):
    """One partition as its replicas report it (in the style of kafka-topics --describe)."""

    partition: int
    leader: str | None
    """The leader's node id, or None if no replica knows of one (or none answered)."""
    replicas: list[str]
    in_sync: list[str]
    begin_offset: int | None
    """The first retained offset; None when no replica answered."""
    end_offset: int | None
    """One past the last committed offset (the high watermark); None when no replica
    answered."""
    error: str | None = None
    """Why the offsets are missing, when they are."""


class TopicDescription(msgspec.Struct, frozen=True):
    name: str
    partition_count: int
    replication: int
    retention_bytes: int
    """Per partition; -1: unbounded."""
    retention_ms: int
    """-1: unbounded."""
    partitions: list[PartitionDescription]
    storage: str = "raft"
    """"raft" or "ledger"."""
    ensemble: int = 0
    """Ledger storage: E, Qw, Qa (0 for Raft topics)."""
    write_quorum: int = 0
    ack_quorum: int = 0


__all__ = ["PartitionDescription", "Record", "RecordMetadata", "TopicDescription"]

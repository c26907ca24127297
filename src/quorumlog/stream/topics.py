"""Topic metadata: how descriptors are named and stored in the metadata (KV) group."""

from __future__ import annotations

import re

import msgspec

from quorumlog.codec.wire import TopicDescriptor, TopicSettings

TOPIC_PREFIX = "__topics/"
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
PARTITIONS_MAX = 1024
STORAGE_RAFT = "raft"
STORAGE_LEDGER = "ledger"
STORAGE_HA = "ha"
STORAGES = (STORAGE_RAFT, STORAGE_LEDGER, STORAGE_HA)


def topic_key(name: str) -> str:
    return TOPIC_PREFIX + name


def encode_descriptor(descriptor: TopicDescriptor) -> str:
    return msgspec.json.encode(descriptor).decode()


def decode_descriptor(text: str) -> TopicDescriptor:
    return msgspec.json.decode(text, type=TopicDescriptor)


def group_id(descriptor: TopicDescriptor, partition: int) -> str:
    """The Raft group of one partition. The creation time keeps a re-created topic's groups
    apart from the old ones' stray messages."""
    return f"{descriptor.name}@{descriptor.created_ms}/{partition}"


def check_settings(name: str, settings: TopicSettings, voters: int) -> str | None:
    """A one-line reason the topic cannot be created, or None."""
    if not TOPIC_NAME.match(name):
        return f"topic name {name!r} must be 1-200 of A-Z a-z 0-9 . _ -"
    if not 1 <= settings.partitions <= PARTITIONS_MAX:
        return f"partitions must be 1..{PARTITIONS_MAX}, got {settings.partitions}"
    if not 1 <= settings.replication <= voters:
        return f"replication must be 1..{voters} (the cluster's voters), got {settings.replication}"
    if settings.retention_bytes < -1 or settings.retention_ms < -1:
        return "retention_bytes and retention_ms must be -1 (unbounded) or >= 0"
    return storage_problem(settings)


def storage_problem(settings: TopicSettings) -> str | None:
    """Why the storage settings are wrong, or None. (Whether enough bookies are writable
    is known only when a ledger is created: NotEnoughBookiesError then.)"""
    if settings.storage not in STORAGES:
        return f"storage must be one of {', '.join(STORAGES)}, got {settings.storage!r}"
    if settings.storage == STORAGE_LEDGER and not (
        1 <= settings.ack_quorum <= settings.write_quorum <= settings.ensemble
    ):
        return (
            "ledger storage needs 1 <= ack_quorum <= write_quorum <= ensemble, got "
            f"ensemble {settings.ensemble}, write_quorum {settings.write_quorum}, "
            f"ack_quorum {settings.ack_quorum}"
        )
    if settings.storage == STORAGE_HA and (settings.retention_bytes, settings.retention_ms) != (
        -1,
        -1,
    ):
        return (
            "storage 'ha' keeps every record (its brokers do not delete by retention yet): "
            "leave retention_bytes and retention_ms at -1, or use storage 'raft' or 'ledger'"
        )
    return None


def is_ha_topic(descriptor: TopicDescriptor) -> bool:
    return descriptor.settings.storage == STORAGE_HA


def is_ledger_topic(descriptor: TopicDescriptor) -> bool:
    return descriptor.settings.storage == STORAGE_LEDGER


def assign_replicas(voters: list[str], partitions: int, replication: int) -> list[list[str]]:
    """Spread leaders-to-be and replicas round robin over the voters (deterministic)."""
    ordered = sorted(voters)
    count = len(ordered)
    return [
        [ordered[(partition + shift) % count] for shift in range(replication)]
        for partition in range(partitions)
    ]

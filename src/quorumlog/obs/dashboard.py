"""The dashboard: one static page (`static/dashboard.html`, no build step, no CDN) that polls
`/api/status` and re-renders; this module builds that JSON from the node's own state.

What one node knows, read on the loop at request time: the members (the "kv" group's
configuration, their addresses and whether this node hears them), every group it hosts
(role, leader, term, commit and applied index, and on a leader each follower's lag), the
topics (from the metadata it replicates; end offsets of the partitions hosted here, from
which the page computes throughput between polls), consumer groups with their committed
offsets and lag where this node hosts the partition, and the newest events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from typing import Any, Protocol

import msgspec

from quorumlog.codec import wire
from quorumlog.node.dispatch import KV_GROUP
from quorumlog.obs.events import Event, EventLog
from quorumlog.runtime.group import GroupRunner

TOPICS_PREFIX = "__topics/"
EVENTS_SHOWN_MAX = 50
METADATA_KEYS_SCANNED_MAX = 200_000
"""Consumer groups are found by scanning the metadata keys; past this many keys the page
leaves them out rather than make a poll cost more than a moment."""


class HostedPartitionView(Protocol):
    """What the page reads of a partition hosted here (node/stream_service.py's)."""

    @property
    def group(self) -> GroupRunner: ...


class DashboardSource(Protocol):
    """What the dashboard reads of a node (node/server.py's `Node` provides it)."""

    node_id: str

    @property
    def groups(self) -> Mapping[str, GroupRunner]: ...

    @property
    def addresses(self) -> dict[str, str]: ...

    @property
    def events(self) -> EventLog: ...

    def peer_reachable(self, peer: str) -> bool: ...

    def metadata(self) -> Mapping[str, Any]: ...

    def partition_end_offset(self, topic: str, partition: int) -> int | None: ...

    def committed_offsets(self) -> list[tuple[str, str, int, int]]:
        """(consumer group, topic, partition, committed offset), from the replicated group
        coordinator (every node has it)."""
        ...


def page_html() -> bytes:
    return resources.files("quorumlog.obs").joinpath("static/dashboard.html").read_bytes()


def group_view(name: str, group: GroupRunner) -> dict[str, Any]:
    core = group.core
    followers: list[dict[str, Any]] = []
    if core.leader is not None:
        last_index = core.log.last_index
        followers = [
            {
                "peer": peer,
                "match_index": progress.match_index,
                "lag": max(0, last_index - progress.match_index),
            }
            for peer, progress in sorted(core.leader.progress.items())
        ]
    return {
        "name": name,
        "role": core.role.value,
        "leader": core.leader_id,
        "term": core.term,
        "commit_index": core.commit_index,
        "applied_index": core.applied_index,
        "last_index": core.log.last_index,
        "failure": group.host.failure,
        "followers": followers,
    }


def members_view(source: DashboardSource) -> list[dict[str, Any]]:
    kv = source.groups.get(KV_GROUP)
    voters = list(kv.core.configuration.voters) if kv is not None else []
    learners = list(kv.core.configuration.learners) if kv is not None else []
    leader = kv.core.leader_id if kv is not None else None
    addresses = source.addresses
    members = []
    for member in sorted({*voters, *learners, source.node_id}):
        members.append(
            {
                "id": member,
                "address": addresses.get(member),
                "voter": member in voters,
                "leader": member == leader,
                "self": member == source.node_id,
                "reachable": member == source.node_id or source.peer_reachable(member),
            }
        )
    return members


def metadata_items(metadata: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    if len(metadata) > METADATA_KEYS_SCANNED_MAX:
        return
    for key, value in list(metadata.items()):
        if key.startswith(prefix):
            yield key, value


def topics_view(source: DashboardSource) -> list[dict[str, Any]]:
    topics = []
    for key, value in metadata_items(source.metadata(), TOPICS_PREFIX):
        try:
            descriptor = msgspec.json.decode(value, type=wire.TopicDescriptor)
        except (msgspec.DecodeError, TypeError):
            continue  # not a descriptor this version reads: leave it out of the page
        partitions = [
            {
                "partition": number,
                "replicas": replicas,
                "end_offset": source.partition_end_offset(descriptor.name, number),
            }
            for number, replicas in enumerate(descriptor.replicas)
        ]
        topics.append(
            {
                "name": descriptor.name or key[len(TOPICS_PREFIX) :],
                "storage": descriptor.settings.storage,
                "replication": descriptor.settings.replication,
                "partitions": partitions,
            }
        )
    return sorted(topics, key=lambda topic: str(topic["name"]))


def consumer_groups_view(source: DashboardSource) -> list[dict[str, Any]]:
    """Committed offsets per group, topic and partition; lag where the end is known here."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for group, topic, partition, committed in source.committed_offsets():
        end = source.partition_end_offset(topic, partition)
        groups.setdefault(group, []).append(
            {
                "topic": topic,
                "partition": partition,
                "committed": committed,
                "end_offset": end,
                "lag": None if end is None else max(0, end - committed),
            }
        )
    return [
        {"group": name, "partitions": sorted(rows, key=lambda r: (r["topic"], r["partition"]))}
        for name, rows in sorted(groups.items())
    ]


def event_view(event: Event) -> dict[str, Any]:
    return msgspec.structs.asdict(event)


def status_view(source: DashboardSource, now_ms: Callable[[], int]) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values."""
    return {
        "node": source.node_id,
        "time_ms": now_ms(),
        "members": members_view(source),
        "groups": [group_view(name, group) for name, group in sorted(source.groups.items())],
        "topics": topics_view(source),
        "consumer_groups": consumer_groups_view(source),
        "events": [event_view(event) for event in source.events.newest(EVENTS_SHOWN_MAX)],
    }

"""Consumer-group administration (Kafka's kafka-consumer-groups is the model): list the
groups, describe one (members, and per partition the committed offset, the end offset and
the lag), reset a group's offsets, delete a group. Resets and deletes are refused while
the group has live members (GroupNotEmptyError), as Kafka refuses them.

    from quorumlog.stream.group_admin import GroupAdmin

    with GroupAdmin(["127.0.0.1:2379"]) as groups:
        for row in groups.describe_group("billing").partitions:
            print(row.topic, row.partition, row.committed_offset, row.lag)
"""

from __future__ import annotations

import asyncio

import msgspec

from quorumlog.errors import ClientError
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.stream.client_common import BlockingClient, leader_status
from quorumlog.stream.group_client import CoordinatorLink
from quorumlog.stream.group_model import GroupInfo, MemberInfo
from quorumlog.tls.config import TLSConfig

RESET_TARGETS = ("earliest", "latest")


class PartitionLag(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    committed_offset: int | None
    """None: the group never committed here."""
    end_offset: int | None
    """None: the partition did not answer (its error says why)."""
    lag: int | None
    """end - committed (the records the group has yet to read); None if either is unknown."""
    member_id: str | None
    """The member the partition is assigned to now, if any."""
    error: str | None = None


class GroupDescription(msgspec.Struct, frozen=True):
    group: str
    state: str
    """"Stable" (has members) or "Empty"."""
    generation: int
    assignor: str
    members: list[MemberInfo]
    partitions: list[PartitionLag]
    """Every partition the group commits to or is assigned, sorted."""


class GroupSummary(msgspec.Struct, frozen=True):
    group: str
    state: str
    members: int
    generation: int


class GroupAdmin(BlockingClient):
    """Blocking; safe to share between threads."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 10.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        attempt_timeout_seconds: float | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            thread_name="quorumlog-group-admin",
            user=user,
            password=password,
            tls=tls,
        )
        self.link = CoordinatorLink(self.transport, self.transport.kv.selector.endpoints)

    def list_groups(self) -> list[GroupSummary]:
        infos = self.run(self.link.list_groups())
        return [GroupSummary(i.group, i.state, len(i.members), i.generation) for i in infos]

    def describe_group(self, group: str) -> GroupDescription:
        """UnknownConsumerGroupError if the coordinator has no such group."""
        info = self.run(self.link.describe_group(group))
        partitions = self.run(self.lags(info))
        return GroupDescription(
            group=info.group,
            state=info.state,
            generation=info.generation,
            assignor=info.assignor,
            members=info.members,
            partitions=partitions,
        )

    async def lags(self, info: GroupInfo) -> list[PartitionLag]:
        committed = {(o.topic, o.partition): o.offset for o in info.offsets}
        owners = {(p[0], p[1]): m.member_id for m in info.members for p in m.assignment}
        keys = sorted(set(committed) | set(owners))
        ends = await asyncio.gather(
            *(self.end_offset(topic, partition) for topic, partition in keys)
        )
        rows = []
        for key, (end, error) in zip(keys, ends, strict=True):
            done = committed.get(key)
            lag = None if end is None or done is None else max(end - done, 0)
            rows.append(PartitionLag(key[0], key[1], done, end, lag, owners.get(key), error))
        return rows

    async def end_offset(self, topic: str, partition: int) -> tuple[int | None, str | None]:
        try:
            return (await leader_status(self.transport, topic, partition)).end_offset, None
        except ClientError as error:
            return None, str(error)

    def reset_offsets(self, group: str, topic: str, to: str | int) -> dict[int, int]:
        """Set the group's offsets of every partition of `topic` to "earliest", "latest" or
        an offset (clamped into what the partition retains, as Kafka does). Returns the
        offsets set. GroupNotEmptyError while the group has live members."""
        if isinstance(to, str) and to not in RESET_TARGETS:
            raise ValueError(f"reset to one of {', '.join(RESET_TARGETS)} or an offset, not {to!r}")
        descriptor = self.run(self.transport.topic(topic))
        offsets = {}
        for partition in range(len(descriptor.replicas)):
            status = self.run(leader_status(self.transport, topic, partition))
            if to == "earliest":
                offsets[partition] = status.begin_offset
            elif to == "latest":
                offsets[partition] = status.end_offset
            else:
                offsets[partition] = min(max(int(to), status.begin_offset), status.end_offset)
        self.run(self.link.reset_offsets(group, {(topic, p): o for p, o in offsets.items()}))
        return offsets

    def delete_group(self, group: str) -> None:
        """GroupNotEmptyError while the group has live members."""
        self.run(self.link.delete_group(group))


__all__ = ["GroupAdmin", "GroupDescription", "GroupSummary", "PartitionLag"]

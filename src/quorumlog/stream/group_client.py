"""Talking to the consumer-group coordinator: one command per request, sent to the leader
of the "consumer-groups" Raft group (NOT_LEADER hints followed, as for the KV), and its
refusals turned into typed errors.

Every command is safe to repeat (member ids come from the client, a commit stores the same
offsets again, and carries its number so that a repeat arriving after a later commit
changes nothing), so a request whose answer was lost is simply sent again.
"""

from __future__ import annotations

from quorumlog.codec import wire
from quorumlog.errors import (
    ClientError,
    CommitFailedError,
    GroupCoordinatorRefusedError,
    GroupNotEmptyError,
    UnknownConsumerGroupError,
)
from quorumlog.kv.connection import EndpointSelector
from quorumlog.stream.client_common import StreamTransport
from quorumlog.stream.group_model import (
    COMMIT_REFUSALS,
    NO_GENERATION,
    CommitOffsets,
    DeleteGroup,
    DescribeGroup,
    GroupCommand,
    GroupInfo,
    GroupResult,
    ListGroups,
    PartitionOffset,
    Refusal,
    ResetOffsets,
    decode_results,
    encode_commands,
)


def refusal_error(
    result: GroupResult, group: str | None, commit: bool = False
) -> GroupCoordinatorRefusedError:
    """The typed error of a refused result; `commit`: it answered an offset commit."""
    refusal = result.refusal or Refusal.BAD_REQUEST
    message = result.error or "refused"
    if commit and refusal in COMMIT_REFUSALS:
        return CommitFailedError(refusal.value, message, group)
    if refusal is Refusal.GROUP_NOT_EMPTY:
        return GroupNotEmptyError(refusal.value, message, group)
    if refusal is Refusal.UNKNOWN_GROUP:
        return UnknownConsumerGroupError(refusal.value, message, group)
    return GroupCoordinatorRefusedError(refusal.value, message, group)


class CoordinatorLink:
    """Sends commands to the coordinator's leader; lives on the transport's event loop."""

    def __init__(self, transport: StreamTransport, endpoints: list[str]) -> None:
        self.transport = transport
        self.selector = EndpointSelector(list(endpoints))
        self.commit_sequences: dict[tuple[str, str], int] = {}
        """(group, member id) → the sequence of its last commit (`CommitOffsets.sequence`)."""

    async def send(self, what: str, command: GroupCommand) -> GroupResult:
        commands = encode_commands([command])

        def make_request(request_id: int) -> wire.GroupCoordinatorRequest:
            return wire.GroupCoordinatorRequest(request_id=request_id, commands=commands)

        attempts = self.transport.attempts(what, self.selector, side_effects=False)
        response = await self.transport.call_with(
            attempts, make_request, wire.GroupCoordinatorResponse, mark_leader=True
        )
        try:
            results = decode_results(response.results)
        except wire.DECODE_ERRORS as error:
            raise ClientError(f"{what}: the answer does not decode: {error}") from error
        if len(results) != 1:
            raise ClientError(f"{what}: {len(results)} results for one command")
        return results[0]

    async def checked(self, what: str, command: GroupCommand, group: str | None) -> GroupResult:
        result = await self.send(what, command)
        if not result.ok:
            raise refusal_error(result, group, commit=isinstance(command, CommitOffsets))
        return result

    # --- the operator's calls ---------------------------------------------------------------

    async def list_groups(self) -> list[GroupInfo]:
        result = await self.checked("list consumer groups", ListGroups(), None)
        return list(result.groups or [])

    async def describe_group(self, group: str) -> GroupInfo:
        result = await self.checked(f"describe group {group}", DescribeGroup(group), group)
        if result.group is None:
            raise ClientError(f"the coordinator answered for {group!r} without the group")
        return result.group

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets; {} for a group the coordinator does not know."""
        result = await self.send(f"offsets of group {group}", DescribeGroup(group))
        if not result.ok:
            if result.refusal is Refusal.UNKNOWN_GROUP:
                return {}
            raise refusal_error(result, group)
        info = result.group
        return {} if info is None else {(o.topic, o.partition): o.offset for o in info.offsets}

    async def commit(
        self,
        group: str,
        offsets: dict[tuple[str, int], int],
        member_id: str = "",
        generation: int = NO_GENERATION,
    ) -> None:
        """CommitFailedError if the group fenced the commit (see `CommitFailedError`)."""
        items = [PartitionOffset(t, p, o) for (t, p), o in sorted(offsets.items())]
        sequence = 0
        if member_id:
            # Numbered when made, not when sent: every attempt of one commit carries its
            # number, and a later commit a higher one.
            sequence = self.commit_sequences.get((group, member_id), 0) + 1
            self.commit_sequences[(group, member_id)] = sequence
        command = CommitOffsets(group, member_id, generation, items, sequence)
        await self.checked(f"commit of group {group}", command, group)

    async def reset_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> GroupInfo:
        """GroupNotEmptyError while the group has live members."""
        items = [PartitionOffset(t, p, o) for (t, p), o in sorted(offsets.items())]
        result = await self.checked(f"reset offsets of {group}", ResetOffsets(group, items), group)
        if result.group is None:
            raise ClientError(f"the coordinator answered for {group!r} without the group")
        return result.group

    async def delete_group(self, group: str) -> None:
        """GroupNotEmptyError while the group has live members."""
        await self.checked(f"delete group {group}", DeleteGroup(group), group)


__all__ = ["CoordinatorLink", "refusal_error"]

"""What a shard group's leader should do next: the reference's monitors, as pure functions.

The runtime calls `monitor` periodically on the leader (the reference runs four loops: the
configuration monitor, migration, garbage collection and the empty-entry check) and carries
out the actions it returns; it calls the `handle_*` and `*_response` functions when a
message arrives from another group. Nothing here does I/O or keeps state between calls:
everything is read from the machine's applied state, so a new leader (or a restarted one
mid-replay) recomputes the same work, and repeating an action is harmless because every
entry and message names its configuration number.

One round of a shard move from group A (previous owner) to group B (new owner):

1. both apply configuration N (B: shard PULLING; A: shard BE_PULLING);
2. B sends `PullRequest(N)` to A; A answers from its applied state (`handle_pull_request`);
3. B proposes the `InsertShards` of the answer (`entry_for_pull_response`) → GCing: serves;
4. B sends `DeleteRequest(N)` to A; A proposes `DeleteShards(N)` (`handle_delete_request`)
   and, once applied, answers (`delete_response_after_apply`) → A's copy is gone;
5. B proposes `DeleteShards(N)` (`entry_for_delete_response`) → SERVING: B may take N + 1.

Pulls and deletes are grouped by the other group, one request per group, so shards coming
from a group that answers are served even while a group that does not keeps others PULLING.
"""

from __future__ import annotations

import msgspec

from quorumlog.raft.invariants import InvariantViolation, require
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration
from quorumlog.shard.group_commands import (
    ControlApplied,
    DeleteRequest,
    DeleteResponse,
    DeleteShards,
    EmptyEntry,
    GroupEntry,
    InsertShards,
    NewConfiguration,
    PullRequest,
    PullResponse,
    PullStatus,
)
from quorumlog.shard.group_machine import ShardGroupMachine, ShardState
from quorumlog.shard.shard_store import revisions_fit


class FetchConfiguration(msgspec.Struct, frozen=True):
    """Ask the controller for configuration `number` (a Query for it) and pass the answer
    to the next `monitor` call."""

    number: int


class Propose(msgspec.Struct, frozen=True):
    """Propose `entry` to this group's log."""

    entry: GroupEntry


class SendPullRequest(msgspec.Struct, frozen=True):
    """Send `request` to group `target_gid` (any of `servers`; any replica that applied the
    configuration can answer) and pass the response to `entry_for_pull_response`."""

    target_gid: int
    servers: list[str]
    request: PullRequest


class SendDeleteRequest(msgspec.Struct, frozen=True):
    """Send `request` to the leader of group `target_gid` and pass the response to
    `entry_for_delete_response`."""

    target_gid: int
    servers: list[str]
    request: DeleteRequest


Action = FetchConfiguration | Propose | SendPullRequest | SendDeleteRequest


def monitor(
    machine: ShardGroupMachine,
    controller_configuration: ShardConfiguration | None = None,
    has_entry_in_current_term: bool = True,
) -> list[Action]:
    """Everything the leader should do now, given the controller's latest answer to
    `FetchConfiguration` (None if it has none) and whether its log holds an entry of its
    own term."""
    actions: list[Action] = []
    empty = empty_entry_if_needed(has_entry_in_current_term)
    if empty is not None:
        actions.append(Propose(empty))
    actions.extend(configuration_actions(machine, controller_configuration))
    actions.extend(pull_actions(machine))
    actions.extend(garbage_collection_actions(machine))
    return actions


def empty_entry_if_needed(has_entry_in_current_term: bool) -> EmptyEntry | None:
    """An empty entry when the leader has none of its term: entries of earlier terms commit
    only behind one of the current term, and a group waiting on migration may see no client
    write for a long time (the reference's live lock). Our Raft core already appends a no-op
    on election, so a runtime on it always passes True."""
    return None if has_entry_in_current_term else EmptyEntry()


def configuration_actions(
    machine: ShardGroupMachine, controller_configuration: ShardConfiguration | None
) -> list[Action]:
    """Propose the next configuration if it is known and nothing is migrating; otherwise
    ask for it. Configurations go one number at a time so every move has one source."""
    if not machine.all_serving():
        return []
    wanted = machine.current_configuration.number + 1
    if (
        controller_configuration is not None
        and controller_configuration.number == wanted
        and controller_configuration.shard_count == machine.shard_count
    ):
        return [Propose(NewConfiguration(controller_configuration))]
    return [FetchConfiguration(wanted)]


def pull_actions(machine: ShardGroupMachine) -> list[SendPullRequest]:
    """One pull request per previous owner of the PULLING shards, in gid order."""
    current = machine.current_configuration
    return [
        SendPullRequest(
            target_gid=source,
            servers=servers_of(machine.previous_configuration, source),
            request=resumed(PullRequest(machine.gid, current.number, shards), machine),
        )
        for source, shards in by_previous_owner(machine, ShardState.PULLING).items()
    ]


def resumed(request: PullRequest, machine: ShardGroupMachine) -> PullRequest:
    """Go on from what already arrived, when a pull was begun (by an earlier leader).

    Chunks arrive in (shard, key) order and each is applied before the next is asked for,
    so the first shard still PULLING holds exactly its first `len(data)` keys, and later
    ones nothing. The last key held goes along so the previous owner can check the point
    (see PullRequest.resume_last_key); sessions follow the keys and are sent again from
    their start, which merging makes harmless."""
    first = min(request.shards)
    data = machine.shards[first].data
    if not data:
        return request
    return msgspec.structs.replace(request, resume_at=(first, len(data)), resume_last_key=max(data))


def garbage_collection_actions(machine: ShardGroupMachine) -> list[SendDeleteRequest]:
    """One delete request per previous owner of the GARBAGE_COLLECTING shards, in gid order."""
    current = machine.current_configuration
    return [
        SendDeleteRequest(
            target_gid=source,
            servers=servers_of(machine.previous_configuration, source),
            request=DeleteRequest(machine.gid, current.number, shards),
        )
        for source, shards in by_previous_owner(machine, ShardState.GARBAGE_COLLECTING).items()
    ]


def by_previous_owner(machine: ShardGroupMachine, state: ShardState) -> dict[int, list[int]]:
    """previous owner gid → the shards in `state` it owned, gids and shards ascending."""
    previous = machine.previous_configuration
    grouped: dict[int, list[int]] = {}
    for shard in machine.shards_in_state(state):
        source = previous.shards[shard]
        # PULLING and GARBAGE_COLLECTING are entered only from another group's ownership.
        require(
            source not in (UNASSIGNED_GID, machine.gid),
            f"group {machine.gid}: shard {shard} is {state.value} but was owned by {source}",
        )
        grouped.setdefault(source, []).append(shard)
    return dict(sorted(grouped.items()))


def servers_of(configuration: ShardConfiguration, gid: int) -> list[str]:
    servers = configuration.groups.get(gid)
    if servers is None:
        raise InvariantViolation(
            f"group {gid} owns shards in configuration {configuration.number} but is not listed"
        )
    return list(servers)


# --- the previous owner's side ------------------------------------------------------------


def handle_pull_request(machine: ShardGroupMachine, request: PullRequest) -> PullResponse:
    """Answer a pull from the applied state, with only shards that now belong to the
    requester (a confused requester gets nothing it does not own)."""
    current = machine.current_configuration
    owned = [
        shard
        for shard in request.shards
        if 0 <= shard < machine.shard_count and current.shards[shard] == request.requester_gid
    ]
    return machine.pull_request_for(
        request.configuration_number,
        owned,
        request.resume_at,
        request.bytes_max,
        request.resume_last_key,
    )


def handle_delete_request(
    machine: ShardGroupMachine, request: DeleteRequest
) -> DeleteResponse | Propose:
    """Answer at once if the copy is already gone, or if this replica has not applied the
    request's configuration yet; otherwise the entry to propose, whose applied result goes
    to `delete_response_after_apply`."""
    current = machine.current_configuration
    number = request.configuration_number
    if number < current.number:
        return delete_response(machine, request, ok=True)
    if number > current.number:
        # This leader's applied state lags its log (a new leader still applying). Which
        # shards to drop is only known in configuration `number`: filtering against this
        # older one would find none, and an empty delete answered ok would tell the new
        # owner the copy is gone while it stays BE_PULLING here for ever. Not yet: the
        # requester asks again next round.
        return delete_response(machine, request, ok=False)
    shards = sorted(
        {
            shard
            for shard in request.shards
            if 0 <= shard < machine.shard_count and current.shards[shard] == request.requester_gid
        }
    )
    if all(machine.shard_state(shard) is not ShardState.BE_PULLING for shard in shards):
        return delete_response(machine, request, ok=True)
    return Propose(DeleteShards(number, shards))


def delete_response_after_apply(
    machine: ShardGroupMachine, request: DeleteRequest, result: ControlApplied
) -> DeleteResponse:
    return delete_response(machine, request, ok=result.accepted)


def delete_response(
    machine: ShardGroupMachine, request: DeleteRequest, *, ok: bool
) -> DeleteResponse:
    return DeleteResponse(machine.gid, request.configuration_number, list(request.shards), ok)


# --- the new owner's side -----------------------------------------------------------------


def entry_for_pull_response(
    machine: ShardGroupMachine, response: PullResponse
) -> InsertShards | None:
    """The insert to propose for a pull answer, limited to shards still PULLING from that
    group in that configuration; None when there is nothing left to insert."""
    insert = response.insert
    if response.status is not PullStatus.OK or insert is None:
        return None
    number = machine.current_configuration.number
    if insert.configuration_number != number or response.configuration_number != number:
        return None
    previous = machine.previous_configuration
    wanted = [
        shard
        for shard in sorted(set(insert.shards) | set(insert.sessions))
        if 0 <= shard < machine.shard_count
        and machine.shard_state(shard) is ShardState.PULLING
        and previous.shards[shard] == response.source_gid
    ]
    if not wanted:
        return None
    key_revisions = insert.key_revisions
    store_revisions = insert.store_revisions
    history = insert.history
    compacted_revisions = insert.compacted_revisions
    if not all(
        revisions_fit(
            insert.shards.get(shard, {}),
            None if key_revisions is None else key_revisions.get(shard),
            None if store_revisions is None else store_revisions.get(shard),
            None if history is None else history.get(shard),
            None if compacted_revisions is None else compacted_revisions.get(shard),
        )
        for shard in wanted
    ):
        return None  # not an answer this build would give: ask again
    finished = [shard for shard in wanted if insert.is_finished(shard)]
    return InsertShards(
        configuration_number=number,
        shards={shard: insert.shards.get(shard, {}) for shard in wanted},
        sessions={shard: insert.sessions[shard] for shard in wanted if shard in insert.sessions},
        finished=None if len(finished) == len(wanted) else finished,
        clock_ms=insert.clock_ms,
        key_revisions=None
        if key_revisions is None
        else {shard: key_revisions.get(shard, []) for shard in wanted},
        store_revisions=None
        if store_revisions is None
        else {shard: store_revisions.get(shard, 0) for shard in wanted},
        history=None if history is None else {shard: history.get(shard, []) for shard in wanted},
        compacted_revisions=None
        if compacted_revisions is None
        else {shard: compacted_revisions.get(shard, 0) for shard in wanted},
    )


def next_pull_request(request: PullRequest, response: PullResponse) -> PullRequest | None:
    """The request for the next chunk of a chunked pull, or None when the answer was the
    last one. Send it once the insert of this answer is applied: chunks go in order, one
    at a time, so the log never holds more than one chunk per source ahead of the state."""
    if response.status is not PullStatus.OK or response.resume_at is None:
        return None
    # The previous owner's own resume point: nothing to check.
    return msgspec.structs.replace(request, resume_at=response.resume_at, resume_last_key=None)


def entry_for_delete_response(
    machine: ShardGroupMachine, response: DeleteResponse
) -> DeleteShards | None:
    """The GC confirmation to propose once the previous owner dropped its copy."""
    number = machine.current_configuration.number
    if not response.ok or response.configuration_number != number:
        return None
    previous = machine.previous_configuration
    shards = sorted(
        {
            shard
            for shard in response.shards
            if 0 <= shard < machine.shard_count
            and machine.shard_state(shard) is ShardState.GARBAGE_COLLECTING
            and previous.shards[shard] == response.source_gid
        }
    )
    if not shards:
        return None
    return DeleteShards(number, shards)


__all__ = [
    "Action",
    "FetchConfiguration",
    "Propose",
    "SendDeleteRequest",
    "SendPullRequest",
    "by_previous_owner",
    "configuration_actions",
    "delete_response",
    "delete_response_after_apply",
    "empty_entry_if_needed",
    "entry_for_delete_response",
    "entry_for_pull_response",
    "garbage_collection_actions",
    "handle_delete_request",
    "handle_pull_request",
    "monitor",
    "next_pull_request",
    "pull_actions",
]

"""Serves one shard group on a node: client reads and writes for the shards it serves, and
the pull and delete requests other groups send while shards move.

Client requests are KV requests addressed to group "shard-<gid>"; they are batched and
read-barriered as the KV group's are (`KVRequestService`). A key whose shard this group
does not serve now gets WRONG_GROUP, naming the shard and this group's configuration
number, so the client fetches a newer configuration and goes elsewhere. A write batch that
spans shards may be partly applied when it gets WRONG_GROUP; the client resends it all
with the same sequences, and the shards' dedup sessions turn the applied part into
duplicates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError, QuorumLogError
from quorumlog.kv.commands import ClientBatch
from quorumlog.node.errors_to_wire import after_read_barrier
from quorumlog.node.kv_service import SCAN_LIMIT_MAX, KVLimits, KVRequestService, Replier
from quorumlog.node.shard_watches import (
    ShardReadRequest,
    ShardWatchPolls,
    requested_shard,
    shard_range,
    wrong_group_error,
)
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle
from quorumlog.shard.group_commands import (
    ClientWrites,
    ControlApplied,
    DeleteRequest,
    PullRequest,
    WritesApplied,
    WrongGroup,
    decode_message,
    encode_entry,
    encode_message,
)
from quorumlog.shard.group_driver import (
    Propose,
    delete_response_after_apply,
    handle_delete_request,
    handle_pull_request,
)
from quorumlog.shard.group_machine import ShardGroupMachine, ShardState

PULL_BYTES_MAX_LIMIT = 16 * 1024 * 1024
"""The largest pull chunk a node answers, whatever the requester asks: one chunk is one
frame and one log entry on the requester's side."""


class ShardGroupService(KVRequestService):
    def __init__(
        self,
        gid: int,
        group: GroupHandle,
        machine: ShardGroupMachine,
        leader_address: Callable[[], str | None],
        limits: KVLimits | None = None,
    ) -> None:
        super().__init__(group, leader_address, limits)
        self.gid = gid
        self.machine = machine
        self.watches = ShardWatchPolls(gid, group, machine)
        machine.revision_listeners.append(self.watches.changed)

    # --- client writes and reads ----------------------------------------------------------

    def encode_writes(self, timestamp_ms: int, batches: list[ClientBatch]) -> bytes:
        return encode_entry(ClientWrites(timestamp_ms=timestamp_ms, batches=batches))

    def answer_writes(self, chunk: list[tuple[wire.KVWrite, Replier]], applied: Any) -> None:
        if not isinstance(applied, WritesApplied):
            raise InvariantViolation(f"client writes applied as {type(applied).__name__}")
        for (request, reply), batch_results in zip(chunk, applied.results, strict=True):
            wrong = next((r for r in batch_results if isinstance(r, WrongGroup)), None)
            if wrong is not None:
                reply(wrong_group_error(request.request_id, wrong, self.gid))
                continue
            results = [r for r in batch_results if isinstance(r, wire.KVCommandResult)]
            reply(wire.KVWriteResult(request_id=request.request_id, results=results))

    def answer_read(self, request: wire.KVRead | wire.KVScan, reply: Replier) -> None:
        if isinstance(request, wire.KVScan):
            reply(self.scan(request))
            return
        values: list[str | None] = []
        for key in request.keys:
            value = self.machine.get(key)
            if isinstance(value, WrongGroup):
                reply(wrong_group_error(request.request_id, value, self.gid))
                return
            values.append(value)
        reply(wire.KVReadResult(request_id=request.request_id, values=values))

    def scan(self, request: wire.KVScan) -> wire.KVScanResult | wire.ErrorResponse:
        machine = self.machine
        shards = (
            sorted(set(request.shards))
            if request.shards is not None
            else [s for s in range(machine.shard_count) if machine.can_serve(s)]
        )
        for shard in shards:
            if not 0 <= shard < machine.shard_count:
                return wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"shard {shard} is outside 0..{machine.shard_count - 1}",
                )
            if not machine.can_serve(shard):
                wrong = WrongGroup(shard, machine.current_configuration.number)
                return wrong_group_error(request.request_id, wrong, self.gid)
        limit = max(1, min(request.limit, SCAN_LIMIT_MAX))
        keys = sorted(
            key
            for shard in shards
            for key in machine.shards[shard].data
            if key >= request.start and (request.end is None or key < request.end)
        )
        page = keys[:limit]
        next_start = keys[limit] if len(keys) > limit else None
        items = [(key, machine.shards[machine.shard_for_key(key)].data[key]) for key in page]
        return wire.KVScanResult(request_id=request.request_id, items=items, next_start=next_start)

    # --- ranges and watches (revisions per shard: node/shard_watches.py) -------------------

    def read_v3(self, request: ShardReadRequest, reply: Replier) -> None:
        """A range or watch of one shard: behind the read barrier (a stale range is
        answered from this node's state)."""
        if isinstance(request, wire.KVRangeRequest) and request.stale:
            self.answer_v3(request, reply)
            return
        after_read_barrier(
            self.group.linearizable_read,
            request.request_id,
            reply,
            self.leader_address,
            lambda: self.answer_v3(request, reply),
        )

    def answer_v3(self, request: ShardReadRequest, reply: Replier) -> None:
        shard = requested_shard(request, self.machine)
        if isinstance(shard, str):
            self.bad_request(reply, request.request_id, wire.ErrorCode.BAD_REQUEST, shard)
            return
        if isinstance(request, wire.WatchPoll):
            self.watches.poll(request, shard, reply)
            return
        store = self.machine.shard_store(shard)
        if isinstance(store, WrongGroup):
            reply(wrong_group_error(request.request_id, store, self.gid))
            return
        reply(shard_range(request, store))

    # --- other groups ---------------------------------------------------------------------

    def handle_group_request(self, request: wire.ShardGroupRequest, reply: Replier) -> None:
        try:
            message = decode_message(request.message)
        except wire.DECODE_ERRORS as error:
            self.bad_request(
                reply, request.request_id, wire.ErrorCode.BAD_REQUEST, f"bad group message: {error}"
            )
            return
        if isinstance(message, PullRequest):
            self.answer_pull(request.request_id, message, reply)
        elif isinstance(message, DeleteRequest):
            self.answer_delete(request.request_id, message, reply)
        else:
            self.bad_request(
                reply,
                request.request_id,
                wire.ErrorCode.BAD_REQUEST,
                f"a group takes pull and delete requests, not {type(message).__name__}",
            )

    def answer_pull(self, request_id: int, request: PullRequest, reply: Replier) -> None:
        """Any replica answers a pull: BE_PULLING data is frozen, so every replica that
        applied the configuration gives the same bytes (one that did not says NOT_READY)."""
        bytes_max = request.bytes_max
        if bytes_max <= 0 or bytes_max > PULL_BYTES_MAX_LIMIT:
            bytes_max = PULL_BYTES_MAX_LIMIT
        bounded = msgspec.structs.replace(request, bytes_max=bytes_max)
        response = handle_pull_request(self.machine, bounded)
        reply(wire.ShardGroupResponse(request_id=request_id, message=encode_message(response)))

    def answer_delete(self, request_id: int, request: DeleteRequest, reply: Replier) -> None:
        """Only the leader answers a delete: dropping the copy goes through the log."""
        if not self.group.is_leader:
            self.reject(reply, request_id, NotLeaderError(self.group.node_id, self.group.leader_id))
            return
        outcome = handle_delete_request(self.machine, request)
        if not isinstance(outcome, Propose):
            reply(wire.ShardGroupResponse(request_id=request_id, message=encode_message(outcome)))
            return
        try:
            future = self.group.propose(encode_entry(outcome.entry))
        except QuorumLogError as error:
            self.reject(reply, request_id, error)
            return

        def answer(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                self.reject(reply, request_id, error)
                return
            result = done.result()
            if not isinstance(result, ControlApplied):
                raise InvariantViolation(f"a delete applied as {type(result).__name__}")
            response = delete_response_after_apply(self.machine, request, result)
            reply(wire.ShardGroupResponse(request_id=request_id, message=encode_message(response)))

        future.add_done_callback(answer)

    # --- status ---------------------------------------------------------------------------

    def status(self, request_id: int, node_id: str) -> wire.ShardStatusResponse:
        machine = self.machine
        states = {
            shard: machine.shard_state(shard).value
            for shard in range(machine.shard_count)
            if machine.owns(shard) or machine.shard_state(shard) is not ShardState.SERVING
        }
        return wire.ShardStatusResponse(
            request_id=request_id,
            node_id=node_id,
            gid=self.gid,
            is_leader=self.group.is_leader,
            leader=self.leader_address(),
            configuration_number=machine.current_configuration.number,
            shard_states=states,
            stored_keys=machine.stored_key_count(),
            applied_index=machine.applied_index,
        )

"""Serves KV requests on one Raft group: batched writes, ReadIndex reads, stale reads.

Writes that arrive in one event-loop turn become one log entry (Raft-level group commit);
reads that arrive in one turn share one ReadIndex round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorumlog.codec import kv_v3, wire
from quorumlog.codec.kv_v3 import V3_OP
from quorumlog.errors import NotLeaderError, QuorumLogError
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine
from quorumlog.kv.reserved import (
    RESERVED_KEY_PREFIX,
    is_reserved_key,
    user_ranges,
    v3_reserved_problem,
)
from quorumlog.node.errors_to_wire import after_read_barrier, error_response
from quorumlog.node.kv_leases import LeaseKeeper
from quorumlog.node.kv_watches import WatchPolls
from quorumlog.node.range_answers import range_answer
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle

Replier = Callable[[wire.Frame], None]
WRITE_OPS = frozenset({"put", "append", "delete", "cas"})
SCAN_LIMIT_MAX = 10_000
"""Keys one scan answer carries at most (the client pages past it)."""
V3ReadRequest = wire.KVRangeRequest | wire.WatchPoll | wire.LeaseTimeToLiveRequest


class KVLimits:
    def __init__(
        self,
        key_bytes_max: int = 4096,
        value_bytes_max: int = 1024 * 1024,
        commands_per_write_max: int = 10_000,
        entry_bytes_max: int = 4 * 1024 * 1024,
    ) -> None:
        self.key_bytes_max = key_bytes_max
        self.value_bytes_max = value_bytes_max
        self.commands_per_write_max = commands_per_write_max
        self.entry_bytes_max = entry_bytes_max


class KVRequestService:
    """What every KV-shaped group does with client requests: check writes, batch those of
    one loop turn into one entry, answer reads behind one ReadIndex round. Subclasses say
    how batches become an entry and how applied results and reads are answered."""

    def __init__(
        self,
        group: GroupHandle,
        leader_address: Callable[[], str | None],
        limits: KVLimits | None = None,
    ) -> None:
        self.group = group
        self.leader_address = leader_address
        self.limits = limits or KVLimits()
        self.pending_writes: list[tuple[wire.KVWrite, Replier]] = []
        self.flush_scheduled = False
        self.write_ops = WRITE_OPS
        """The write ops this group carries out (the plain KV adds "v3")."""

    # --- errors -------------------------------------------------------------------------

    def reject(self, reply: Replier, request_id: int, error: BaseException) -> None:
        reply(error_response(request_id, error, self.leader_address))

    def bad_request(
        self, reply: Replier, request_id: int, code: wire.ErrorCode, message: str
    ) -> None:
        reply(wire.ErrorResponse(request_id=request_id, code=code, message=message))

    # --- writes -------------------------------------------------------------------------

    def write(self, request: wire.KVWrite, reply: Replier) -> None:
        problem = self.check_write(request)
        if problem is not None:
            code, message = problem
            self.bad_request(reply, request.request_id, code, message)
            return
        self.enqueue_write(request, reply)

    def enqueue_write(self, request: wire.KVWrite, reply: Replier) -> None:
        """Propose a checked write with the others of this loop turn (the auth service
        enters its commands here: their op is not one a client may send)."""
        if not self.group.is_leader:
            self.reject(
                reply,
                request.request_id,
                NotLeaderError(self.group.node_id, self.group.leader_id),
            )
            return
        self.pending_writes.append((request, reply))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.group.scheduler.call_soon(self.flush_writes)

    def check_write(self, request: wire.KVWrite) -> tuple[wire.ErrorCode, str] | None:
        limits = self.limits
        if not request.commands:
            return wire.ErrorCode.BAD_REQUEST, "a write needs at least one command"
        if len(request.commands) > limits.commands_per_write_max:
            return (
                wire.ErrorCode.TOO_LARGE,
                f"{len(request.commands)} commands; at most {limits.commands_per_write_max}",
            )
        # A character is at most 4 UTF-8 bytes: only strings past a quarter of a bound can
        # be over it, so only those are encoded to measure them.
        key_bound = limits.key_bytes_max // 4
        value_bound = limits.value_bytes_max // 4
        write_ops = self.write_ops
        # Once per command of every write: each field is read once, nothing is built.
        for command in request.commands:
            operation = command.op
            if operation not in write_ops:
                return wire.ErrorCode.BAD_REQUEST, f"unknown write op {operation!r}"
            key = command.key
            if len(key) > key_bound and len(key.encode()) > limits.key_bytes_max:
                return (
                    wire.ErrorCode.TOO_LARGE,
                    f"key of {len(key.encode())} bytes; at most {limits.key_bytes_max}",
                )
            value = command.value
            if value is not None and len(value) > value_bound:
                problem = value_problem(value, limits)
                if problem is not None:
                    return problem
            expected = command.expected
            if expected is not None and len(expected) > value_bound:
                problem = value_problem(expected, limits)
                if problem is not None:
                    return problem
            if value is None and (operation == "put" or operation == "append"):
                return wire.ErrorCode.BAD_REQUEST, f"{operation} needs a value"
            if operation == V3_OP:
                problem = check_v3_payload(command.payload, limits)
                if problem is not None:
                    return problem
        return None

    def flush_writes(self) -> None:
        self.flush_scheduled = False
        pending, self.pending_writes = self.pending_writes, []
        timestamp_ms = self.group.scheduler.wall_time_ms()
        chunk: list[tuple[wire.KVWrite, Replier]] = []
        chunk_bytes = 0
        for request, reply in pending:
            commands = request.commands
            # A list, not a generator: summed for every command of every write.
            size = (
                64
                + 16 * len(commands)
                + sum(
                    [
                        len(c.key)
                        + len(c.value or "")
                        + len(c.expected or "")
                        + len(c.payload or b"")
                        for c in commands
                    ]
                )
            )
            if chunk and chunk_bytes + size > self.limits.entry_bytes_max:
                self.propose(chunk, timestamp_ms)
                chunk, chunk_bytes = [], 0
            chunk.append((request, reply))
            chunk_bytes += size
        if chunk:
            self.propose(chunk, timestamp_ms)

    def encode_writes(self, timestamp_ms: int, batches: list[ClientBatch]) -> bytes:
        """The log entry that carries these client batches."""
        raise NotImplementedError

    def answer_writes(self, chunk: list[tuple[wire.KVWrite, Replier]], applied: Any) -> None:
        """Reply to each request of a chunk from its entry's applied result."""
        raise NotImplementedError

    def propose(self, chunk: list[tuple[wire.KVWrite, Replier]], timestamp_ms: int) -> None:
        batches = [
            ClientBatch(
                client_id=request.client_id,
                first_unacknowledged=request.first_unacknowledged,
                commands=request.commands,
            )
            for request, _ in chunk
        ]
        try:
            future = self.group.propose(self.encode_writes(timestamp_ms, batches))
        except QuorumLogError as error:  # typed refusals from the group: tell every client
            for request, reply in chunk:
                self.reject(reply, request.request_id, error)
            return

        def answer(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                for request, reply in chunk:
                    self.reject(reply, request.request_id, error)
                return
            self.answer_writes(chunk, done.result())

        future.add_done_callback(answer)

    # --- reads --------------------------------------------------------------------------

    def read(self, request: wire.KVRead | wire.KVScan, reply: Replier) -> None:
        if request.stale:
            self.answer_read(request, reply)
            return
        after_read_barrier(
            self.group.linearizable_read,
            request.request_id,
            reply,
            self.leader_address,
            lambda: self.answer_read(request, reply),
        )

    def answer_read(self, request: wire.KVRead | wire.KVScan, reply: Replier) -> None:
        """Answer from the applied state (behind the read barrier unless stale)."""
        raise NotImplementedError


class KVService(KVRequestService):
    """The replicated KV group: entries are `KVEntry`s applied by a `KVStateMachine`."""

    def __init__(
        self,
        group: GroupHandle,
        machine: KVStateMachine,
        leader_address: Callable[[], str | None],
        limits: KVLimits | None = None,
    ) -> None:
        super().__init__(group, leader_address, limits)
        self.machine = machine
        self.write_ops = WRITE_OPS | {V3_OP}
        self.leases = LeaseKeeper(group, lambda: self.machine, self.propose_expired)
        self.watches = WatchPolls(group, lambda: self.machine)
        machine.revision_listeners.append(self.leases.changed)
        machine.revision_listeners.append(self.watches.changed)
        self.leases.changed()  # leases restored from disk before the service started

    def check_write(self, request: wire.KVWrite) -> tuple[wire.ErrorCode, str] | None:
        """As every KV group checks, and: keys starting with "__" are quorumlog's own
        (kv/reserved.py); only requests its services mark `internal` may write them."""
        problem = super().check_write(request)
        if problem is not None or request.internal:
            return problem
        for command in request.commands:
            if command.op == V3_OP:
                reason = v3_reserved_problem(command.payload)
                if reason is not None:
                    return wire.ErrorCode.RESERVED_KEY, reason
                continue
            if command.key.startswith(RESERVED_KEY_PREFIX):  # is_reserved_key, per command
                return (
                    wire.ErrorCode.RESERVED_KEY,
                    f"cannot {command.op} {command.key!r}: keys starting with "
                    f"{RESERVED_KEY_PREFIX!r} are internal to quorumlog",
                )
        return None

    def encode_writes(self, timestamp_ms: int, batches: list[ClientBatch]) -> bytes:
        return encode_entry(KVEntry(timestamp_ms=timestamp_ms, batches=batches))

    def answer_writes(self, chunk: list[tuple[wire.KVWrite, Replier]], applied: Any) -> None:
        for (request, reply), batch_results in zip(chunk, applied, strict=True):
            reply(wire.KVWriteResult(request_id=request.request_id, results=batch_results))

    def answer_read(self, request: wire.KVRead | wire.KVScan, reply: Replier) -> None:
        if isinstance(request, wire.KVScan):
            reply(self.scan(request))
            return
        values = [self.machine.get(key) for key in request.keys]
        reply(wire.KVReadResult(request_id=request.request_id, values=values))

    def scan(self, request: wire.KVScan) -> wire.KVScanResult:
        # Sorting every key per page is O(n log n); fine for tables this store is meant for
        # (the snapshot sorts the same way). An ordered index is the upgrade path.
        limit = max(1, min(request.limit, SCAN_LIMIT_MAX))
        keys = sorted(
            key
            for key in self.machine.data
            if key >= request.start
            and (request.end is None or key < request.end)
            and (request.internal or not is_reserved_key(key))
        )
        page = keys[:limit]
        next_start = keys[limit] if len(keys) > limit else None
        data = self.machine.data
        return wire.KVScanResult(
            request_id=request.request_id,
            items=[(key, data[key]) for key in page],
            next_start=next_start,
        )

    # --- the etcd v3-style KV -------------------------------------------------------------

    def read_v3(self, request: V3ReadRequest, reply: Replier) -> None:
        """Range, watch and lease reads: behind the same read barrier as `read` (a stale
        range is answered from this node's state)."""
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

    def answer_v3(self, request: V3ReadRequest, reply: Replier) -> None:
        if isinstance(request, wire.KVRangeRequest):
            reply(self.range(request))
        elif isinstance(request, wire.WatchPoll):
            self.watches.poll(request, reply)
        else:
            reply(self.time_to_live(request))

    def range(self, request: wire.KVRangeRequest) -> wire.KVRangeResult:
        # A user's range leaves quorumlog's own keys out (kv/reserved.py).
        ranges = user_ranges(request.key, request.end)
        return range_answer(request, self.machine.store, ranges)

    def time_to_live(self, request: wire.LeaseTimeToLiveRequest) -> wire.LeaseTimeToLiveResult:
        store = self.machine.store
        lease = store.leases.get(request.lease_id)
        if lease is None:
            return wire.LeaseTimeToLiveResult(
                request_id=request.request_id,
                lease_id=request.lease_id,
                ttl_seconds=-1,
                granted_ttl_seconds=0,
            )
        keys = sorted(store.lease_keys.get(lease.lease_id, set())) if request.keys else []
        return wire.LeaseTimeToLiveResult(
            request_id=request.request_id,
            lease_id=lease.lease_id,
            ttl_seconds=self.leases.remaining_seconds(lease),
            granted_ttl_seconds=lease.ttl_seconds,
            keys=keys,
        )

    def propose_expired(self, lease_ids: list[int], settled: Callable[[], None]) -> None:
        """Propose the entry that expires `lease_ids` (the leader's decision)."""
        timestamp_ms = self.group.scheduler.wall_time_ms()
        entry = KVEntry(timestamp_ms=timestamp_ms, batches=[], expired_leases=lease_ids)
        try:
            future = self.group.propose(encode_entry(entry))
        except QuorumLogError:  # not the leader any more, or busy: the next check retries
            settled()
            return
        future.add_done_callback(lambda _: settled())


def value_problem(value: str, limits: KVLimits) -> tuple[wire.ErrorCode, str] | None:
    """TOO_LARGE if `value` is over the bound in UTF-8 bytes."""
    size = len(value.encode())
    if size > limits.value_bytes_max:
        return wire.ErrorCode.TOO_LARGE, f"value of {size} bytes; at most {limits.value_bytes_max}"
    return None


def check_v3_payload(payload: bytes | None, limits: KVLimits) -> tuple[wire.ErrorCode, str] | None:
    """A v3 command that decodes and keeps to the limits, or the refusal."""
    if payload is None:
        return wire.ErrorCode.BAD_REQUEST, "a v3 command needs a payload"
    if len(payload) > limits.entry_bytes_max:
        return wire.ErrorCode.TOO_LARGE, f"v3 command of {len(payload)} bytes"
    try:
        command = kv_v3.decode_command(payload)
    except wire.DECODE_ERRORS as error:
        return wire.ErrorCode.BAD_REQUEST, f"v3 command does not decode: {error}"
    if not isinstance(command, kv_v3.Txn):
        return None
    for operation in (*command.success, *command.failure):
        if len(operation.key.encode()) > limits.key_bytes_max:
            return wire.ErrorCode.TOO_LARGE, f"key of {len(operation.key.encode())} bytes"
        if len(operation.value) > limits.value_bytes_max:
            return wire.ErrorCode.TOO_LARGE, f"value of {len(operation.value)} bytes"
        if operation.kind not in ("put", "delete", "get"):
            return wire.ErrorCode.BAD_REQUEST, f"unknown txn operation {operation.kind!r}"
    return None

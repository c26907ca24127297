"""AsyncKVClient: the asyncio KV client for throughput — pipelined and batched.

    async with AsyncKVClient(["127.0.0.1:2379"]) as client:
        await asyncio.gather(*(client.put(f"k{i}", "v") for i in range(10_000)))

Pipelining: many requests are in flight on one connection, matched to answers by
`request_id`. Batching: writes issued in one event-loop turn (up to `batch_commands_max`)
leave as ONE `KVWrite` with many commands, and reads of one turn as one `KVRead`; the node
turns the writes of its own turn into one log entry. Retries, sequences and errors are
those of `KVClient`: a batch is retried whole with the same sequences, and each waiting
call gets its own result or error.

Sessions: every command is numbered in the session current when it was called, and a
batch holds commands of one session only. When the cluster says a session is gone
(`SessionExpiredError`, raised by each call of the refused batch), the first such answer
starts a new session for the calls made after it; commands already numbered in the old
session keep it, so a retry never reuses an old sequence under the new client id.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import msgspec

from quorumlog.auth.credentials import (
    Credentials,
    CredentialsSource,
    authenticate_request,
    credentials_source,
    screen_answer,
    token_from,
)
from quorumlog.codec import wire
from quorumlog.codec.frame import FrameError, encode_frame
from quorumlog.codec.kv_v3 import KeyValue
from quorumlog.codec.wire import (
    AuthenticatedRequest,
    ClientRequest,
    Done,
    ErrorResponse,
    Frame,
    KVCommand,
    KVCommandResult,
    KVRead,
    KVReadResult,
    KVWrite,
    KVWriteResult,
    MemberChangeRequest,
    Produce,
    ProduceMany,
    StatusRequest,
    StatusResponse,
    TransferLeaderRequest,
    Welcome,
    decode,
    encode,
)
from quorumlog.errors import ClientError, SessionExpiredError, UnknownOutcomeError
from quorumlog.kv.async_v3_client import AsyncV3Operations
from quorumlog.kv.connection import (
    CLUSTER_ID_DEFAULT,
    ClientSession,
    EndpointSelector,
    Member,
    RequestAttempts,
    SessionHolder,
    attempt_timeout_for,
    check_command_result,
    check_timeout,
    hello_frame,
    members_from_status,
    new_client_id,
    parse_endpoint,
    welcome_node_id,
    write_results,
)
from quorumlog.kv.frame_stream import FrameStream, open_frame_stream
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import closed_after_handshake_error

ResponseType = TypeVar("ResponseType")
PRODUCE_FRAMES_TRACKED_MAX = 1024
"""ProduceMany frames remembered per connection (for a refusal of the whole frame) before
those with no part waiting any more are forgotten."""
BATCH_COMMANDS_MAX_DEFAULT = 1000
BATCH_BYTES_MAX = 8 * 1024 * 1024
"""Bytes of keys and values in one KVWrite (well under the node's 64 MiB frame bound)."""


def command_size_bound(command: KVCommand) -> int:
    """An upper bound of the command's encoded size (4 bytes per character covers UTF-8)."""
    text = len(command.key) + len(command.value or "") + len(command.expected or "")
    return 32 + 4 * text + len(command.payload or b"")


SEQUENCE_WINDOW_MAX_DEFAULT = 10_000
"""Sequences handed out beyond the lowest unanswered one; bounds what the cluster must
remember for this client (its session results)."""


class ConnectionLost(ClientError):
    """The node closed the connection (used inside the client; callers never see it)."""


TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    EOFError,
    ConnectionLost,
    FrameError,
    *wire.DECODE_ERRORS,
    asyncio.IncompleteReadError,
)

ATTEMPT_ERRORS: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, TimeoutError)
"""What one attempt may meet: a transport error, or no answer in time."""


class StreamConnection:
    """One connection to one node; a reader task hands each answer to its request."""

    def __init__(self, endpoint: str, stream: FrameStream) -> None:
        self.endpoint = endpoint
        self.stream = stream
        """Frames in and out (answers are received straight into their buffers)."""
        self.node_id = ""
        self.waiting: dict[int, asyncio.Future[Frame]] = {}
        self.failure: BaseException | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.token = ""
        """The auth token this connection's requests carry ("": none)."""
        self.token_invalid = False
        """The node no longer knows the token: open a new connection (authenticating again)."""
        self.authenticated = False
        """Credentials were sent (the token may still be "" if auth was off then)."""
        self.produce_many = False
        """The node said (in its Welcome) that it serves ProduceMany frames."""
        self.produce_parts: list[Produce] = []
        """Produce requests of this loop turn, written together as one ProduceMany."""
        self.produce_frames: dict[int, list[int]] = {}
        """ProduceMany request id (negative: never a request's own) → its parts' ids, for
        a refusal of the whole frame; pruned once none of its parts is waiting."""
        self.last_produce_frame_id = 0
        self.last_received_seconds = 0.0
        """Loop time when the node last sent bytes (for patient requests: it is alive)."""

    @classmethod
    async def open(
        cls,
        endpoint: str,
        cluster_id: str,
        client_id: str,
        timeout_seconds: float,
        credentials: Credentials | None = None,
        tls: TLSConfig | None = None,
    ) -> StreamConnection:
        """Connect (over TLS with `tls`) and shake hands; TLSHandshakeError if TLS failed."""
        host, port = parse_endpoint(endpoint)
        async with asyncio.timeout(timeout_seconds):
            stream = await open_frame_stream(host, port, tls, endpoint)
            connection = cls(endpoint, stream)
            try:
                stream.write(hello_frame(cluster_id, client_id))
                try:
                    frame = await connection.read_frame()
                except (ConnectionLost, ConnectionResetError, ssl.SSLError) as error:
                    if tls is None:
                        raise
                    raise closed_after_handshake_error(endpoint) from error
                connection.node_id = welcome_node_id(frame, endpoint)
                connection.produce_many = isinstance(frame, Welcome) and frame.produce_many
                if credentials is not None:
                    stream.write(encode_frame(encode(authenticate_request(credentials))))
                    connection.token = token_from(await connection.read_frame(), endpoint)
                    connection.authenticated = True
            except BaseException:
                await connection.close()
                raise
        connection.reader_task = asyncio.create_task(connection.read_answers())
        return connection

    async def read_frame(self) -> Frame:
        """The handshake answer (before the reader task runs)."""
        while True:
            payloads = await self.stream.receive()
            if not payloads:
                raise ConnectionLost(f"{self.endpoint} closed the connection")
            if len(payloads) > 1:
                raise ClientError(f"{self.endpoint} sent frames before the handshake ended")
            if payloads:
                return decode(payloads[0])

    async def read_answers(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                payloads = await self.stream.receive()
                if not payloads:
                    raise ConnectionLost(f"{self.endpoint} closed the connection")
                self.last_received_seconds = loop.time()
                for payload in payloads:
                    frame, replace = screen_answer(decode(payload), self.authenticated)
                    if replace:
                        self.token_invalid = True
                    request_id = getattr(frame, "request_id", None)
                    if request_id is not None and request_id < 0:
                        self.answer_produce_frame(request_id, frame)
                        continue
                    future = self.waiting.pop(request_id, None) if request_id is not None else None
                    if future is not None and not future.done():
                        future.set_result(frame)
        except asyncio.CancelledError:
            self.fail(ConnectionLost(f"connection to {self.endpoint} closed by the client"))
            raise
        except TRANSPORT_ERRORS as error:
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)
        self.stream.close()

    @property
    def usable(self) -> bool:
        return self.failure is None and not self.stream.is_closing() and not self.token_invalid

    async def request(
        self,
        frame: ClientRequest,
        request_id: int,
        deadline: float,
        patient_until: float | None = None,
    ) -> Frame:
        """The node's answer; TimeoutError at `deadline`. With `patient_until` (a later
        deadline), the wait goes on past `deadline` while the node keeps sending bytes on
        this connection (answers to other requests): see `wait_patiently`."""
        if self.failure is not None:
            raise self.failure
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Frame] = loop.create_future()
        self.waiting[request_id] = future
        try:
            if self.produce_many and isinstance(frame, Produce):
                self.queue_produce(frame)
            else:
                self.write_request(frame)
            await self.stream.drain()
            if patient_until is not None and patient_until > deadline:
                return await self.wait_patiently(future, deadline, patient_until)
            async with asyncio.timeout_at(deadline):
                return await future
        finally:
            self.waiting.pop(request_id, None)

    async def wait_patiently(
        self, future: asyncio.Future[Frame], deadline: float, patient_until: float
    ) -> Frame:
        """Wait for `future` until the connection was silent for a whole attempt (the
        span from now to `deadline`) or `patient_until` passed; TimeoutError then.

        Why: a node busy with a thousand partitions may take longer than an attempt to
        answer a produce while it answers others on the same connection. Giving up on
        it there dropped the connection, which failed every other request on it, and
        each was sent again: proposals doubled on a cluster already behind (measured:
        8,399 lost attempts for 2,854 produce answers over 1,000 partitions). A node
        that went silent (stopped, cut off) is still given up on after one attempt."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        silence_seconds_max = max(deadline - started, 0.0)
        heard = max(self.last_received_seconds, started)
        if min(heard + silence_seconds_max, patient_until) <= started:
            raise TimeoutError
        # One timer, moved on while the node is heard from (asyncio.wait per request cost a
        # producer at a thousand partitions a set, a waiter and callbacks a batch). Its
        # callback is a method with arguments, not a closure: a closure holding its own
        # timer is a reference cycle a request, left to the garbage collector, which at a
        # thousand partitions found them only in its costly oldest generation.
        timer = loop.call_at(
            min(heard + silence_seconds_max, patient_until),
            self.check_patience,
            future,
            started,
            silence_seconds_max,
            patient_until,
        )
        try:
            return await future
        finally:
            timer.cancel()

    def check_patience(
        self,
        future: asyncio.Future[Frame],
        started: float,
        silence_seconds_max: float,
        patient_until: float,
    ) -> None:
        """A patient request's timer: fail `future` with TimeoutError once the connection
        was silent for `silence_seconds_max` or `patient_until` passed; else look again
        then (a timer moved on is not cancelled: it finds the future done and returns)."""
        if future.done():
            return
        loop = asyncio.get_running_loop()
        heard = max(self.last_received_seconds, started)
        until = min(heard + silence_seconds_max, patient_until)
        if loop.time() < until:
            loop.call_at(
                until, self.check_patience, future, started, silence_seconds_max, patient_until
            )
        else:
            future.set_exception(TimeoutError())

    def write_request(self, frame: ClientRequest) -> None:
        if self.token:
            frame = AuthenticatedRequest(
                request_id=frame.request_id, token=self.token, request=frame
            )
        self.stream.write(encode_frame(encode(frame)))

    def queue_produce(self, frame: Produce) -> None:
        """Write `frame` with the other produce requests of this loop turn: a producer
        spread over many partitions makes one frame per node a turn, not one per batch."""
        self.produce_parts.append(frame)
        if len(self.produce_parts) == 1:
            asyncio.get_running_loop().call_soon(self.write_produce_parts)

    def write_produce_parts(self) -> None:
        parts, self.produce_parts = self.produce_parts, []
        if not parts or not self.usable:
            return  # failed meanwhile: `fail` told every waiter
        if len(parts) == 1:
            self.write_request(parts[0])
            return
        if len(self.produce_frames) > PRODUCE_FRAMES_TRACKED_MAX:
            waiting = self.waiting
            self.produce_frames = {
                frame_id: part_ids
                for frame_id, part_ids in self.produce_frames.items()
                if any(part_id in waiting for part_id in part_ids)
            }
        self.last_produce_frame_id -= 1
        frame_id = self.last_produce_frame_id
        self.produce_frames[frame_id] = [part.request_id for part in parts]
        self.write_request(ProduceMany(request_id=frame_id, parts=parts))

    def answer_produce_frame(self, frame_id: int, frame: Frame) -> None:
        """An answer to a whole ProduceMany (a refusal): every part gets it, as its own."""
        part_ids = self.produce_frames.pop(frame_id, [])
        if not isinstance(frame, ErrorResponse):
            return  # a ProduceMany is answered per part; nothing else comes under its id
        for part_id in part_ids:
            future = self.waiting.pop(part_id, None)
            if future is not None and not future.done():
                future.set_result(msgspec.structs.replace(frame, request_id=part_id))

    async def close(self) -> None:
        if self.reader_task is not None:
            self.reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader_task
        self.stream.close()
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await self.stream.wait_closed()


class PendingCommand:
    __slots__ = ("command", "deadline", "future", "session")

    def __init__(
        self,
        command: KVCommand,
        deadline: float,
        future: asyncio.Future[KVCommandResult],
        session: ClientSession,
    ):
        self.command = command
        self.deadline = deadline
        self.future = future
        self.session = session
        """The session the command's sequence was numbered in."""


class PendingRead:
    __slots__ = ("deadline", "future", "key")

    def __init__(self, key: str, deadline: float, future: asyncio.Future[str | None]) -> None:
        self.key = key
        self.deadline = deadline
        self.future = future


def fail_waiting(futures: list[asyncio.Future[Any]], error: BaseException) -> None:
    """Hand `error` to every call still waiting; a cancelled batch means the client closed."""
    if isinstance(error, asyncio.CancelledError):
        error = ClientError("the client is closed")
    for future in futures:
        if not future.done():
            future.set_exception(error)


class AsyncKVClient(AsyncV3Operations, SessionHolder):
    """An asyncio client of the replicated KV. See the module docstring.

    Use it from one event loop. `batch_commands_max` bounds the commands in one KVWrite
    (and keys in one KVRead); `sequence_window_max` bounds how far new sequences may run
    ahead of the lowest unanswered one (calls wait for room). `group` names the group the
    requests go to: "kv", or one shard group "shard-<gid>" of the sharded KV.
    """

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 5.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        client_id: str | None = None,
        attempt_timeout_seconds: float | None = None,
        batch_commands_max: int = BATCH_COMMANDS_MAX_DEFAULT,
        sequence_window_max: int = SEQUENCE_WINDOW_MAX_DEFAULT,
        group: str = "kv",
        user: str | None = None,
        password: str | None = None,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
        internal_keys: bool = False,
    ) -> None:
        """`tls`: talk TLS to the nodes (see `TLSConfig`); None: plaintext."""
        check_timeout(timeout)
        if batch_commands_max <= 0:
            raise ValueError(f"batch_commands_max must be positive, got {batch_commands_max}")
        if sequence_window_max <= 0:
            raise ValueError(f"sequence_window_max must be positive, got {sequence_window_max}")
        self.timeout = timeout
        self.attempt_timeout_seconds = attempt_timeout_for(timeout, attempt_timeout_seconds)
        self.cluster_id = cluster_id
        self.session = ClientSession(client_id or new_client_id(), hold_seconds=timeout)
        self.batch_commands_max = batch_commands_max
        self.sequence_window_max = sequence_window_max
        self.tls = tls
        self.group = group
        """The group every KVWrite and KVRead names: "kv", or "shard-<gid>" of the sharded
        KV (the caller routes each key to the group owning its shard)."""
        self.internal_keys = internal_keys
        """Writes may reach keys starting with "__" (kv/reserved.py): for quorumlog's own
        clients of its metadata (the stream clients' topics and offsets), never user code."""
        self.selector = EndpointSelector(endpoints)
        self.credentials_source = credentials_source(user, password, credentials)
        """With auth: who this client is, asked at each new connection (`quorumlog.auth`)."""
        self.connections: dict[str, asyncio.Task[StreamConnection]] = {}
        self.next_request_id = 1
        self.pending_writes: list[PendingCommand] = []
        self.pending_reads: dict[bool, list[PendingRead]] = {False: [], True: []}
        self.flush_scheduled = False
        self.window_free = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.write_requests_sent = 0
        """KVWrite frames sent, retries included (for tests and figures)."""

    # --- KV -----------------------------------------------------------------------------

    async def put(
        self, key: str, value: str | bytes, lease: int = 0, prev_kv: bool = False
    ) -> KeyValue | None:
        """Set `key`: a plain put for text without a lease, else a v3 put (which answers
        the key before when `prev_kv`). The other v3 calls: `kv.async_v3_client`."""
        if isinstance(value, str) and not lease and not prev_kv:
            await self.write("put", key, value, None)
            return None
        return await self.put_v3(key, value, lease, prev_kv)

    async def append(self, key: str, value: str) -> None:
        await self.write("append", key, value, None)

    async def delete(self, key: str) -> None:
        await self.write("delete", key, None, None)

    async def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        """Set `key` to `new` if it holds `expected` now (None: missing / delete). True if set."""
        return (await self.write("cas", key, new, expected)).ok

    async def get(self, key: str, stale: bool = False) -> str | None:
        """The value of `key`, linearizable; `stale=True` lets any node answer from its state."""
        self.check_open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        pending = self.pending_reads[stale]
        pending.append(PendingRead(key, loop.time() + self.timeout, future))
        if len(pending) >= self.batch_commands_max:
            self.flush_reads(stale)
        else:
            self.schedule_flush()
        return await future

    async def write(
        self,
        op: str,
        key: str,
        value: str | None,
        expected: str | None,
        payload: bytes | None = None,
    ) -> KVCommandResult:
        """One write. With a `payload` (a v3 command), `value` only names the call (its
        digest) and is not sent."""
        self.check_open()
        loop = asyncio.get_running_loop()
        await self.wait_for_window()
        session = self.session
        identity = (op, key, value, expected)
        sequence = session.sequences.allocate(identity, loop.time())
        if payload is None:
            command = KVCommand(sequence, op, key, value, expected)
        else:
            command = KVCommand(sequence, op, key, payload=payload)
        future: asyncio.Future[KVCommandResult] = loop.create_future()
        self.pending_writes.append(
            PendingCommand(command, loop.time() + self.timeout, future, session)
        )
        if len(self.pending_writes) >= self.batch_commands_max:
            self.flush_writes()
        else:
            self.schedule_flush()
        try:
            result = await future
        except UnknownOutcomeError:
            session.sequences.hold_unknown(sequence, identity, loop.time())
            raise
        except BaseException:
            self.acknowledge(session, sequence)
            raise
        self.acknowledge(session, sequence)
        return check_command_result(command, result)

    async def wait_for_window(self) -> None:
        """Wait until a new sequence stays within `sequence_window_max` of the lowest
        unanswered one: answers free room, and so does the release of reserved sequences."""
        loop = asyncio.get_running_loop()
        sequences = self.sequences
        while True:
            sequences.release_expired(loop.time())
            if sequences.unacknowledged_span() < self.sequence_window_max:
                return
            # Checked and cleared with no await in between, so no wake-up is missed.
            self.window_free.clear()
            release_at = sequences.next_release_at()
            try:
                async with asyncio.timeout_at(release_at):
                    await self.window_free.wait()
            except TimeoutError:
                pass

    def acknowledge(self, session: ClientSession, sequence: int) -> None:
        session.sequences.acknowledge(sequence)
        if not self.window_free.is_set():
            self.window_free.set()

    def session_expired(self, session: ClientSession) -> None:
        """The cluster no longer has `session`: calls made from now on go under a new one
        (once per session, however many of its batches are refused)."""
        if self.session is session:
            self.session = session.renewed()
            # Calls waiting for room in the old session's window have room in the new one.
            self.window_free.set()

    # --- batching -----------------------------------------------------------------------

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_all)

    def flush_all(self) -> None:
        self.flush_scheduled = False
        self.flush_writes()
        self.flush_reads(False)
        self.flush_reads(True)

    def flush_writes(self) -> None:
        """Cut the queued writes into KVWrites bounded by command count and by bytes (a
        frame over the node's frame_bytes_max would be refused whole), each of one session."""
        pending = self.pending_writes
        while pending:
            size = 0
            count = 0
            session = pending[0].session
            for command in pending[: self.batch_commands_max]:
                command_bytes = command_size_bound(command.command)
                if count and size + command_bytes > BATCH_BYTES_MAX:
                    break
                if command.session is not session:
                    break
                size += command_bytes
                count += 1
            batch = pending[:count]
            del pending[:count]
            self.spawn(self.send_writes(batch))

    def flush_reads(self, stale: bool) -> None:
        pending = self.pending_reads[stale]
        while pending:
            batch = pending[: self.batch_commands_max]
            del pending[: self.batch_commands_max]
            self.spawn(self.send_reads(batch, stale))

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def send_writes(self, batch: list[PendingCommand]) -> None:
        commands = [pending.command for pending in batch]
        session = batch[0].session

        def make_request(request_id: int) -> KVWrite:
            self.write_requests_sent += 1
            return KVWrite(
                request_id=request_id,
                client_id=session.client_id,
                commands=commands,
                first_unacknowledged=session.first_unacknowledged(),
                group=self.group,
                internal=self.internal_keys,
            )

        try:
            response = await self.call(
                f"write of {len(commands)} commands",
                make_request,
                KVWriteResult,
                side_effects=True,
                timeout_seconds=min(p.deadline for p in batch) - asyncio.get_running_loop().time(),
            )
            results = write_results(response, len(commands), self.selector.choose())
            session.answered = True
        except BaseException as error:
            if isinstance(error, SessionExpiredError):
                self.session_expired(session)
            fail_waiting([pending.future for pending in batch], error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    async def send_reads(self, batch: list[PendingRead], stale: bool) -> None:
        keys = [pending.key for pending in batch]
        try:
            response = await self.call(
                f"read of {len(keys)} keys",
                lambda request_id: KVRead(
                    request_id=request_id, keys=keys, stale=stale, group=self.group
                ),
                KVReadResult,
                side_effects=False,
                at_leader=not stale,
                timeout_seconds=min(p.deadline for p in batch) - asyncio.get_running_loop().time(),
            )
            if len(response.values) != len(keys):
                raise ClientError(f"asked for {len(keys)} keys, got {len(response.values)} values")
        except BaseException as error:
            fail_waiting([pending.future for pending in batch], error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        for pending, value in zip(batch, response.values, strict=True):
            if not pending.future.done():
                pending.future.set_result(value)

    # --- cluster ------------------------------------------------------------------------

    async def status(self, endpoint: str | None = None) -> StatusResponse:
        """One node's view of the group: `endpoint`'s, or the cached leader's."""
        return await self.call(
            "status",
            lambda request_id: StatusRequest(request_id=request_id),
            StatusResponse,
            side_effects=False,
            at_leader=False,
            endpoint=endpoint,
        )

    async def member_list(self) -> list[Member]:
        status = await self.status()
        if not status.is_leader and status.leader is not None:
            leader_address = status.addresses.get(status.leader)
            if leader_address is not None:
                status = await self.status(leader_address)
        return members_from_status(status)

    async def member_add(self, node_id: str, address: str, learner: bool = False) -> str:
        kind = "add_learner" if learner else "add_voter"
        return await self.change_members(kind, node_id, address)

    async def member_promote(self, node_id: str) -> str:
        return await self.change_members("promote_learner", node_id, None)

    async def member_remove(self, node_id: str) -> str:
        return await self.change_members("remove", node_id, None)

    async def change_members(self, kind: str, node_id: str, address: str | None) -> str:
        done = await self.call(
            f"{kind} {node_id}",
            lambda request_id: MemberChangeRequest(
                request_id=request_id, kind=kind, node_id=node_id, address=address
            ),
            Done,
            side_effects=True,
            retry_after_delivery=False,
        )
        return done.detail

    async def transfer_leader(self, node_id: str) -> str:
        done = await self.call(
            f"transfer leadership to {node_id}",
            lambda request_id: TransferLeaderRequest(request_id=request_id, target=node_id),
            Done,
            side_effects=True,
            retry_after_delivery=False,
        )
        return done.detail

    # --- the request loop ---------------------------------------------------------------

    async def call(
        self,
        what: str,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        retry_after_delivery: bool = True,
        at_leader: bool = True,
        endpoint: str | None = None,
        timeout_seconds: float | None = None,
    ) -> ResponseType:
        """Send until a wanted answer arrives, following the rules of `RequestAttempts`."""
        self.check_open()
        attempts = RequestAttempts(
            what,
            self.selector,
            asyncio.get_running_loop().time,
            self.timeout if timeout_seconds is None else timeout_seconds,
            self.attempt_timeout_seconds,
            side_effects=side_effects,
            retry_after_delivery=retry_after_delivery,
            fixed_endpoint=endpoint,
        )
        while (attempt := attempts.next()) is not None:
            if attempt.delay_seconds:
                await asyncio.sleep(attempt.delay_seconds)  # back-off between attempts
            response = await self.attempt(
                attempts, attempt.endpoint, attempt.deadline, make_request
            )
            if response is None:
                continue
            answer = attempts.answered(attempt.endpoint, response, expected)
            if answer is not None:
                if at_leader and endpoint is None:
                    self.selector.succeeded_at_leader(attempt.endpoint)
                return answer
        raise attempts.give_up_error()

    async def attempt(
        self,
        attempts: RequestAttempts,
        endpoint: str,
        deadline: float,
        make_request: Callable[[int], ClientRequest],
        patient_until: float | None = None,
    ) -> Frame | None:
        """One try at one node: the frame answered, or None after reporting the failure.
        `patient_until`: see `StreamConnection.request`."""
        try:
            connection = await self.connect(endpoint, deadline)
        except ATTEMPT_ERRORS as error:
            attempts.connect_failed(endpoint, error)
            return None
        request_id = self.next_request_id
        self.next_request_id += 1
        attempts.sent()
        try:
            return await connection.request(
                make_request(request_id), request_id, deadline, patient_until
            )
        except ATTEMPT_ERRORS as error:
            # Also on a timeout: the peer may be gone without a word; start afresh.
            await self.drop_connection(endpoint, connection)
            attempts.lost(endpoint, error)
            return None

    async def connect(self, endpoint: str, deadline: float) -> StreamConnection:
        """The open connection to `endpoint`; concurrent callers share one dial."""
        connection = self.open_connection(endpoint)
        if connection is not None:
            return connection  # the common case, without a shield a request
        task = self.connections.get(endpoint)
        if task is not None and task.done():
            error = None if task.cancelled() else task.exception()
            if error is not None or not task.result().usable:
                del self.connections[endpoint]
                if error is None:
                    # Unusable but open (its token is gone): close it, as a failure would.
                    task.result().fail(ConnectionLost(f"replaced the connection to {endpoint}"))
                task = None
        if task is None:
            timeout_seconds = max(deadline - asyncio.get_running_loop().time(), 0.001)
            task = asyncio.ensure_future(
                StreamConnection.open(
                    endpoint,
                    self.cluster_id,
                    self.client_id,
                    timeout_seconds,
                    None if self.credentials_source is None else self.credentials_source(),
                    self.tls,
                )
            )
            self.connections[endpoint] = task
        return await asyncio.shield(task)

    def open_connection(self, endpoint: str) -> StreamConnection | None:
        """The connection to `endpoint` if one is open and usable now (no dial, no await)."""
        task = self.connections.get(endpoint)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        connection = task.result()
        return connection if connection.usable else None

    async def drop_connection(self, endpoint: str, connection: StreamConnection) -> None:
        task = self.connections.get(endpoint)
        if (
            task is not None
            and task.done()
            and not task.cancelled()
            and task.exception() is None
            and task.result() is connection
        ):
            del self.connections[endpoint]
        connection.fail(ConnectionLost(f"gave up on the connection to {endpoint}"))
        await connection.close()

    # --- lifetime -----------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise ClientError("the client is closed")

    async def close(self) -> None:
        """Fail what is still waiting, and close every connection."""
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        connections, self.connections = self.connections, {}
        for opening in connections.values():
            if not opening.done():
                opening.cancel()
            with contextlib.suppress(BaseException):
                connection = await opening
                await connection.close()
        closed = ClientError("the client is closed")
        fail_waiting([pending.future for pending in self.pending_writes], closed)
        for reads in self.pending_reads.values():
            fail_waiting([read.future for read in reads], closed)

    async def __aenter__(self) -> AsyncKVClient:
        return self

    async def __aexit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = ["AsyncKVClient"]

"""Clients of the simulated KV store, recording every operation in a History.

Each client runs the shipped client logic: a `ClientSession` numbers its writes
(`kv.requests.SessionCommand`), `RequestAttempts` decides whom to ask, when to back off and
when to give up, and `EndpointSelector` follows NOT_LEADER hints, all driven on virtual
time by `kv.attempt_loop.AttemptLoop`. Requests and answers are wire frames on the
`SimFrameNetwork`, with the seed's delays, drops and duplicates; the nemesis partitions
nodes from nodes, not clients from nodes, but a crashed or paused node answers nothing.

A client has one operation in flight. The outcome goes into the history as the client
learns it: an answer (ok), UnknownOutcomeError (unknown: a write that may yet take
effect), UnavailableError or SessionExpiredError (failed: certainly not applied). Any
other refusal is a defect of the system under test and stops the run.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

from quorumlog.codec import kv_v3
from quorumlog.codec.wire import (
    ClientRequest,
    Frame,
    KVCommandResult,
    KVRangeRequest,
    KVRangeResult,
    KVReadResult,
    KVWriteResult,
)
from quorumlog.errors import (
    ClientError,
    SessionExpiredError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.attempt_loop import AttemptLoop
from quorumlog.kv.connection import (
    ClientSession,
    CommandIdentity,
    EndpointSelector,
    RequestAttempts,
    SessionHolder,
)
from quorumlog.kv.requests import SessionCommand, read_request, read_value
from quorumlog.kv.v3_client import compare_from, operation_from
from quorumlog.testing.history import History, Operation
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.process import SimTimer, milliseconds

ResponseType = TypeVar("ResponseType")


class WorkloadOptions(msgspec.Struct, frozen=True):
    client_count: int = 3
    key_count: int = 3
    think_ms_min: int = 0
    think_ms_max: int = 150
    request_timeout_ms: int = 800
    """One attempt waits this long for its answer (`attempt_timeout_seconds`), then the
    client tries the next node."""
    operation_timeout_ms: int = 6000
    """Without an answer this long, the client gives up (the client's `timeout`): a write's
    outcome is then unknown."""
    read_fraction: float = 0.3
    append_fraction: float = 0.35
    cas_fraction: float = 0.05
    """The rest are puts."""
    reconnect_fraction: float = 0.0
    """Chance that a client starts an operation afresh, as a new client that was given the
    nodes in a seeded order: it asks a random node first (and follows hints from there).
    Without it every client soon sticks to the leader, and no client sees a new leader
    while an old one still answers."""
    v3: bool = False
    """Run the v3 KV's operations instead: multi-key txns and ranges (`testing.txn_model`),
    ranges at `read_fraction`."""


class QueueTimers:
    """`kv.attempt_loop.Timers` on the event queue itself: a client never crashes or
    pauses, so it needs no `SimProcess`."""

    __slots__ = ("events",)

    def __init__(self, events: EventQueue) -> None:
        self.events = events

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> SimTimer:
        timer = SimTimer(callback)
        self.events.schedule(milliseconds(delay_seconds), timer.fire)
        return timer

    def monotonic_seconds(self) -> float:
        return self.events.now_ms / 1000


class FrameClientTransport:
    """`kv.attempt_loop.FrameTransport` over the frame network, from one client: it maps a
    node's client address back to the node id the network knows it by."""

    __slots__ = ("frames", "name", "node_ids")

    def __init__(self, name: str, frames: SimFrameNetwork, node_ids: dict[str, str]) -> None:
        self.name = name
        self.frames = frames
        self.node_ids = node_ids

    def send(
        self, endpoint: str, request: ClientRequest, on_answer: Callable[[Frame], None]
    ) -> None:
        node_id = self.node_ids.get(endpoint)
        if node_id is None:
            raise ConnectionRefusedError(f"nothing listens at {endpoint}")
        self.frames.call(self.name, node_id, request, on_answer)


def txn_payload(argument: Any) -> bytes:
    """The v3 command of a history "txn" operation."""
    compares, success, failure = argument
    return kv_v3.encode_command(
        kv_v3.Txn(
            [compare_from(compare) for compare in compares],
            [operation_from(operation) for operation in success],
            [operation_from(operation) for operation in failure],
        )
    )


def write_identity(kind: str, key: str, argument: Any) -> CommandIdentity:
    """The KV client call (op, key, value, expected) of a history operation."""
    if kind == "txn":
        return (kv_v3.V3_OP, key, hashlib.sha256(txn_payload(argument)).hexdigest(), None)
    if kind == "cas":
        expected, new = argument
        return ("cas", key, new, expected)
    if kind == "delete":
        return ("delete", key, None, None)
    return (kind, key, argument, None)


class _Operation:
    __slots__ = ("argument", "call_ms", "command", "key", "kind", "loop", "operation_id")

    def __init__(
        self,
        operation_id: int,
        kind: str,
        key: str,
        argument: Any,
        call_ms: int,
        command: SessionCommand | None,
    ) -> None:
        self.operation_id = operation_id
        self.kind = kind
        self.key = key
        self.argument = argument
        self.call_ms = call_ms
        self.command = command
        """The write's place in the session; None for a read."""
        self.loop: AttemptLoop[Any] | None = None


OnFinish = Callable[[str, Any], None]
"""Called with ("ok", output), ("unknown", None) or ("failed", None) when an operation ends."""


class SimClient(SessionHolder):
    def __init__(
        self,
        name: str,
        *,
        events: EventQueue,
        frames: SimFrameNetwork,
        endpoints: dict[str, str],
        history: History,
        options: WorkloadOptions,
        rng: random.Random,
        stats: WorkloadStats,
    ) -> None:
        """`endpoints`: each node's client address → its node id."""
        self.name = name
        self.events = events
        self.history = history
        self.options = options
        self.rng = rng
        self.stats = stats
        self.endpoints = sorted(endpoints)
        self.timers = QueueTimers(events)
        self.transport = FrameClientTransport(name, frames, endpoints)
        frames.register(name, None)
        self.timeout_seconds = options.operation_timeout_ms / 1000
        self.attempt_timeout_seconds = options.request_timeout_ms / 1000
        self.sessions_started = 0
        self.session = ClientSession(
            self.new_session_id(), self.timeout_seconds, self.new_session_id
        )
        self.selector = self.new_selector()
        self.request_ids = 0
        self.operations_begun = 0
        self.operation: _Operation | None = None
        self.on_finish: OnFinish | None = None
        self.last_seen: dict[str, str | None] = {}

    def new_session_id(self) -> str:
        """Session ids numbered per client, so a seed replays the same ids."""
        self.sessions_started += 1
        return f"{self.name}.s{self.sessions_started}"

    def new_selector(self) -> EndpointSelector:
        """The nodes in a seeded rotation: a new client given them in that order."""
        start = self.rng.randrange(len(self.endpoints))
        return EndpointSelector(self.endpoints[start:] + self.endpoints[:start])

    def next_request_id(self) -> int:
        self.request_ids += 1
        return self.request_ids

    @property
    def busy(self) -> bool:
        return self.operation is not None

    # --- one operation ------------------------------------------------------------------

    def begin(self, kind: str, key: str, argument: Any, on_finish: OnFinish | None) -> None:
        """Invoke one operation: "put"/"append" (argument: str), "get", "delete", or "cas"
        (argument: (expected, new))."""
        now_ms = self.events.now_ms
        operation_id = self.history.invoke(self.name, kind, key, argument, now_ms)
        self.operations_begun += 1
        reconnect = self.options.reconnect_fraction
        if reconnect and self.rng.random() < reconnect:
            self.selector = self.new_selector()
        is_read = kind in ("get", "range")
        command = (
            None
            if is_read
            else SessionCommand(
                self.session,
                write_identity(kind, key, argument),
                now_ms / 1000,
                txn_payload(argument) if kind == "txn" else None,
            )
        )
        if command is not None:
            self.stats.write_identities[operation_id] = (
                command.session.client_id,
                command.command.sequence,
            )
        operation = _Operation(operation_id, kind, key, argument, now_ms, command)
        attempts = RequestAttempts(
            f"{kind} {key!r}",
            self.selector,
            self.timers.monotonic_seconds,
            self.timeout_seconds,
            self.attempt_timeout_seconds,
            side_effects=not is_read,
        )
        loop: AttemptLoop[Any]
        if kind == "range":
            start, end = argument
            loop = self.attempt_loop(
                attempts,
                KVRangeResult,
                lambda request_id: KVRangeRequest(request_id=request_id, key=start, end=end),
            )
        elif command is None:
            loop = self.attempt_loop(
                attempts, KVReadResult, lambda request_id: read_request(key, request_id)
            )
        else:
            loop = self.attempt_loop(attempts, KVWriteResult, command.request)
        operation.loop = loop
        self.operation = operation
        self.on_finish = on_finish
        loop.start()

    def attempt_loop(
        self,
        attempts: RequestAttempts,
        expected: type[ResponseType],
        make_request: Callable[[int], ClientRequest],
    ) -> AttemptLoop[ResponseType]:
        return AttemptLoop(
            attempts,
            expected,
            make_request,
            timers=self.timers,
            transport=self.transport,
            next_request_id=self.next_request_id,
            on_answer=self.answered,
            on_error=self.failed,
        )

    def abandon(self) -> None:
        """Give up the operation in flight, if any: its outcome is unknown."""
        operation = self.operation
        if operation is None:
            return
        if operation.loop is not None:
            operation.loop.cancel()
        self.failed(UnknownOutcomeError(f"{operation.kind} {operation.key!r} abandoned"))

    def answered(self, response: Any, endpoint: str) -> None:
        operation = self.operation
        if operation is None:
            return
        command = operation.command
        output: Any = None
        try:
            if operation.kind == "range":
                output = range_output(response)
                self.last_seen = dict(output)
            elif command is None:
                output = read_value(response)
                self.last_seen[operation.key] = output
            else:
                result = command.answered(response, endpoint)
                output = result.ok if operation.kind == "cas" else None
                if operation.kind == "txn":
                    output = txn_output(result)
                    if output[0]:  # the first put of the success branch took effect
                        _, key, value = operation.argument[1][0]
                        self.last_seen[key] = value
        except ClientError as error:  # a refusal in the answer (sequence acknowledged)
            self.ended_unanswered(operation, error)
            return
        now_ms = self.events.now_ms
        self.history.complete(operation.operation_id, output, now_ms)
        self.stats.record_ok(operation.kind, operation.call_ms, now_ms)
        self.end("ok", output)

    def failed(self, error: BaseException) -> None:
        operation = self.operation
        if operation is None:
            return
        if operation.command is not None:
            operation.command.failed(error, self.events.now_ms / 1000)
        self.ended_unanswered(operation, error)

    def ended_unanswered(self, operation: _Operation, error: BaseException) -> None:
        if isinstance(error, UnknownOutcomeError):
            self.history.unknown(operation.operation_id)
            self.stats.unknown += 1
            self.end("unknown", None)
            return
        if isinstance(error, SessionExpiredError):
            self.renew_session(operation.command.session if operation.command else self.session)
            self.stats.sessions_expired += 1
        elif not isinstance(error, UnavailableError):
            raise InvariantViolation(
                f"client {self.name}: {operation.kind} {operation.key!r} was refused: {error!r}"
            ) from error
        self.history.fail(operation.operation_id, self.events.now_ms)
        self.stats.failed += 1
        self.end("failed", None)

    def end(self, status: str, output: Any) -> None:
        operation = self.operation
        if operation is not None and operation.loop is not None:
            self.stats.requests += operation.loop.attempts_sent
            self.stats.timeouts += operation.loop.attempts_lost
        on_finish = self.on_finish
        self.operation = None
        self.on_finish = None
        if on_finish is not None:
            on_finish(status, output)


class WorkloadStats:
    def __init__(self) -> None:
        self.requests = 0
        """Attempts sent."""
        self.timeouts = 0
        """Attempts that got no answer in time."""
        self.unknown = 0
        self.failed = 0
        self.sessions_expired = 0
        self.ok = 0
        self.write_completions: list[tuple[int, int]] = []
        """(return ms, call ms) of acknowledged writes, in return order."""
        self.write_identities: dict[int, tuple[str, int]] = {}
        """Operation id of each write → the (client id, sequence) it was sent as."""

    def record_ok(self, kind: str, call_ms: int, return_ms: int) -> None:
        self.ok += 1
        if kind != "get":
            self.write_completions.append((return_ms, call_ms))

    def first_write_invoked_after(self, time_ms: int) -> int | None:
        """The earliest return time of a write called at or after `time_ms`."""
        best: int | None = None
        start = bisect.bisect_left(self.write_completions, (time_ms, -1))
        for return_ms, call_ms in self.write_completions[start:]:
            if call_ms >= time_ms:
                best = return_ms
                break
        return best


class Workload:
    """Clients that keep issuing random operations on a few keys until `stop()`."""

    def __init__(
        self,
        *,
        events: EventQueue,
        frames: SimFrameNetwork,
        endpoints: dict[str, str],
        options: WorkloadOptions,
        rng: random.Random,
        history: History | None = None,
    ) -> None:
        self.events = events
        self.options = options
        self.rng = rng
        self.history = history if history is not None else History()
        self.stats = WorkloadStats()
        self.keys = [f"k{number}" for number in range(options.key_count)]
        self.running = False
        self.stopped = False
        self.idle_token = 0
        self.idling = False
        self.next_pending: set[str] = set()
        """Clients with a `_next` scheduled: after an idle spell, each keeps one chain."""
        self.clients = [
            SimClient(
                f"c{number}",
                events=events,
                frames=frames,
                endpoints=endpoints,
                history=self.history,
                options=options,
                rng=random.Random(rng.getrandbits(64)),
                stats=self.stats,
            )
            for number in range(1, options.client_count + 1)
        ]

    def start(self) -> None:
        self.running = True
        self.stopped = False
        for client in self.clients:
            self._schedule_next(client)

    def stop(self) -> None:
        self.running = False
        self.stopped = True
        self.idling = False

    def idle(self, duration_ms: int) -> None:
        """Stop issuing operations for `duration_ms` (those in flight finish), then go on:
        a long quiet spell in which idle Raft groups go quiet."""
        if not self.running:
            return
        self.running = False
        self.idling = True
        self.idle_token += 1
        self.events.schedule(duration_ms, self._end_idle, self.idle_token)

    def _end_idle(self, token: int) -> None:
        if token == self.idle_token:
            self.end_idle()

    def end_idle(self) -> None:
        """Go on now, if idle (an idle spell's timer then changes nothing)."""
        self.idle_token += 1
        if self.idling and not self.stopped:
            self.idling = False
            self.start()

    def _think_ms(self) -> int:
        return draw_int(self.rng, self.options.think_ms_min, self.options.think_ms_max)

    def _schedule_next(self, client: SimClient) -> None:
        if client.name in self.next_pending:
            return
        self.next_pending.add(client.name)
        self.events.schedule(self._think_ms(), self._next, client)

    def _next(self, client: SimClient) -> None:
        self.next_pending.discard(client.name)
        if not self.running or client.busy:
            return
        kind, key, argument = self._choose(client)

        def on_finish(status: str, output: Any) -> None:
            self._schedule_next(client)

        client.begin(kind, key, argument, on_finish)

    def _choose(self, client: SimClient) -> tuple[str, str, Any]:
        if self.options.v3:
            return self._choose_v3(client)
        options = self.options
        rng = self.rng
        key = self.keys[rng.randrange(len(self.keys))]
        draw = rng.random()
        # Values are unique per client operation, so a wrong read points at one write, and
        # an append applied twice shows as its value twice (`appends_applied_twice`).
        value = f"{client.name}.{client.operations_begun + 1}"
        if draw < options.read_fraction:
            return "get", key, None
        draw -= options.read_fraction
        if draw < options.append_fraction:
            return "append", key, value + ";"
        draw -= options.append_fraction
        if draw < options.cas_fraction:
            return "cas", key, (client.last_seen.get(key), value)
        return "put", key, value

    def _choose_v3(self, client: SimClient) -> tuple[str, str, Any]:
        """A range over the keys, or a txn over one or two of them: a compare (the value
        this client last saw, or "missing"), then puts, a delete and gets."""
        rng = self.rng
        keys = self.keys
        if rng.random() < self.options.read_fraction:
            return "range", MULTI_KEY, (keys[0], keys[-1] + "\x00")
        first = keys[rng.randrange(len(keys))]
        second = keys[rng.randrange(len(keys))]
        value = f"{client.name}.{client.operations_begun + 1}"
        seen = client.last_seen.get(first)
        compare = ("create", first, "==", 0) if seen is None else ("value", first, "==", seen)
        success: tuple[tuple[Any, ...], ...] = (("put", first, value), ("get", second))
        if second != first and rng.random() < 0.3:
            success = (("put", first, value), ("delete", second), ("get", second))
        elif second != first:
            success = (("put", first, value), ("put", second, value + "b"), ("get", first))
        failure = (("get", first),)
        return "txn", MULTI_KEY, ((compare,), success, failure)


MULTI_KEY = "*"
"""The history key of v3 operations: each may touch every key (one partition)."""


def range_output(response: KVRangeResult) -> tuple[tuple[str, str], ...]:
    if response.failure is not None:
        raise ClientError(f"range refused: {response.failure.message}")
    return tuple((kv.key, kv.value.decode()) for kv in response.kvs)


def txn_output(result: KVCommandResult) -> tuple[bool, tuple[str | None, ...]]:
    """(succeeded, the values the gets read) of an answered txn."""
    if result.payload is None:
        raise ClientError("txn answered without a v3 result")
    response = kv_v3.decode_response(result.payload)
    if not isinstance(response, kv_v3.TxnResponse):
        raise ClientError(f"txn refused: {response!r}")
    gets = tuple(
        (item.kvs[0].value.decode() if item.kvs else None)
        for item in response.responses
        if item.kind == "get"
    )
    return response.succeeded, gets


def appends_applied_twice(operations: list[Operation], data: Mapping[str, str]) -> list[str]:
    """The values of append operations that occur more than once in their key's value in
    `data`. Each append carries a value unique to its call ("c2.7;": only its own call's
    value starts at that "c" and ends at that ";"), so one found twice was applied twice:
    a retry the sessions did not deduplicate."""
    twice: list[str] = []
    for operation in operations:
        if operation.kind == "append":
            value = data.get(operation.key)
            if value is not None and value.count(operation.argument) > 1:
                twice.append(f"{operation.key}: {operation.argument!r}")
    return twice

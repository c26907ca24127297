"""The shipped sharded KV client's rules, driven by simulated events, recording a History.

`shard.client.ShardedKVClient` blocks on sockets, but what it decides is sans-I/O and is
used here unchanged: `ShardRouter` (the cached configuration and, per group, whom to ask),
`RoutedCall` (one deadline across routings, the pause between them, the final error),
`route`, `attempt_answer` (WRONG_GROUP, the leader cache) and the request builders; under
them the KV clients' `RequestAttempts`, `EndpointSelector` and `ClientSession` (sequence
numbers, `first_unacknowledged`, a sequence held after an unknown outcome). This module only
replaces the blocking loops by callbacks on virtual time: `SimAttempts.call` is
`BlockingTransport.call`, `RoutedOperation` is `ShardedKVClient.routed`, `ControllerDriver`
is `ControllerChannel`, `SimShardedClient.write` is `KVOperations.session_write` and
`SimAdmin.change` is `ShardAdmin.change`. The shipped functions are called through their
module (`shipped.route`, ...), so a test that breaks one in `shard.client` breaks it here.

An operation ends as the blocking call would return or raise: "ok" with its output,
"unknown" (`UnknownOutcomeError`: a write may or may not have happened) or "unavailable"
(`UnavailableError` or `SessionExpiredError`: it certainly did not). A refusal of a
well-formed request (`RequestRejectedError`, a malformed answer) is a finding and raises
`InvariantViolation`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from quorumlog.codec.wire import (
    ClientRequest,
    ControllerResponse,
    Frame,
    KVCommand,
    KVReadResult,
    KVWriteResult,
    shard_group_name,
)
from quorumlog.errors import (
    ClientError,
    SessionExpiredError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.connection import (
    ClientSession,
    CommandIdentity,
    EndpointSelector,
    RequestAttempts,
    SequenceTracker,
    check_command_result,
    describe,
    write_results,
)
from quorumlog.shard import client as shipped
from quorumlog.shard.client import (
    QUERY_LATEST,
    RoutedCall,
    ShardRouter,
    WrongGroupAnswer,
)
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.controller_commands import ControllerCommand, ControllerResult, Query
from quorumlog.testing.history import History
from quorumlog.testing.sim.checks import InvariantViolation, SimulationError
from quorumlog.testing.sim.shardkv.transport import FrameCalls

ResponseType = TypeVar("ResponseType")
Done = Callable[[Any], None]
Failed = Callable[[BaseException], None]
OnFinish = Callable[[str, object], None]
"""Called once with ("ok", output), ("unknown", None) or ("unavailable", None)."""


class ClientOptions(msgspec.Struct, frozen=True):
    attempt_timeout_ms: int = 1_000
    """One attempt at one node (`ShardedKVClient`'s default: a second at most)."""
    operation_timeout_ms: int = 8_000
    """The client's `timeout`: one deadline for all routings of one call."""


class SimAttempts:
    """`BlockingTransport.call` on events: attempts by `RequestAttempts`' rules."""

    def __init__(self, calls: FrameCalls) -> None:
        self.calls = calls
        self.scheduler = calls.scheduler

    def call(
        self,
        attempts: RequestAttempts,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        *,
        done: Callable[[ResponseType | None], None],
        failed: Failed,
        at_leader: bool = True,
        end_round: Callable[[RequestAttempts], bool] = shipped.never,
    ) -> None:
        """`done(answer)`, or `done(None)` when `attempts` gives up or `end_round` says to
        stop; `failed(error)` on WRONG_GROUP (`WrongGroupAnswer`) or a refusal."""
        scheduler = self.scheduler

        def next_attempt() -> None:
            attempt = attempts.next()
            if attempt is None:
                done(None)
                return

            def send() -> None:
                attempts.sent()
                timeout = max(attempt.deadline - scheduler.monotonic_seconds(), 0.001)
                self.calls.attempt(
                    attempt.endpoint,
                    make_request,
                    timeout,
                    lambda frame: outcome(attempt.endpoint, frame),
                )

            if attempt.delay_seconds:
                scheduler.call_later(attempt.delay_seconds, send)  # back-off between attempts
            else:
                send()

        def outcome(endpoint: str, frame: Frame | None) -> None:
            if frame is None:
                attempts.lost(endpoint, TimeoutError("no answer before the deadline"))
            else:
                try:
                    answer = shipped.attempt_answer(attempts, endpoint, frame, expected, at_leader)
                except ClientError as error:
                    failed(error)
                    return
                if answer is not None:
                    done(answer)
                    return
            if end_round(attempts):
                done(None)
                return
            next_attempt()

        next_attempt()


class ControllerDriver:
    """`ControllerChannel` on events: requests to the controller through its cached leader."""

    def __init__(
        self,
        endpoints: list[str],
        driver: SimAttempts,
        client_id: str,
        attempt_timeout_seconds: float,
    ) -> None:
        self.selector = EndpointSelector(endpoints)
        self.driver = driver
        self.client_id = client_id
        self.attempt_timeout_seconds = attempt_timeout_seconds

    def send(
        self,
        what: str,
        command: ControllerCommand,
        *,
        side_effects: bool,
        timeout_seconds: float,
        done: Callable[[ControllerResult], None],
        failed: Failed,
        first_unacknowledged: int = 0,
    ) -> None:
        attempts = RequestAttempts(
            what,
            self.selector,
            self.driver.scheduler.monotonic_seconds,
            timeout_seconds,
            self.attempt_timeout_seconds,
            side_effects=side_effects,
        )

        def answered(response: ControllerResponse | None) -> None:
            if response is None:
                failed(attempts.give_up_error())
                return
            try:
                result = shipped.controller_result(response.results, what)
            except ClientError as error:
                failed(error)
                return
            done(result)

        self.driver.call(
            attempts,
            shipped.controller_request(self.client_id, command, first_unacknowledged),
            ControllerResponse,
            done=answered,
            failed=failed,
        )

    def query(
        self,
        number: int,
        timeout_seconds: float,
        done: Callable[[ShardConfiguration], None],
        failed: Failed,
    ) -> None:
        """Configuration `number` (-1: the latest). Queries are not logged: no sequence."""

        def answered(result: ControllerResult) -> None:
            try:
                configuration = shipped.queried_configuration(result, number)
            except ClientError as error:
                failed(error)
                return
            done(configuration)

        self.send(
            f"query configuration {number}",
            Query(0, number),
            side_effects=False,
            timeout_seconds=timeout_seconds,
            done=answered,
            failed=failed,
        )


class RoutedOperation:
    """`ShardedKVClient.routed` on events: send to the group owning `key`, routing again
    after WRONG_GROUP or an unreachable group, until the answer or the deadline."""

    def __init__(
        self,
        client: SimShardedClient,
        what: str,
        key: str,
        make_request: Callable[[int, str], ClientRequest],
        expected: type[Any],
        *,
        side_effects: bool,
        done: Done,
        failed: Failed,
        at_leader: bool = True,
    ) -> None:
        self.client = client
        self.key = key
        self.make_request = make_request
        self.expected = expected
        self.at_leader = at_leader
        self.done = done
        self.failed = failed
        scheduler = client.driver.scheduler
        self.scheduler = scheduler
        self.call = RoutedCall(
            what, scheduler.monotonic_seconds, client.timeout_seconds, side_effects
        )

    def start(self) -> None:
        if self.client.router.configuration is None:
            self.refresh(lambda _: self.route())
        else:
            self.route()

    def route(self) -> None:
        call = self.call
        if call.remaining_seconds() <= 0:
            self.failed(call.give_up_error())
            return
        gid = shipped.route(self.client.router, self.key, call)
        if gid is None:
            self.pause_and_refresh()
            return
        attempts = RequestAttempts(
            call.what,
            self.client.router.selector(gid),
            call.clock,
            call.remaining_seconds(),
            self.client.attempt_timeout_seconds,
            side_effects=call.side_effects,
        )
        group = shard_group_name(gid)

        def round_done(answer: Any) -> None:
            call.round_ended(attempts)
            if answer is not None:
                self.done(answer)
            else:
                self.pause_and_refresh()

        def round_failed(error: BaseException) -> None:
            if not isinstance(error, WrongGroupAnswer):
                self.failed(error)
                return
            call.round_ended(attempts)
            call.failed(str(error))
            self.pause_and_refresh()

        self.client.driver.call(
            attempts,
            lambda request_id: self.make_request(request_id, group),
            self.expected,
            done=round_done,
            failed=round_failed,
            at_leader=self.at_leader,
            end_round=shipped.group_unreachable,
        )

    def pause_and_refresh(self) -> None:
        def refreshed(changed: bool) -> None:
            pause = self.call.pause_seconds(changed)
            if pause > 0:
                # Back-off while the shard is on its way to its owner.
                self.scheduler.call_later(pause, self.route)
            else:
                self.route()

        self.refresh(refreshed)

    def refresh(self, then: Callable[[bool], None]) -> None:
        """Fetch the latest configuration within the call's time; `then(changed)`."""
        call = self.call
        remaining = call.remaining_seconds()
        if remaining <= 0:
            then(False)
            return
        router = self.client.router

        def learned(configuration: ShardConfiguration) -> None:
            if shipped.names_node_ids(configuration):
                # The simulated nodes host no "kv" group to answer where node ids listen.
                raise SimulationError("simulated configurations must name servers by address")
            then(router.learn(configuration))

        def not_learned(error: BaseException) -> None:
            if isinstance(error, UnavailableError | UnknownOutcomeError):
                call.failed(f"controller: {describe(error)}")
                then(False)
            else:
                self.failed(error)

        self.client.controller.query(QUERY_LATEST, remaining, learned, not_learned)


class SimShardedClient:
    """One sequential sharded KV client (one operation at a time), as ShardedKVClient."""

    def __init__(
        self,
        client_id: str,
        *,
        calls: FrameCalls,
        controller_endpoints: list[str],
        history: History,
        options: ClientOptions,
    ) -> None:
        self.client_id = client_id
        self.driver = SimAttempts(calls)
        self.history = history
        self.options = options
        self.timeout_seconds = options.operation_timeout_ms / 1000
        self.attempt_timeout_seconds = options.attempt_timeout_ms / 1000
        self.router = ShardRouter()
        self.controller = ControllerDriver(
            controller_endpoints, self.driver, client_id, self.attempt_timeout_seconds
        )
        self.session = ClientSession(client_id, hold_seconds=self.timeout_seconds)
        self.busy = False
        self.unavailable_count = 0

    def now_ms(self) -> int:
        return round(self.driver.scheduler.monotonic_seconds() * 1000)

    def begin(
        self,
        kind: str,
        key: str,
        argument: str | None,
        on_finish: OnFinish,
        operation_timeout_ms: int | None = None,
    ) -> None:
        """Start "get", "put" or "append" (the calls are ShardedKVClient's), inside this
        client's process; `on_finish` is called once, from inside it too."""
        self.driver.calls.process.enter(
            "local",
            lambda _: self.begin_now(kind, key, argument, on_finish, operation_timeout_ms),
        )

    def begin_now(
        self,
        kind: str,
        key: str,
        argument: str | None,
        on_finish: OnFinish,
        operation_timeout_ms: int | None,
    ) -> None:
        if self.busy:
            raise SimulationError(f"client {self.client_id} already has an operation in flight")
        self.busy = True
        self.timeout_seconds = (operation_timeout_ms or self.options.operation_timeout_ms) / 1000
        operation_id = self.history.invoke(self.client_id, kind, key, argument, self.now_ms())

        def done(output: object) -> None:
            self.busy = False
            self.history.complete(operation_id, output, self.now_ms())
            on_finish("ok", output)

        def failed(error: BaseException) -> None:
            self.busy = False
            if isinstance(error, UnknownOutcomeError):
                self.history.unknown(operation_id)
                on_finish("unknown", None)
            elif isinstance(error, UnavailableError | SessionExpiredError):
                self.unavailable_count += 1
                self.history.fail(operation_id, self.now_ms())
                on_finish("unavailable", None)
            else:
                raise InvariantViolation(
                    f"{self.client_id}: {kind} {key!r} was refused: {describe(error)}"
                ) from error

        if kind == "get":
            RoutedOperation(
                self,
                f"get {key!r}",
                key,
                shipped.read_request(key, stale=False),
                KVReadResult,
                side_effects=False,
                done=lambda response: self.answered_read(response, done, failed),
                failed=failed,
            ).start()
        else:
            self.write((kind, key, argument, None), done, failed)

    def answered_read(self, response: KVReadResult, done: Done, failed: Failed) -> None:
        try:
            value = shipped.read_value(response)
        except ClientError as error:
            failed(error)
            return
        done(value)

    def write(self, identity: CommandIdentity, done: Done, failed: Failed) -> None:
        """Number the command in the current session, send it, and read its one result; a
        sequence whose outcome is unknown stays held for a repeat of the same call."""
        session = self.session
        sequences = session.sequences
        scheduler = self.driver.scheduler
        sequence = sequences.allocate(identity, scheduler.monotonic_seconds())
        command = KVCommand(sequence, *identity)
        op, key = identity[0], identity[1]

        def answered(response: KVWriteResult) -> None:
            sequences.acknowledge(sequence)
            try:
                [result] = write_results(response, 1, shipped.shard_group_name_of(self.router, key))
                session.answered = True
                check_command_result(command, result)
            except ClientError as error:
                self.renew_if_expired(session, error)
                failed(error)
                return
            done(None)

        def not_answered(error: BaseException) -> None:
            if isinstance(error, UnknownOutcomeError):
                sequences.hold_unknown(sequence, identity, scheduler.monotonic_seconds())
            else:
                sequences.acknowledge(sequence)
            self.renew_if_expired(session, error)
            failed(error)

        RoutedOperation(
            self,
            f"{op} {key!r}",
            key,
            shipped.write_request(session, command),
            KVWriteResult,
            side_effects=True,
            done=answered,
            failed=not_answered,
        ).start()

    def renew_if_expired(self, session: ClientSession, error: BaseException) -> None:
        """After SessionExpiredError later writes go under a new session."""
        if isinstance(error, SessionExpiredError) and self.session is session:
            self.session = session.renewed()


class SimAdmin:
    """`ShardAdmin`'s join, leave and move on events: one change at a time through the
    controller's log, with this admin's sequences (a change whose outcome was unknown and
    is repeated reuses its sequence, so it happens once)."""

    def __init__(
        self,
        client_id: str,
        *,
        calls: FrameCalls,
        controller_endpoints: list[str],
        options: ClientOptions,
        timeout_seconds: float,
    ) -> None:
        self.client_id = client_id
        self.driver = SimAttempts(calls)
        self.controller = ControllerDriver(
            controller_endpoints, self.driver, client_id, options.attempt_timeout_ms / 1000
        )
        self.timeout_seconds = timeout_seconds
        """The admin's `timeout`: each change's deadline, and how long a change whose
        outcome was unknown keeps its sequence for a repeat."""
        self.sequences = SequenceTracker(hold_seconds=timeout_seconds)

    def change(
        self,
        identity: CommandIdentity,
        make_command: Callable[[int], ControllerCommand],
        done: Callable[[int], None],
        failed: Failed,
    ) -> None:
        """Send one change; `done(configuration number)` or `failed(error)`."""
        timeout_seconds = self.timeout_seconds
        sequences = self.sequences
        scheduler = self.driver.scheduler
        sequence = sequences.allocate(identity, scheduler.monotonic_seconds())
        command = make_command(sequence)

        def answered(result: ControllerResult) -> None:
            sequences.acknowledge(sequence)
            if result.configuration_number is not None:
                done(result.configuration_number)
                return
            # A duplicate whose result the controller already forgot: it did happen.
            self.controller.query(
                QUERY_LATEST,
                timeout_seconds,
                lambda configuration: done(configuration.number),
                failed,
            )

        def not_answered(error: BaseException) -> None:
            if isinstance(error, UnknownOutcomeError):
                sequences.hold_unknown(sequence, identity, scheduler.monotonic_seconds())
            else:
                sequences.acknowledge(sequence)
            failed(error)

        self.controller.send(
            f"{identity[0]} {identity[1]}",
            command,
            side_effects=True,
            timeout_seconds=timeout_seconds,
            done=answered,
            failed=not_answered,
            first_unacknowledged=sequences.first_unacknowledged(),
        )


__all__ = [
    "ClientOptions",
    "ControllerDriver",
    "RoutedOperation",
    "SimAdmin",
    "SimAttempts",
    "SimShardedClient",
]
